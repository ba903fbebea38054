// Optimality against exhaustive search on small graphs (<= 12 operators, <= 4 stages): every
// partition of the operators into at most K labelled sets is enumerated (restricted growth
// strings along a topological order), and those with an acyclic stage graph that fit in memory
// are evaluated with the same evaluator the partitioners use. The micro-batch size is fixed, so
// that all compare the same quantities: the slowest stage (the time per sample of the paper and
// of the binary search, x the micro-batch size) and the predicted step, (M + depth - 1) x slowest
// stage + optimizer tail, which partition() minimises over its candidates.
//
// The figure the partitioners are judged by is the predicted step (its time per sample is the
// step over the mini-batch): it is what partition() minimises, and the slowest stage alone is
// not, because a shallower stage graph can pay for a slightly slower stage. Asserted, against
// the exhaustive least step:
//   - on every graph, series-parallel or not, graphpipe's predicted step is within its
//     binary-search tolerance (1e-4): 6-9 operators on 2-4 stages, and 12 operators on 3 and 4
//     stages;
//   - hence the best of graphpipe, metis and sequential is within 5% (asserted as well, with
//     every partitioner's figure in the message).
// Reported, not asserted: the best partitioner's slowest stage against the least slowest stage
// (graphpipe may trade it for depth; METIS and the sequential cut aim at it but are heuristics,
// up to +5.7% here), and the series-parallel DP's own first plan against the least slowest
// stage. That the slowest stage is exact for every depth bound where the down-set DP runs is
// asserted in test_partition_downset.cpp.
//
// History: the series-parallel DP (graphpipe_dp.h) alone holds only its family of layouts, and
// the cuts of three topological orders do not hold every interleaving of branches. With those
// alone graphpipe missed its tolerance on 12-operator series-parallel graphs on 6 of 30 at 3
// stages (up to +3.8%) and more at 4 stages (up to +11%: optimal plans of depth 3 on 4 stages,
// whose stages each hold pieces of two branches). The exact down-set DP (downset.h) closed that
// for graphs of up to 64 operators and 1024 down-sets; it is tested on its own in
// test_partition_downset.cpp.
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
#include "partition/series_parallel_dp/graphpipe_dp.h"
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
  Reference best;
  tst::for_each_valid_partition(p, k, [&](const pt::Evaluation& ev) {
    best.step = std::min(best.step, ev.iteration_seconds(p));
    best.bottleneck = std::min(best.bottleneck, ev.bottleneck);
  });
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
      graphpipe::plan::Plan plan = pt::partition(g, d, o);
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
    within += ratio <= 1.05;
    EXPECT_LE(r.best_step() / r.reference.step, 1.05)
        << "seed " << seed << " n=" << n << " k=" << k << ", step: graphpipe " << r.graphpipe.step << " metis "
        << r.metis.step << " sequential " << r.sequential.step << " exhaustive " << r.reference.step;
    worst_step = std::max(worst_step, r.best_step() / r.reference.step);
    within_step += r.best_step() <= 1.05 * r.reference.step;
    const double graphpipe_ratio = r.graphpipe.step / r.reference.step;
    worst_graphpipe = std::max(worst_graphpipe, graphpipe_ratio);
    EXPECT_TRUE(within_tolerance(r.graphpipe.step, r.reference.step))
        << "graphpipe's step above its tolerance of the least step: seed " << seed << (sp ? " (sp)" : " (dag)")
        << ", n=" << n << ", k=" << k << ", ratio " << graphpipe_ratio;
    graphpipe_within += within_tolerance(r.graphpipe.step, r.reference.step);
    if (!sp) continue;
    ++sp_cases;
    worst_dp = std::max(worst_dp, r.dp_bottleneck / r.reference.bottleneck);
    dp_within += within_tolerance(r.dp_bottleneck, r.reference.bottleneck);
  }
  std::printf("slowest stage: best partitioner within 5%% on %d/%d graphs (worst ratio %.4f)\n", within, cases, worst);
  std::printf(
      "step: graphpipe within its tolerance on %d/%d graphs (worst %.6f); best partitioner "
      "within 5%% on %d/%d graphs (worst %.4f)\n",
      graphpipe_within, cases, worst_graphpipe, within_step, cases, worst_step);
  std::printf(
      "slowest stage: the DP's own first plan within its tolerance on %d/%d series-parallel graphs "
      "(worst %.4f)\n",
      dp_within, sp_cases, worst_dp);
  EXPECT_GT(cases, 40);
  EXPECT_GE(sp_cases, 25);
}

TEST(PartitionOptimality, TwelveOperatorsThreeAndFourStages) {
  int cases = 0;
  double worst = 1.0;
  for (unsigned seed = 0; seed < 12; ++seed) {
    const bool sp = seed % 3 != 2;  // two series-parallel graphs for each other DAG
    const int k = 3 + static_cast<int>(seed % 2);
    auto g = sp ? tst::random_sp_graph(2000 + seed, 12) : tst::random_dag(2000 + seed, 12);
    Result r = compare(g, k, 16e9);
    ASSERT_LT(r.reference.step, kInf);
    ++cases;
    EXPECT_TRUE(within_tolerance(r.graphpipe.step, r.reference.step))
        << "seed " << seed << (sp ? " (sp)" : " (dag)") << ", k=" << k << ": graphpipe's step / least step "
        << r.graphpipe.step / r.reference.step;
    worst = std::max(worst, r.graphpipe.step / r.reference.step);
  }
  std::printf("12 operators, 3 and 4 stages: graphpipe's step / least step at worst %.6f over %d graphs\n", worst,
              cases);
}
