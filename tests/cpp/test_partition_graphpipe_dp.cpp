// The graphpipe DP on its own (partition/series_parallel_dp/graphpipe_dp.h): every plan it returns is a valid
// partition that fits, the shallower plans are strictly shallower, and fork and join stages let
// a multi-branch model use every device instead of one each for its input and its head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/presets.h"
#include "graph/series_parallel.h"
#include "partition/evaluate.h"
#include "partition/group_stats.h"
#include "partition/problem.h"
#include "partition/replica_allocation.h"
#include "partition/replicas.h"
#include "partition/sequential/sequential.h"
#include "partition/series_parallel_dp/graphpipe_dp.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

TEST(PartitionGraphpipeDp, PlansAreValidFitAndGetShallower) {
  int plans = 0, shallower = 0;
  for (int seed = 0; seed < 120; ++seed) {
    const auto g = tst::random_sp_graph(9000 + seed, 6 + seed % 50);
    const int k = 2 + seed % 9;
    const double limit = seed % 3 == 0 ? 2.0 * g.total_param_bytes() : 16e9;
    cost::Devices d = cost::v100(k);
    cost::CostModel model(g, d);
    auto sp = graph::decompose_series_parallel(g);
    ASSERT_TRUE(sp.is_series_parallel);
    for (std::int64_t mb : {1, 4}) {
      pt::Problem p = pt::make_problem(model, 16, mb, k, limit, {});
      int depth = 1 << 30;
      for (const auto& assignment : pt::graphpipe_assignments(p, sp.tree, 1e-3)) {
        ++plans;
        pt::Evaluation ev = pt::evaluate(p, assignment);  // throws on a missing or unused label
        EXPECT_TRUE(ev.acyclic) << "seed " << seed;
        EXPECT_TRUE(ev.fits()) << "seed " << seed << ": the DP's memory accounting disagrees with evaluate()";
        EXPECT_LE(ev.num_stages, k) << "seed " << seed;
        EXPECT_LT(ev.depth, depth) << "seed " << seed << ": a later plan must be shallower";
        shallower += depth != (1 << 30);
        depth = ev.depth;
      }
    }
  }
  EXPECT_GT(plans, 200);
  EXPECT_GT(shallower, 0);
}

// Input -> 4 branches of 8 equal layers -> concatenation -> head, onto 8 devices: the paper's
// family must give the input and the head a stage each (or merge them with all branches), so
// only 6 devices remain for 4 branches and the slowest stage holds a whole branch. With fork
// and join stages the input shares a stage with the first half of one branch and the head with
// the second half of another: 8 stages of half a branch each.
TEST(PartitionGraphpipeDp, ForkAndJoinStagesUseEveryDevice) {
  graph::OpGraph g;
  auto node = [&](const std::string& name, double gflops) {
    graph::Node n;
    n.name = name;
    n.op = "call_module";
    n.target = "Linear";
    n.module = name;
    n.forward_flops = gflops * 1e9;
    n.param_bytes = gflops > 0.1 ? 4 << 20 : 0;
    n.output_bytes = 4096;
    return g.add_node(n);
  };
  const auto input = node("input", 0.01);
  std::vector<graph::NodeId> ends;
  for (int b = 0; b < 4; ++b) {
    graph::NodeId prev = input;
    for (int l = 0; l < 8; ++l) {
      auto v = node("b" + std::to_string(b) + "_" + std::to_string(l), 4.0);
      g.add_edge(prev, v, 4096);
      prev = v;
    }
    ends.push_back(prev);
  }
  const auto cat = node("cat", 0.01);
  for (auto e : ends) g.add_edge(e, cat, 4096);
  g.add_edge(cat, node("head", 0.05), 4096);
  g.trace_batch_size = 8;

  cost::Devices d = cost::v100(8);
  cost::CostModel model(g, d);
  pt::Problem p = pt::make_problem(model, 8, 1, 8, d.memory_bytes, {});
  auto sp = graph::decompose_series_parallel(g);
  auto plan = pt::graphpipe_assignment(p, sp.tree, 1e-4);
  ASSERT_TRUE(plan);
  pt::Evaluation ev = pt::evaluate(p, *plan);
  EXPECT_EQ(ev.num_stages, 8);
  EXPECT_EQ(ev.depth, 4);  // fork stage, half branch, (half branch), join stage
  double branch = 0.0;
  for (int l = 0; l < 8; ++l) branch += p.compute[*g.find("b0_" + std::to_string(l))];
  EXPECT_LT(ev.bottleneck, 0.6 * branch) << "the slowest stage should hold about half a branch";
  for (const char* small : {"input", "head"}) {
    const int stage = ev.stage_of[*g.find(small)];
    int members = static_cast<int>(std::count(ev.stage_of.begin(), ev.stage_of.end(), stage));
    EXPECT_GT(members, 2) << small << " should share its stage with branch layers";
  }
}

