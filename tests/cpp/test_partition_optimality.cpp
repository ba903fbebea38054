// Optimality against exhaustive search on small graphs (<= 12 operators, <= 4 stages): every
// partition of the operators into at most K labelled sets is enumerated (restricted growth
// strings along a topological order), and those with an acyclic stage graph that fit in memory
// are evaluated with the same evaluator the partitioners use. The micro-batch size is fixed, so
// that all compare the same quantities: the slowest stage (the time per sample of the paper and
// of the binary search, x the micro-batch size) and the predicted step, (M + depth - 1) x slowest
// stage, which partition() minimises over its candidates.
//
// Asserted, each against the exhaustive optimum of the same figure:
//   - on every graph, the best of graphpipe, metis and sequential is within 5% in slowest stage;
//   - on every series-parallel graph of 6-9 operators, graphpipe's predicted step is within its
//     binary-search tolerance (1e-4) of the least step (like with like: graphpipe trades a
//     slightly slower stage for a shallower stage graph when the step says so, so its slowest
//     stage alone may be above the least one);
//   - on the 12-operator graphs, the best partitioner within 5% in slowest stage and graphpipe
//     within 5% in step. Not within tolerance: seed 2's optimal first stage holds the input, the
//     head of one branch and part of a parallel node nested in the other, which neither the DP's
//     family nor the cuts of the partitioner's three orders contain (2.2% above).
// Reported, not asserted: the best partitioner against the least step (the DAG fallback, METIS
// and the sequential cut minimise the slowest stage, not depth), and the DP's own first plan
// against the least slowest stage.
//
// History: graphpipe used to miss its tolerance in slowest stage on two series-parallel graphs
// here (seeds 10 and 46, n = 8, k = 3: +0.7% and +2.9%). Not an objective mismatch: on both, the
// exhaustive least slowest stage and least step are the same partition, and the DP's family
// (stages = unions of consecutive series children, whole subtrees or runs of parallel branches)
// did not hold it. Seed 46, S(n0, P(S(n1, n4), S(n2, n3, n5, n6)), n7): {n0, n1, n4},
// {n2, n3, n5}, {n6, n7}, a stage with the input and a whole branch and one with a branch's tail
// and the output. Seed 10, S(n0, P(n1, S(n2, n4), S(n3, n5, n6)), n7) at a tight memory limit:
// {n0, n3}, {n2, n5, n6}, {n1, n4, n7}, whose middle stage holds the head of one branch and the
// tail of another. The DP now has fork and join stages (graphpipe_dp.h) and the partitioner also
// cuts the tree's branch-by-branch orders (partitioner.cpp). Against the least step, graphpipe
// missed its tolerance on 6 of these 30 graphs before (up to +16.6%: depth ignored), none after.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "common/error.h"
#include "cost/presets.h"
#include "graph/series_parallel.h"
#include "partition/evaluate.h"
#include "partition/graphpipe_dp.h"
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
constexpr double kTolerance = 1e-4;

struct Reference {
  double step = kInf;        // least predicted step
  double bottleneck = kInf;  // least slowest stage
};

