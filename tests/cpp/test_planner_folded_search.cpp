// Several stages per device, chosen by the planner (planner/folded_search.h): the folds map
// virtual devices onto real ones in a V and looping, the virtual devices are parts of the real
// ones, and the default search with stages_per_rank 2 is never slower than with 1, returns
// valid plans whose shared devices each hold stages alone, and on some graphs wins.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/options.h"
#include "partition/partitioner.h"
#include "plan/plan_io.h"
#include "planner/default_search.h"
#include "planner/folded_search.h"
#include "planner/planner.h"
#include "schedule/generate.h"
#include "test_partition_graphs.h"

namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace pl = graphpipe::planner;
namespace gp = graphpipe::plan;
namespace tst = graphpipe::testing;

namespace {

// The search without replicas on `g`, at most `k` stages per device, weighing `weighed` folds.
pl::PlannerResult unreplicated(const graphpipe::graph::OpGraph& g, const cost::Devices& devices, int k,
                               std::vector<gp::Fold> weighed = gp::all_folds()) {
  pl::PlannerOptions search;
  search.stages_per_rank = k;
  search.folds = std::move(weighed);
  return pl::plan_with_replication(g, devices, pt::Options{}, search, false);
}

std::vector<int> folds(gp::Fold fold, int devices, int k) {
  std::vector<int> out;
  for (int v = 0; v < k * devices; ++v) out.push_back(pl::folded_device(fold, v, devices));
  return out;
}

}  // namespace