// Replicated stages: the tree DP caches, per group of operators, which replica levels meet the
// target, and its rows of groups outlive a probe (they serve smaller targets later). A mask kept
// from an earlier, larger target would let a later probe accept stages that are too slow. On a
// chain the tree DP's family holds every contiguous cut with every replica count, like the
// replicated sequential DP's (which caches nothing per target), so with memory lifted the tree
// DP's first plan must be as balanced as the sequential DP's within the bisection tolerance.
TEST(PartitionGraphpipeDp, ReplicatedTreeDpIsAsBalancedAsTheChainDpOnChains) {
  for (int seed = 0; seed < 24; ++seed) {
    const auto g = tst::random_chain(7100 + seed, 8 + seed % 17);
    const int devices = 4 + seed % 13;
    cost::Devices d = cost::v100(devices, 4);
    cost::CostModel model(g, d);
    auto sp = graph::decompose_series_parallel(g);
    ASSERT_TRUE(sp.is_series_parallel);
    for (std::int64_t mb : {4, 16}) {
      pt::Problem p = pt::make_problem(model, 16, mb, std::min<int>(devices, g.num_nodes()), 1e15, {});
      p.replicas = std::make_shared<const pt::ReplicaTable>(model, mb, devices);
      p.device_budget = devices;
      // The slowest stage as the DPs time it (replica_allocation.h).
      auto slowest = [&](const std::vector<int>& assignment, const std::vector<int>& replicas) {
        std::vector<int> stamps(p.num_nodes(), -1);
        double worst = 0.0;
        for (int s = 0; s < static_cast<int>(replicas.size()); ++s) {
          pt::GroupStats group(p, stamps, s);
          std::vector<double> level_compute(p.replicas->num_levels(), 0.0);
          for (std::size_t v = 0; v < assignment.size(); ++v) {
            if (assignment[v] != s) continue;
            group.add(static_cast<graph::NodeId>(v));
            for (int l = 0; l < p.replicas->num_levels(); ++l)
              level_compute[l] += p.replicas->compute(l, static_cast<int>(v));
          }
          const int level = p.replicas->level_of(replicas[s]);
          worst = std::max(worst, pt::replica_stage_time(p, level, level_compute[level], group.transfer,
                                                         group.cross_bytes, group.params));
        }
        return worst;
      };
      const auto tree = pt::graphpipe_plans(p, sp.tree, 1e-3);
      ASSERT_FALSE(tree.empty()) << "seed " << seed;
      const auto [chain, chain_replicas] = pt::sequential_replicated(p, 1e-3);
      ASSERT_FALSE(chain.empty()) << "seed " << seed;
      int used = 0;
      for (int r : tree.front().replicas) used += r;
      EXPECT_LE(used, devices) << "seed " << seed;
      EXPECT_LE(slowest(tree.front().assignment, tree.front().replicas),
                slowest(chain, chain_replicas) * (1.0 + 2e-3) + 1e-12)
          << "seed " << seed << " micro-batch " << mb;
    }
  }
}

namespace {

// Every fourth seed a random chain, else a random series-parallel graph (seeds from `base`).
graph::OpGraph chain_or_series_parallel(unsigned base, int seed) {
  const auto at = base + static_cast<unsigned>(seed);
  return seed % 4 == 3 ? tst::random_chain(at, 8 + seed % 23) : tst::random_sp_graph(at, 8 + seed % 40);
}

// Every third seed a memory limit that the parameters bind (1.5 x their share of the devices),
// else none to speak of.
double limit_for(const graph::OpGraph& g, int devices, int seed) {
  return seed % 3 == 0 ? 1.5 * g.total_param_bytes() / devices + 1e6 : 1e15;
}

}  // namespace

