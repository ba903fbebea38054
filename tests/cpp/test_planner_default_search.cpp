// The default search (planner/default_search.h): replicate not given plans with replicas allowed
// under the widened search, exactly as asking for it by hand; replicate given runs the search as
// given; a partitioner that places by the user runs without replicas; and where the replicated
// planning refuses, the plan without replicas stands; and the default of a graph partitioner is
// never slower than its baselines (sequential+dp, piper+dp, plain data parallelism).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/devices.h"
#include "cost/presets.h"
#include "partition/options.h"
#include "partition/partitioner.h"
#include "partition/registry.h"
#include "plan/plan_io.h"
#include "planner/default_search.h"
#include "planner/planner.h"
#include "test_partition_graphs.h"

namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace pl = graphpipe::planner;
namespace tst = graphpipe::testing;

namespace {

std::string plan_text(const graphpipe::plan::Plan& plan, const graphpipe::graph::OpGraph& g) {
  return graphpipe::plan::to_json(plan, g).dump();
}

}  // namespace

TEST(DefaultSearch, WidenedSearchSetsTheDefaultsBudgets) {
  pl::PlannerOptions given;
  given.min_devices = 3;
  const pl::PlannerOptions widened = pl::widened_search(given);
  EXPECT_EQ(widened.plain_budget_limit, 16);
  EXPECT_EQ(widened.plain_every_up_to, 16);
  EXPECT_TRUE(widened.grow_replicas);
  EXPECT_EQ(widened.min_devices, 3);  // the rest as given
}

TEST(DefaultSearch, NotGivenIsTheWidenedReplicatedSearchAndGivenIsAsAsked) {
  graphpipe::graph::OpGraph g = tst::random_sp_graph(77, 16);
  g.trace_batch_size = 64;
  const cost::Devices devices = cost::v100(8, 4);
  pt::Options o;
  const pl::PlannerOptions search;
  const auto by_default = pl::plan_with_replication(g, devices, o, search, std::nullopt);
  pt::Options replicated = o;
  replicated.replicate = true;
  const auto by_hand = pl::plan_by_simulation(g, devices, replicated, pl::widened_search(search));
  // The baselines weighed beside it (below) replace it only where strictly faster.
  if (by_default.plan.partitioner.rfind("graphpipe", 0) == 0) {
    EXPECT_EQ(plan_text(by_default.plan, g), plan_text(by_hand.plan, g));
  } else {
    EXPECT_LT(by_default.plan.predicted_iteration_seconds, by_hand.plan.predicted_iteration_seconds);
  }
  for (const bool replicate : {false, true}) {
    pt::Options asked = o;
    asked.replicate = replicate;
    EXPECT_EQ(plan_text(pl::plan_with_replication(g, devices, o, search, replicate).plan, g),
              plan_text(pl::plan_by_simulation(g, devices, asked, search).plan, g));
  }
}

TEST(DefaultSearch, RefusedReplicasLeaveThePlanWithoutThem) {
  // A refusal of the replicated search alone: PowerSGD prices replicas by parameter shapes, and
  // this graph has none (a plan without replicas syncs nothing).
  graphpipe::graph::OpGraph g = tst::random_sp_graph(78, 12);
  g.trace_batch_size = 32;
  for (std::size_t v = 0; v < g.num_nodes(); ++v) {
    g.mutable_node(static_cast<graphpipe::graph::NodeId>(v)).param_shapes.clear();
  }
  const cost::Devices devices = cost::v100(4, 4);
  pt::Options o;
  o.sync.kind = cost::SyncKind::power_sgd;
  pt::Options replicated = o;
  replicated.replicate = true;
  EXPECT_THROW(pl::plan_by_simulation(g, devices, replicated, pl::widened_search({})), graphpipe::PlanningError);
  pt::Options plain = o;
  const auto fallback = pl::plan_with_replication(g, devices, o, {}, std::nullopt);
  EXPECT_EQ(plan_text(fallback.plan, g), plan_text(pl::plan_by_simulation(g, devices, plain, {}).plan, g));
}

namespace {

// A baseline's default search (or plain data parallelism on every device, via manual), as
// simulate_paper.py --replicas runs them.
double baseline_step(const graphpipe::graph::OpGraph& g, const cost::Devices& devices, const std::string& name) {
  pt::Options o;
  o.partitioner = name;
  if (name == "data parallel") {
    o.partitioner = "manual";
    o.manual = {{"", 0}};
    std::vector<int> all(static_cast<std::size_t>(devices.count));
    for (int d = 0; d < devices.count; ++d) all[static_cast<std::size_t>(d)] = d;
    o.stage_devices = {{0, all}};
  }
  return pl::plan_with_replication(g, devices, o, {}, std::nullopt).plan.predicted_iteration_seconds;
}

}  // namespace

TEST(DefaultSearch, BaselinesAreTheRegistrysMarkedPartitioners) {
  EXPECT_EQ(pt::baseline_names(), (std::vector<std::string>{"sequential", "piper"}));
}