TEST(FoldedSearch, FoldsInAVAndLooping) {
  EXPECT_EQ(folds(gp::Fold::v, 4, 2), (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_EQ(folds(gp::Fold::looping, 4, 2), (std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(folds(gp::Fold::v, 2, 3), (std::vector<int>{0, 1, 1, 0, 0, 1}));
}

TEST(FoldedSearch, VirtualDevicesArePartsOfTheRealOnes) {
  const cost::Devices real = cost::v100(4, 2);  // 2 nodes of 2
  const cost::Devices parts = pl::virtual_devices(real, gp::Fold::v, 2);
  ASSERT_EQ(parts.count, 8);
  EXPECT_DOUBLE_EQ(parts.memory_bytes, real.memory_bytes / 2);
  EXPECT_DOUBLE_EQ(parts.flops_per_second, real.flops_per_second);
  // Virtual 0 and 7 are halves of device 0; 3 and 4 of device 3 (on the second node).
  EXPECT_DOUBLE_EQ(parts.link_latency[0][7], 0.0);
  EXPECT_DOUBLE_EQ(parts.link_latency[0][4], real.link_latency[0][3]);
  EXPECT_DOUBLE_EQ(parts.link_bandwidth[0][4], real.link_bandwidth[0][3]);
  EXPECT_EQ(parts.node_of(4), real.node_of(3));
  parts.validate();
}

// On random chains and series-parallel graphs onto 4 V100s, without replicas: the plan with up
// to 2 stages per device simulates no slower than the plan with one; a folded plan validates,
// shares devices only between stages alone on them, and some graphs get one that is faster.
// Told one fold (PlannerOptions::folds), the search returns no plan folded the other way, some
// graph gets the named fold, and the search of both is the faster of the two, plan for plan.
TEST(FoldedSearch, NeverSlowerAndSometimesFolded) {
  const cost::Devices devices = cost::v100(4, 4);
  int folded_wins = 0;
  int named_folds = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const graphpipe::graph::OpGraph g = tst::planner_test_graph(seed);
    const auto plain = unreplicated(g, devices, 1);
    const auto shared = unreplicated(g, devices, 2);
    EXPECT_LE(shared.plan.predicted_iteration_seconds, plain.plan.predicted_iteration_seconds) << "seed " << seed;
    const auto in_v = unreplicated(g, devices, 2, {gp::Fold::v});
    const auto in_loop = unreplicated(g, devices, 2, {gp::Fold::looping});
    EXPECT_NE(in_v.plan.fold, std::optional{gp::Fold::looping}) << "seed " << seed;
    EXPECT_NE(in_loop.plan.fold, std::optional{gp::Fold::v}) << "seed " << seed;
    EXPECT_DOUBLE_EQ(shared.plan.predicted_iteration_seconds,
                     std::min(in_v.plan.predicted_iteration_seconds, in_loop.plan.predicted_iteration_seconds))
        << "seed " << seed;
    // The plan records its fold, as its label says it, and the record survives its JSON.
    for (const auto* found : {&in_v, &in_loop, &shared}) {
      const graphpipe::plan::Plan& plan = found->plan;
      EXPECT_EQ(plan.fold.has_value(), plan.partitioner.find("stages per device") != std::string::npos);
      if (plan.fold) EXPECT_NE(plan.partitioner.find(gp::fold_name(*plan.fold)), std::string::npos);
      EXPECT_EQ(graphpipe::plan::plan_from_json(graphpipe::plan::to_json(plan, g), g).fold, plan.fold);
    }
    named_folds += in_v.plan.fold == gp::Fold::v;
    named_folds += in_loop.plan.fold == gp::Fold::looping;
    if (!shared.plan.fold) continue;
    ++folded_wins;
    EXPECT_LT(shared.plan.predicted_iteration_seconds, plain.plan.predicted_iteration_seconds) << "seed " << seed;
    EXPECT_GT(shared.plan.stages.size(), static_cast<std::size_t>(devices.count)) << "seed " << seed;
    EXPECT_NO_THROW(graphpipe::plan::validate_plan(shared.plan, g)) << "seed " << seed;
    std::map<int, int> held;
    for (const auto& stage : shared.plan.stages) {
      ASSERT_EQ(stage.devices.size(), 1u);
      ++held[stage.devices.front()];
    }
    for (const auto& [device, count] : held) EXPECT_LE(count, 2) << "device " << device << ", seed " << seed;
  }
  EXPECT_GT(folded_wins, 0) << "no graph got a folded plan: the search never weighs it";
  EXPECT_GT(named_folds, 0) << "no named fold was ever taken: the restriction is not tested";
}

TEST(FoldedSearch, APlanFileNamingNoFoldIsRefused) {
  const graphpipe::graph::OpGraph g = tst::planner_test_graph(2);
  const auto shared = unreplicated(g, cost::v100(4, 4), 2, {gp::Fold::v});
  nlohmann::json doc = graphpipe::plan::to_json(shared.plan, g);
  doc["fold"] = "zigzag";
  try {
    graphpipe::plan::plan_from_json(doc, g);
    ADD_FAILURE() << "a plan file with fold 'zigzag' was read";
  } catch (const graphpipe::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.fold: unknown fold 'zigzag'"), std::string::npos) << e.what();
  }
}

TEST(FoldedSearch, StagesPerRankBelowOneIsRefused) {
  graphpipe::graph::OpGraph g = tst::random_chain(3, 8);
  pl::PlannerOptions search;
  search.stages_per_rank = -1;
  EXPECT_THROW(pl::plan_with_replication(g, cost::v100(2, 2), pt::Options{}, search, false), graphpipe::PlanningError);
  search.stages_per_rank = 2;
  search.fold_budget_limit = -1;
  EXPECT_THROW(pl::plan_with_replication(g, cost::v100(2, 2), pt::Options{}, search, false), graphpipe::PlanningError);
  // A fold named where nothing is folded, no fold at all, and a name that is no fold are refused too.
  EXPECT_EQ(gp::parse_fold("v"), gp::Fold::v);
  EXPECT_EQ(gp::parse_fold("looping"), gp::Fold::looping);
  EXPECT_THROW(gp::parse_fold("V"), graphpipe::PlanningError);
  search.fold_budget_limit = 8;
  search.folds = {};
  EXPECT_THROW(pl::plan_with_replication(g, cost::v100(2, 2), pt::Options{}, search, false), graphpipe::PlanningError);
  search.folds = {gp::Fold::v};
  search.stages_per_rank = 1;
  EXPECT_THROW(pl::plan_with_replication(g, cost::v100(2, 2), pt::Options{}, search, false), graphpipe::PlanningError);
}

// The floor the default search skips a fold budget by (default_search.h: candidate_floor of the
// plans without replicas on those devices) is below the simulated step of every folded plan it
// could skip: the skip is exact.
TEST(FoldedSearch, TheFoldBudgetsFloorIsBelowEveryFoldedPlan) {
  const cost::Devices devices = cost::v100(4, 4);
  int folded = 0;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const graphpipe::graph::OpGraph g = tst::planner_test_graph(seed);
    pt::Options plain;
    plain.max_stages = devices.count;
    const double floor = pt::candidate_floor(g, devices, plain);
    for (gp::Fold fold : {gp::Fold::v, gp::Fold::looping}) {
      const auto found = pl::folded_plan(g, devices, pt::Options{}, pl::PlannerOptions{}, fold, 2);
      if (!found) continue;
      ++folded;
      EXPECT_LE(floor, found->plan.predicted_iteration_seconds) << "seed " << seed << ", " << gp::fold_name(fold);
    }
  }
  EXPECT_GT(folded, 0);
}

// With stages_per_rank 2 the default search folds on the first 2, 4 and 8 ranks whatever the
// device count (up to fold_budget_limit), so it stays never slower with more devices. A plan
// folded on fewer ranks than the description has is that plan on the whole description: it
// records every device and simulates on them.
TEST(FoldedSearch, TheDefaultFoldsOnTheFirstRanksAndStaysNeverSlowerWithMoreDevices) {
  pl::PlannerOptions two;
  two.stages_per_rank = 2;
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const graphpipe::graph::OpGraph g = tst::planner_test_graph(seed);
    double previous = std::numeric_limits<double>::infinity();
    for (int count = 1; count <= 12; ++count) {
      const cost::Devices devices = cost::v100(count, 8);
      const auto result = pl::plan_with_replication(g, devices, pt::Options{}, two, std::nullopt);
      EXPECT_LE(result.plan.predicted_iteration_seconds, previous * (1.0 + 1e-12))
          << "seed " << seed << ", " << count << " devices: " << result.plan.partitioner;
      EXPECT_EQ(result.plan.num_devices, count);
      EXPECT_NO_THROW(graphpipe::plan::validate_plan(result.plan, g)) << "seed " << seed << ", " << count;
      previous = result.plan.predicted_iteration_seconds;
    }
  }
}

TEST(FoldedSearch, OneStagePerRankWeighsNoFold) {
  const cost::Devices devices = cost::v100(4, 4);
  pl::PlannerOptions one;
  one.stages_per_rank = 1;
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const graphpipe::graph::OpGraph g = tst::planner_test_graph(seed);
    const auto result = pl::plan_with_replication(g, devices, pt::Options{}, one, std::nullopt);
    EXPECT_EQ(result.plan.partitioner.find("stages per device"), std::string::npos) << "seed " << seed;
  }
}