// The search's shortcuts (graphpipe_dp.h) change no answer: the device floor rules out only
// fragments that have no plan, a memory-free subtree's fragments have the same plan whatever
// the depth after them, a plan rebuilt from its probe's depths takes the exact search's
// first moves, and the path floor skips only moves that cannot be strictly shallower. So the DP's plans are the same
// with each and with none: plain and replicated problems, memory limits that bind on parameters or on activations
// (where some subtrees are memory-free and others not) and that do not, on random series-parallel graphs and on chains.
TEST(PartitionGraphpipeDp, SearchShortcutsLeaveEveryPlanAsItWas) {
  int compared = 0, replicated = 0, without_plan = 0;
  for (int seed = 0; seed < 60; ++seed) {
    const auto g = chain_or_series_parallel(5300, seed);
    const int devices = 2 + seed % 15;
    const double limit = limit_for(g, devices, seed);
    cost::Devices d = cost::v100(devices, 4);
    cost::CostModel model(g, d);
    auto sp = graph::decompose_series_parallel(g);
    ASSERT_TRUE(sp.is_series_parallel);
    for (std::int64_t mb : {1, 8}) {
      for (const bool replicate : {false, true}) {
        pt::Problem p = pt::make_problem(model, 32, mb, std::min<int>(devices, g.num_nodes()), limit, {});
        if (replicate) {
          p.replicas = std::make_shared<const pt::ReplicaTable>(model, mb, devices);
          p.device_budget = devices;
        }
        if (seed % 3 == 1) {
          // Activations bind: scaled to ten times the static bytes with M micro-batches in flight,
          // and the limit the whole model's bytes so spread evenly over the devices. (Without the
          // received tensors in the memory-free test, or with one micro-batch in flight instead of
          // M, plans differ here.)
          double fixed = 0.0, activations = 0.0;
          for (double b : p.static_bytes) fixed += b;
          for (double b : p.act_bytes) activations += b;
          for (double b : p.edge_bytes) activations += b;
          const double scale = 10.0 * fixed / (activations * static_cast<double>(p.num_micro_batches));
          for (double& b : p.act_bytes) b *= scale;
          for (double& b : p.edge_bytes) b *= scale;
          p.memory_limit = 11.0 * fixed / devices;
        }
        const auto searched = pt::graphpipe_plans(
            p, sp.tree, 1e-3,
            {.device_floor = false, .memory_free = false, .pinned_rebuild = false, .path_floor = false});
        for (const pt::SearchShortcuts shortcuts :
             {pt::SearchShortcuts{
                  .device_floor = true, .memory_free = false, .pinned_rebuild = false, .path_floor = false},
              pt::SearchShortcuts{
                  .device_floor = false, .memory_free = true, .pinned_rebuild = false, .path_floor = false},
              pt::SearchShortcuts{
                  .device_floor = false, .memory_free = false, .pinned_rebuild = true, .path_floor = false},
              pt::SearchShortcuts{
                  .device_floor = false, .memory_free = false, .pinned_rebuild = false, .path_floor = true},
              pt::SearchShortcuts{}}) {
          const auto shortened = pt::graphpipe_plans(p, sp.tree, 1e-3, shortcuts);
          const std::string label = "seed " + std::to_string(seed) + " micro-batch " + std::to_string(mb) +
                                    (replicate ? " replicated" : "") +
                                    (shortcuts.device_floor && shortcuts.path_floor ? " every shortcut"
                                     : shortcuts.device_floor                       ? " device floor"
                                     : shortcuts.memory_free                        ? " memory-free subtrees"
                                     : shortcuts.pinned_rebuild                     ? " rebuilt from depths"
                                                                                    : " path floor");
          ASSERT_EQ(shortened.size(), searched.size()) << label;
          for (std::size_t i = 0; i < shortened.size(); ++i) {
            EXPECT_EQ(shortened[i].assignment, searched[i].assignment) << label << " plan " << i;
            EXPECT_EQ(shortened[i].replicas, searched[i].replicas) << label << " plan " << i;
          }
        }
        ++compared;
        replicated += replicate ? 1 : 0;
        without_plan += searched.empty() ? 1 : 0;
      }
    }
  }
  std::printf("[ shortcuts ] %d searches with the same plans (%d replicated, %d without a plan)\n", compared,
              replicated, without_plan);
  EXPECT_LT(without_plan, compared / 2);
}