TEST(DefaultSearch, NeverSlowerThanItsBaselinesOnRandomSeriesParallelGraphs) {
  // The default at 8 to 64 simulated V100s (8 per node), against every baseline on the same
  // devices; beside PartitionMonotone.NeverSlowerWithMoreDevices. (Where a baseline wins, the
  // wide Inception blocks of tests/python/test_planner_baselines.py.)
  for (int seed = 0; seed < 4; ++seed) {
    graphpipe::graph::OpGraph g = tst::random_sp_graph(300 + seed, 20);
    g.trace_batch_size = 256;
    for (const int count : {8, 16, 32, 64}) {
      const cost::Devices devices = cost::v100(count, 8);
      const double step = pl::plan_with_replication(g, devices, {}, {}, std::nullopt).plan.predicted_iteration_seconds;
      for (const std::string baseline : {"sequential", "piper", "data parallel"}) {
        EXPECT_LE(step, baseline_step(g, devices, baseline) * (1 + 1e-12))
            << "seed " << seed << " on " << count << " against " << baseline;
      }
    }
  }
}

// The default passes over data parallelism on the first r ranks where the floor of every plan
// on those ranks (candidate_floor's zero-bubble form, with replicas) is above the step to beat.
// That is sound only if no such plan simulates below the floor: data parallelism on the first
// 1-8 of 8 V100s, planned as the default does (the manual partitioner's one stage), never does.
TEST(DefaultSearch, DataParallelismOnTheFirstRanksIsNeverBelowTheirFloor) {
  int checked = 0;
  for (int seed = 0; seed < 4; ++seed) {
    graphpipe::graph::OpGraph g = tst::random_sp_graph(400 + seed, 20);
    g.trace_batch_size = 256;
    const cost::Devices devices = cost::v100(8, 4);
    for (const int replicas : {1, 2, 4, 8}) {
      pt::Options floor_options;
      floor_options.zero_bubble = true;
      floor_options.replicate = true;
      floor_options.max_stages = replicas;
      const double floor = pt::candidate_floor(g, cost::first_ranks(devices, replicas), floor_options);
      pt::Options dp;
      dp.partitioner = "manual";
      dp.manual = {{"", 0}};
      std::vector<int> ranks(static_cast<std::size_t>(replicas));
      for (int r = 0; r < replicas; ++r) ranks[static_cast<std::size_t>(r)] = r;
      dp.stage_devices = {{0, ranks}};
      const double step = pl::plan_by_simulation(g, devices, dp, {}).plan.predicted_iteration_seconds;
      EXPECT_GT(floor, 0.0);
      EXPECT_LE(floor, step * (1 + 1e-12)) << "seed " << seed << " on " << replicas << " replicas";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16);
}

TEST(DefaultSearch, APartitionerAskedByNameIsNotWeighedAgainstTheBaselines) {
  // A baseline's default, or METIS's, is its own search alone: what comparing partitioners
  // measures. (METIS loses to plain data parallelism on these graphs.)
  graphpipe::graph::OpGraph g = tst::random_sp_graph(300, 20);
  g.trace_batch_size = 256;
  const cost::Devices devices = cost::v100(8, 8);
  for (const std::string name : {"sequential", "metis"}) {
    pt::Options o;
    o.partitioner = name;
    pt::Options replicated = o;
    replicated.replicate = true;
    pl::PlannerOptions one_stage_per_device;  // folds aside: weigh_folded's own tests
    one_stage_per_device.stages_per_rank = 1;
    const auto by_default = pl::plan_with_replication(g, devices, o, one_stage_per_device, std::nullopt);
    EXPECT_EQ(by_default.plan.partitioner.rfind(name, 0), 0U) << by_default.plan.partitioner;
    EXPECT_EQ(
        plan_text(by_default.plan, g),
        plan_text(pl::plan_by_simulation(g, devices, replicated, pl::widened_search(one_stage_per_device)).plan, g));
  }
}

// The step to beat (PlannerOptions::to_beat) only skips what could not beat it: just above the
// search's own step the same plan comes back; below every floor, NoPlanBelow names the step,
// except with replica growth, whose replicated pools are listed whole (the growth's start must
// stay listed) and give the same plan whatever the step.
TEST(DefaultSearch, TheStepToBeatSkipsOnlyWhatCannotBeatIt) {
  graphpipe::graph::OpGraph g = tst::random_sp_graph(7, 24);
  g.trace_batch_size = 64;
  const cost::Devices devices = cost::v100(8, 8);
  pt::Options o;
  o.replicate = true;
  for (const pl::PlannerOptions& search : {pl::PlannerOptions{}, pl::widened_search({})}) {
    const auto free = pl::plan_by_simulation(g, devices, o, search);
    pl::PlannerOptions beat = search;
    beat.to_beat = free.plan.predicted_iteration_seconds * (1.0 + 1e-6);
    const auto bounded = pl::plan_by_simulation(g, devices, o, beat);
    EXPECT_EQ(plan_text(bounded.plan, g), plan_text(free.plan, g)) << "grow " << search.grow_replicas;
    EXPECT_LE(bounded.candidates, free.candidates);
    beat.to_beat = 1e-9;
    if (search.grow_replicas) {
      // The replicated pools stay listed whole, for growth to start from; no plan beats 1e-9 s,
      // and no growth on a smaller budget runs (every floor is above it), so nothing returned is
      // faster than the search without the step to beat.
      const auto none_faster = pl::plan_by_simulation(g, devices, o, beat);
      EXPECT_GE(none_faster.plan.predicted_iteration_seconds, free.plan.predicted_iteration_seconds * (1.0 - 1e-12));
      EXPECT_LE(none_faster.growth_simulated, free.growth_simulated);
      continue;
    }
    try {
      pl::plan_by_simulation(g, devices, o, beat);
      ADD_FAILURE() << "a step below every floor was beaten";
    } catch (const pl::NoPlanBelow& e) {
      EXPECT_NE(std::string(e.what()).find("simulate below"), std::string::npos) << e.what();
    }
  }
}