Reference exhaustive(const pt::Problem& p, int k) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<int> labels(n, 0);  // by topological position
  std::vector<int> assignment(n, 0);
  Reference best;
  auto visit = [&](auto& self, int i, int used) -> void {
    if (i == n) {
      for (int j = 0; j < n; ++j) assignment[p.order[j]] = labels[j];
      pt::Evaluation ev = pt::evaluate(p, assignment);
      if (ev.acyclic && ev.fits()) {
        best.step = std::min(best.step, ev.iteration_seconds(p));
        best.bottleneck = std::min(best.bottleneck, ev.bottleneck);
      }
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

struct Figures {
  double step = kInf, bottleneck = kInf;
};

struct Result {
  Reference reference;
  Figures graphpipe, metis, sequential;
  double dp_bottleneck = kInf;  // the DP's own first plan
  double best_bottleneck() const { return std::min({graphpipe.bottleneck, metis.bottleneck, sequential.bottleneck}); }
  double best_step() const { return std::min({graphpipe.step, metis.step, sequential.step}); }
};

constexpr std::int64_t kBatch = 8, kMicroBatch = 2;

Result compare(const graph::OpGraph& g, int k, double memory_limit) {
  cost::Devices d = cost::v100(k);
  cost::CostModel model(g, d);
  pt::Problem p = pt::make_problem(model, kBatch, kMicroBatch, k, memory_limit, {});
  Result r;
  r.reference = exhaustive(p, k);
  for (const char* name : {"graphpipe", "metis", "sequential"}) {
    pt::Options o;
    o.partitioner = name;
    o.batch_size = kBatch;
    o.micro_batch_size = kMicroBatch;
    o.memory_limit = memory_limit;
    o.tolerance = kTolerance;
    Figures figures;
    try {
      pt::Plan plan = pt::partition(g, d, o);
      figures = {plan.predicted_iteration_seconds, plan.bottleneck_seconds_per_sample * kMicroBatch};
    } catch (const gp::PlanningError&) {
    }
    (std::string(name) == "graphpipe" ? r.graphpipe : std::string(name) == "metis" ? r.metis : r.sequential) = figures;
  }
  auto sp = graph::decompose_series_parallel(g);
  if (sp.is_series_parallel) {
    if (auto dp = pt::graphpipe_assignment(p, sp.tree, kTolerance)) {
      pt::Evaluation ev = pt::evaluate(p, *dp);
      EXPECT_TRUE(ev.acyclic && ev.fits()) << "the DP's plan must be valid and fit";
      r.dp_bottleneck = ev.bottleneck;
    }
  }
  return r;
}

bool within_tolerance(double value, double reference) { return value <= reference * (1.0 + kTolerance) + 1e-15; }

}  // namespace

TEST(PartitionOptimality, BestPartitionerWithinFivePercentOfExhaustive) {
  int cases = 0, within = 0, within_step = 0, sp_cases = 0, graphpipe_within = 0, dp_within = 0;
  double worst = 1.0, worst_step = 1.0, worst_graphpipe = 1.0, worst_dp = 1.0;
  for (unsigned seed = 0; seed < 60; ++seed) {
    const bool sp = seed % 2 == 0;
    const int n = 6 + static_cast<int>(seed % 4);  // 6..9 operators
    auto g = sp ? tst::random_sp_graph(1000 + seed, n) : tst::random_dag(1000 + seed, n);
    const int k = 2 + static_cast<int>(seed % 3);  // 2..4 stages
    double limit = seed % 5 == 0 ? 3.0 * g.total_param_bytes() : 16e9;
    Result r = compare(g, k, limit);
    if (r.reference.step == kInf) {
      EXPECT_EQ(r.best_bottleneck(), kInf);
      continue;
    }
    ++cases;
    const double ratio = r.best_bottleneck() / r.reference.bottleneck;
    worst = std::max(worst, ratio);
    EXPECT_GE(ratio, 1.0 - 1e-9) << "seed " << seed << ": better than exhaustive?";
    EXPECT_GE(r.best_step() / r.reference.step, 1.0 - 1e-9) << "seed " << seed << ": better than exhaustive?";
    EXPECT_LE(ratio, 1.05) << "seed " << seed << " n=" << n << " k=" << k << ", slowest stage: graphpipe "
                           << r.graphpipe.bottleneck << " metis " << r.metis.bottleneck << " sequential "
                           << r.sequential.bottleneck << " exhaustive " << r.reference.bottleneck;
    within += ratio <= 1.05;
    worst_step = std::max(worst_step, r.best_step() / r.reference.step);
    within_step += r.best_step() <= 1.05 * r.reference.step;
    if (!sp) continue;
    ++sp_cases;
    const double graphpipe_ratio = r.graphpipe.step / r.reference.step;
    worst_graphpipe = std::max(worst_graphpipe, graphpipe_ratio);
    EXPECT_TRUE(within_tolerance(r.graphpipe.step, r.reference.step))
        << "graphpipe's step above its tolerance of the least step: seed " << seed << ", n=" << n << ", k=" << k
        << ", ratio " << graphpipe_ratio;
    graphpipe_within += within_tolerance(r.graphpipe.step, r.reference.step);
    worst_dp = std::max(worst_dp, r.dp_bottleneck / r.reference.bottleneck);
    dp_within += within_tolerance(r.dp_bottleneck, r.reference.bottleneck);
  }
  std::printf("slowest stage: best partitioner within 5%% on %d/%d graphs (worst ratio %.4f)\n", within, cases, worst);
  std::printf("step: graphpipe within its tolerance on %d/%d series-parallel graphs (worst %.4f); best partitioner "
              "within 5%% on %d/%d graphs (worst %.4f)\n",
              graphpipe_within, sp_cases, worst_graphpipe, within_step, cases, worst_step);
  std::printf("slowest stage: the DP's own first plan within its tolerance on %d/%d series-parallel graphs "
              "(worst %.4f)\n",
              dp_within, sp_cases, worst_dp);
  EXPECT_GT(cases, 40);
  EXPECT_GE(sp_cases, 25);
}

TEST(PartitionOptimality, TwelveOperatorsThreeStages) {
  for (unsigned seed = 0; seed < 4; ++seed) {
    const bool sp = seed % 2 == 0;
    auto g = sp ? tst::random_sp_graph(2000 + seed, 12) : tst::random_dag(2000 + seed, 12);
    Result r = compare(g, 3, 16e9);
    ASSERT_LT(r.reference.step, kInf);
    EXPECT_LE(r.best_bottleneck() / r.reference.bottleneck, 1.05) << "seed " << seed;
    if (sp) {
      EXPECT_LE(r.graphpipe.step / r.reference.step, 1.05) << "seed " << seed;
      std::printf("12 operators, seed %u: graphpipe's step / least step %.4f\n", seed,
                  r.graphpipe.step / r.reference.step);
    }
  }
}