// Unset, stages_per_rank is 2 in the default search (the default partitioner, replicate unset)
// and 1 where a partitioner is asked for by name or replicate is given: the default search plans
// as stages_per_rank 2 does, plan for plan, and a named search never folds. (On these small
// graphs the replicated plans win; tests/python/test_stages_per_rank.py has DLRM folded by default.)
TEST(FoldedSearch, TheDefaultSearchFoldsByDefaultAndANamedSearchDoesNot) {
  const cost::Devices devices = cost::v100(4, 4);
  const pl::PlannerOptions unset;
  EXPECT_FALSE(unset.stages_per_rank.has_value());
  pt::Options metis;
  metis.partitioner = "metis";
  EXPECT_EQ(pl::stages_per_rank_for(unset, pt::Options{}, std::nullopt), 2);
  EXPECT_EQ(pl::stages_per_rank_for(unset, pt::Options{}, true), 1);
  EXPECT_EQ(pl::stages_per_rank_for(unset, pt::Options{}, false), 1);
  EXPECT_EQ(pl::stages_per_rank_for(unset, metis, std::nullopt), 1);
  pl::PlannerOptions two;
  two.stages_per_rank = 2;
  EXPECT_EQ(pl::stages_per_rank_for(two, metis, false), 2);
  for (unsigned seed = 1; seed <= 12; ++seed) {
    const graphpipe::graph::OpGraph g = tst::planner_test_graph(seed);
    const auto by_default = pl::plan_with_replication(g, devices, pt::Options{}, unset, std::nullopt);
    const auto asked = pl::plan_with_replication(g, devices, pt::Options{}, two, std::nullopt);
    EXPECT_EQ(by_default.plan.partitioner, asked.plan.partitioner) << "seed " << seed;
    EXPECT_DOUBLE_EQ(by_default.plan.predicted_iteration_seconds, asked.plan.predicted_iteration_seconds);
    const auto named = pl::plan_with_replication(g, devices, metis, unset, std::nullopt);
    EXPECT_EQ(named.plan.partitioner.find("stages per device"), std::string::npos) << "seed " << seed;
  }
}

// Without replicas, a chain onto 12 V100s gets a plan folded on the first 8 ranks (16 stages, 2
// on each): it records all 12 devices, validates, and its step is its simulation on all 12.
TEST(FoldedSearch, AFoldOnTheFirstRanksIsThePlanOnTheWholeDescription) {
  graphpipe::graph::OpGraph g = tst::random_chain(1, 24);
  g.trace_batch_size = 8;
  const cost::Devices devices = cost::v100(12, 8);
  pl::PlannerOptions search;
  search.stages_per_rank = 2;
  const auto result = pl::plan_with_replication(g, devices, pt::Options{}, search, false);
  ASSERT_NE(result.plan.partitioner.find("2 stages per device"), std::string::npos) << result.plan.partitioner;
  EXPECT_EQ(result.plan.num_devices, 12);
  std::map<int, int> held;
  for (const auto& stage : result.plan.stages) ++held[stage.devices.at(0)];
  EXPECT_EQ(held.size(), 8u);
  EXPECT_EQ(held.rbegin()->first, 7);
  EXPECT_NO_THROW(graphpipe::plan::validate_plan(result.plan, g));
  const auto policy = graphpipe::schedule::parse_policy(result.plan.schedule);
  EXPECT_DOUBLE_EQ(result.plan.predicted_iteration_seconds,
                   pl::simulated_step(result.plan, devices, policy, search.sim));
}