// The budgets of the replicated portfolio's ladder searched one after the other on one solver
// (graphpipe_ladder_plans), each search's probes bounded by the depths the ones before kept, give
// each budget the plans of a search of its own: a fragment's least depth on n devices does not
// depend on the budget at the root. Largest budget first, as the portfolio runs them, and in
// another order; memory limits that bind and that do not; an exact search (no pinned rebuild) too.
TEST(PartitionGraphpipeDp, LadderOfBudgetsOnOneSolverGivesEachBudgetsOwnPlans) {
  int compared = 0, with_plan = 0;
  for (int seed = 0; seed < 40; ++seed) {
    const auto g = chain_or_series_parallel(7100, seed);
    const int devices = 4 + seed % 29;
    const double limit = limit_for(g, devices, seed);
    cost::Devices d = cost::v100(devices, 8);
    cost::CostModel model(g, d);
    auto sp = graph::decompose_series_parallel(g);
    ASSERT_TRUE(sp.is_series_parallel);
    for (std::int64_t mb : {1, 8}) {
      pt::Problem top = pt::make_problem(model, 32, mb, std::min<int>(devices, g.num_nodes()), limit, {});
      top.replicas = std::make_shared<const pt::ReplicaTable>(model, mb, devices);
      top.device_budget = devices;
      std::vector<int> budgets;
      for (int b = devices; b >= 1; b /= 2) budgets.push_back(b);
      if (seed % 2 == 1) std::reverse(budgets.begin(), budgets.end());
      const pt::SearchShortcuts shortcuts{.pinned_rebuild = seed % 5 != 4};
      const auto ladder = pt::graphpipe_ladder_plans(top, sp.tree, 1e-3, budgets, shortcuts);
      ASSERT_EQ(ladder.size(), budgets.size());
      for (std::size_t i = 0; i < budgets.size(); ++i) {
        pt::Problem at = top;
        at.device_budget = budgets[i];
        at.max_stages = std::min(top.max_stages, budgets[i]);
        const auto own = pt::graphpipe_plans(at, sp.tree, 1e-3, shortcuts);
        const std::string label = "seed " + std::to_string(seed) + " micro-batch " + std::to_string(mb) + " budget " +
                                  std::to_string(budgets[i]) + " of " + std::to_string(devices);
        ASSERT_EQ(ladder[i].size(), own.size()) << label;
        for (std::size_t k = 0; k < own.size(); ++k) {
          EXPECT_EQ(ladder[i][k].assignment, own[k].assignment) << label << " plan " << k;
          EXPECT_EQ(ladder[i][k].replicas, own[k].replicas) << label << " plan " << k;
        }
        ++compared;
        with_plan += own.empty() ? 0 : 1;
      }
    }
  }
  std::printf("[ ladder ] %d budgets with the same plans (%d with a plan)\n", compared, with_plan);
  EXPECT_GT(with_plan, compared / 2);
}

// Past the DP's 255 devices a budget searches on 255, as a solver of its own does: a ladder from
// 300 devices gives the 300- and 256-device budgets the 255-device plans.
TEST(PartitionGraphpipeDp, LadderPast255DevicesSearchesOn255) {
  const auto g = tst::random_sp_graph(7300, 24);
  cost::Devices d = cost::v100(300, 8);
  cost::CostModel model(g, d);
  auto sp = graph::decompose_series_parallel(g);
  pt::Problem top = pt::make_problem(model, 512, 64, std::min<int>(300, g.num_nodes()), 1e15, {});
  top.replicas = std::make_shared<const pt::ReplicaTable>(model, 64, 300);
  top.device_budget = 300;
  const auto ladder = pt::graphpipe_ladder_plans(top, sp.tree, 1e-3, {300, 256, 128});
  ASSERT_EQ(ladder.size(), 3u);
  for (const int budget : {300, 256, 128}) {
    pt::Problem at = top;
    at.device_budget = budget;
    at.max_stages = std::min(top.max_stages, budget);
    const auto own = pt::graphpipe_plans(at, sp.tree, 1e-3);
    const auto& got = ladder[budget == 300 ? 0 : budget == 256 ? 1 : 2];
    ASSERT_FALSE(own.empty()) << budget;
    ASSERT_EQ(got.size(), own.size()) << budget;
    for (std::size_t k = 0; k < own.size(); ++k) {
      EXPECT_EQ(got[k].assignment, own[k].assignment) << budget;
      EXPECT_EQ(got[k].replicas, own[k].replicas) << budget;
    }
  }
}

TEST(PartitionGraphpipeDp, LadderRefusesABudgetOutsideTheProblems) {
  const auto g = tst::random_sp_graph(7200, 20);
  cost::Devices d = cost::v100(8, 8);
  cost::CostModel model(g, d);
  auto sp = graph::decompose_series_parallel(g);
  pt::Problem top = pt::make_problem(model, 32, 4, 8, 1e15, {});
  top.replicas = std::make_shared<const pt::ReplicaTable>(model, 4, 8);
  top.device_budget = 8;
  for (int bad : {0, 9}) {
    try {
      pt::graphpipe_ladder_plans(top, sp.tree, 1e-3, {8, bad});
      ADD_FAILURE() << "a budget of " << bad << " was searched";
    } catch (const graphpipe::PlanningError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad) + " devices"), std::string::npos) << e.what();
    }
  }
}
