// Optimality against exhaustive search on small graphs (<= 12 operators, <= 4 stages): every
// partition of the operators into at most K labelled sets is enumerated (restricted growth
// strings along a topological order), those with an acyclic stage graph that fit in memory are
// evaluated with the same evaluator the partitioners use, and the least slowest-stage time is
// the reference. The micro-batch size is fixed so that all compare the same quantity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "common/error.h"
#include "cost/presets.h"
#include "graph/series_parallel.h"
#include "partition/evaluate.h"
#include "partition/partitioner.h"
#include "partition/problem.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double exhaustive(const pt::Problem& p, int k) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<int> labels(n, 0);  // by topological position
  std::vector<int> assignment(n, 0);
  double best = kInf;
  auto visit = [&](auto& self, int i, int used) -> void {
    if (i == n) {
      for (int j = 0; j < n; ++j) assignment[p.order[j]] = labels[j];
      pt::Evaluation ev = pt::evaluate(p, assignment);
      if (ev.acyclic && ev.fits()) best = std::min(best, ev.bottleneck);
      return;
    }
    for (int l = 0; l <= std::min(used, k - 1); ++l) {
      labels[i] = l;
      self(self, i + 1, std::max(used, l + 1));
    }
  };
  visit(visit, 0, 0);
  return best;
}

struct Result {
  double reference = kInf;
  double graphpipe = kInf, metis = kInf, sequential = kInf;
  double best() const { return std::min({graphpipe, metis, sequential}); }
};

Result compare(const graph::OpGraph& g, int k, double memory_limit) {
  cost::Devices d = cost::v100(k);
  cost::CostModel model(g, d);
  pt::Problem p = pt::make_problem(model, 8, 2, k, memory_limit, {});
  Result r;
  r.reference = exhaustive(p, k);
  for (const char* name : {"graphpipe", "metis", "sequential"}) {
    pt::Options o;
    o.partitioner = name;
    o.batch_size = 8;
    o.micro_batch_size = 2;
    o.memory_limit = memory_limit;
    o.tolerance = 1e-4;
    double value = kInf;
    try {
      value = pt::partition(g, d, o).bottleneck_seconds_per_sample * 2;
    } catch (const gp::PlanningError&) {
    }
    (std::string(name) == "graphpipe" ? r.graphpipe : std::string(name) == "metis" ? r.metis : r.sequential) = value;
  }
  return r;
}

}  // namespace

TEST(PartitionOptimality, BestPartitionerWithinFivePercentOfExhaustive) {
  int cases = 0, within = 0, graphpipe_within_tolerance = 0, sp_cases = 0;
  double worst = 1.0;
  for (unsigned seed = 0; seed < 60; ++seed) {
    const bool sp = seed % 2 == 0;
    const int n = 6 + static_cast<int>(seed % 4);  // 6..9 operators
    auto g = sp ? tst::random_sp_graph(1000 + seed, n) : tst::random_dag(1000 + seed, n);
    const int k = 2 + static_cast<int>(seed % 3);  // 2..4 stages
    double limit = seed % 5 == 0 ? 3.0 * g.total_param_bytes() : 16e9;
    Result r = compare(g, k, limit);
    if (r.reference == kInf) {
      EXPECT_EQ(r.best(), kInf);
      continue;
    }
    ++cases;
    double ratio = r.best() / r.reference;
    worst = std::max(worst, ratio);
    EXPECT_GE(ratio, 1.0 - 1e-9) << "seed " << seed << ": better than exhaustive?";
    EXPECT_LE(ratio, 1.05) << "seed " << seed << " n=" << n << " k=" << k << " graphpipe " << r.graphpipe
                           << " metis " << r.metis << " sequential " << r.sequential << " exhaustive " << r.reference;
    if (ratio <= 1.05) ++within;
    if (sp) {
      ++sp_cases;
      if (r.graphpipe <= r.reference * (1 + 1e-4) + 1e-12) {
        ++graphpipe_within_tolerance;
      } else {
        std::printf("graphpipe above tolerance: seed %u, n=%d, k=%d, ratio %.4f\n", seed, n, k,
                    r.graphpipe / r.reference);
      }
      // The DP's family (stages = unions of consecutive series children, whole subtrees or runs
      // of parallel branches) does not hold every convex partition, so exhaustive search over
      // all of them can beat it; refinement closes most of the gap.
      EXPECT_LE(r.graphpipe / r.reference, 1.05) << "graphpipe, seed " << seed;
    }
  }
  std::printf("best partitioner within 5%% of exhaustive on %d/%d graphs (worst ratio %.4f); graphpipe alone "
              "within its tolerance on %d/%d series-parallel graphs\n",
              within, cases, worst, graphpipe_within_tolerance, sp_cases);
  EXPECT_GT(cases, 40);
}

TEST(PartitionOptimality, TwelveOperatorsThreeStages) {
  for (unsigned seed = 0; seed < 4; ++seed) {
    auto g = seed % 2 ? tst::random_dag(2000 + seed, 12) : tst::random_sp_graph(2000 + seed, 12);
    Result r = compare(g, 3, 16e9);
    ASSERT_LT(r.reference, kInf);
    EXPECT_LE(r.best() / r.reference, 1.05) << "seed " << seed;
  }
}
