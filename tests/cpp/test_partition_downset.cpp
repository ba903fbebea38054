// The down-set DP on its own (partition/downset/downset.h): for every depth bound it finds the least
// slowest stage over all acyclic partitions, checked against exhaustive enumeration on small
// graphs, series-parallel and not; its plans are valid and fit; it declines graphs beyond its
// budget instead of running long.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>

#include "cost/presets.h"
#include "partition/downset/downset.h"
#include "partition/evaluate.h"
#include "partition/problem.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// least[d]: the least slowest stage over the acyclic partitions into at most k stages that fit,
// of depth at most d (d = 1..k).
std::vector<double> exhaustive_by_depth(const pt::Problem& p, int k) {
  std::vector<double> least(k + 1, kInf);
  tst::for_each_valid_partition(p, k, [&](const pt::Evaluation& ev) {
    for (int d = ev.depth; d <= k; ++d) least[d] = std::min(least[d], ev.bottleneck);
  });
  return least;
}

pt::Problem problem_for(const graph::OpGraph& g, const cost::CostModel& model, int k, double limit) {
  pt::Problem p = pt::make_problem(model, 8, 2, k, limit, {});
  // Without optimizer steps the DP's objective is the slowest stage alone (see downset.h).
  std::fill(p.optimizer.begin(), p.optimizer.end(), 0.0);
  return p;
}

}  // namespace

TEST(PartitionDownset, LeastSlowestStageForEveryDepthBound) {
  int cases = 0, bounds = 0;
  for (unsigned seed = 0; seed < 48; ++seed) {
    const bool sp = seed % 2 == 0;
    const int n = 5 + static_cast<int>(seed % 6);  // 5..10 operators
    const int k = 2 + static_cast<int>(seed % 3);  // 2..4 stages
    auto g = sp ? tst::random_sp_graph(7000 + seed, n) : tst::random_dag(7000 + seed, n);
    cost::Devices d = cost::v100(k);
    cost::CostModel model(g, d);
    pt::Problem p = problem_for(g, model, k, 16e9);
    const std::vector<double> least = exhaustive_by_depth(p, k);
    const auto plans = pt::downset_plans(p);
    ASSERT_FALSE(plans.empty()) << "seed " << seed << ": a graph of " << n << " operators is within the budget";
    ++cases;
    std::vector<double> found(k + 1, kInf);
    for (const auto& plan : plans) {
      pt::Evaluation ev = pt::evaluate(p, plan);
      ASSERT_TRUE(ev.acyclic) << "seed " << seed;
      EXPECT_TRUE(ev.fits()) << "seed " << seed;
      EXPECT_LE(ev.num_stages, k) << "seed " << seed;
      for (int depth = ev.depth; depth <= k; ++depth) found[depth] = std::min(found[depth], ev.bottleneck);
    }
    for (int depth = 1; depth <= k; ++depth) {
      if (least[depth] == kInf) {
        EXPECT_EQ(found[depth], kInf) << "seed " << seed << " depth " << depth;
        continue;
      }
      ++bounds;
      EXPECT_NEAR(found[depth] / least[depth], 1.0, 1e-9)
          << "seed " << seed << (sp ? " (sp)" : " (dag)") << " n=" << n << " k=" << k << " depth <= " << depth;
    }
  }
  EXPECT_EQ(cases, 48);
  EXPECT_GT(bounds, 100);
}

TEST(PartitionDownset, TightMemoryPlansFitAndNeverBeatExhaustive) {
  int with_plans = 0;
  for (unsigned seed = 0; seed < 30; ++seed) {
    const bool sp = seed % 2 == 0;
    auto g = sp ? tst::random_sp_graph(7500 + seed, 8) : tst::random_dag(7500 + seed, 8);
    const int k = 3;
    cost::Devices d = cost::v100(k);
    cost::CostModel model(g, d);
    // Around a third of the weights' total state per device: most layouts overflow.
    const double limit = std::max(1e6, 4.0 * static_cast<double>(g.total_param_bytes()) / k * 1.2);
    pt::Problem p = problem_for(g, model, k, limit);
    const std::vector<double> least = exhaustive_by_depth(p, k);
    for (const auto& plan : pt::downset_plans(p)) {
      pt::Evaluation ev = pt::evaluate(p, plan);
      ASSERT_TRUE(ev.acyclic);
      EXPECT_TRUE(ev.fits()) << "seed " << seed << ": over by " << ev.max_overflow << " bytes";
      EXPECT_GE(ev.bottleneck, least[ev.depth] * (1.0 - 1e-9)) << "seed " << seed;
      ++with_plans;
    }
  }
  EXPECT_GT(with_plans, 10);
}

TEST(PartitionDownset, DeclinesGraphsBeyondItsBudget) {
  cost::Devices d = cost::v100(4);
  // A chain has n + 1 down-sets: 40 operators are well within the budget; 65 are beyond the
  // 64-operator limit.
  for (int n : {40, 65}) {
    auto chain = tst::random_chain(3, n);
    cost::CostModel model(chain, d);
    EXPECT_EQ(pt::downset_plans(pt::make_problem(model, 8, 2, 4, 16e9, {})).empty(), n > 64) << n << " operators";
  }
  // Eleven independent branches of one operator between a source and a sink: 2^11 + 2 down-sets.
  {
    std::mt19937 rng(5);
    graph::OpGraph fan;
    fan.add_node(tst::random_node(rng, 0));
    for (int i = 1; i <= 11; ++i) {
      fan.add_node(tst::random_node(rng, i));
      fan.add_edge(0, i, 1e4);
    }
    fan.add_node(tst::random_node(rng, 12));
    for (int i = 1; i <= 11; ++i) fan.add_edge(i, 12, 1e4);
    fan.trace_batch_size = 8;
    cost::CostModel model(fan, d);
    const pt::Problem p = pt::make_problem(model, 8, 2, 4, 16e9, {});
    EXPECT_TRUE(pt::downset_plans(p).empty());
    EXPECT_FALSE(pt::downset_plans(p, 4096).empty()) << "a larger budget admits it";
  }
}
