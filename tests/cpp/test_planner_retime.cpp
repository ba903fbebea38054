// Retiming (planner/retime.h): a plan priced again keeps every decision; on the description it
// was made on it gives the same figures, on devices half as fast its compute grows, and what
// would not be the same plan is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/options.h"
#include "plan/plan.h"
#include "planner/default_search.h"
#include "planner/planner.h"
#include "planner/retime.h"
#include "test_partition_graphs.h"

namespace cost = graphpipe::cost;
namespace pl = graphpipe::planner;
namespace gp = graphpipe::plan;
namespace tst = graphpipe::testing;

namespace {

// What a plan decided, stage by stage and as a whole.
auto decisions(const gp::Plan& p) {
  std::vector<std::tuple<std::vector<graphpipe::graph::NodeId>, std::vector<int>, bool>> stages;
  for (const gp::Stage& s : p.stages) stages.emplace_back(s.nodes, s.devices, s.recompute);
  return std::make_tuple(p.partitioner, p.schedule, p.fold, p.chain, p.optimizer, p.micro_batch_size,
                         p.num_micro_batches, p.memory_limit_bytes, stages);
}

auto figures(const gp::Plan& p) {
  std::vector<std::vector<double>> out;
  for (const gp::Stage& s : p.stages) {
    out.push_back({s.forward_seconds, s.backward_seconds, s.backward_input_seconds, s.backward_weight_seconds,
                   s.transfer_seconds, s.memory_bytes, s.all_reduce_seconds, static_cast<double>(s.in_flight)});
  }
  return out;
}

// The default search's plan (replicas, folds) and a folded one, on 4 V100s.
std::vector<gp::Plan> plans_of(const graphpipe::graph::OpGraph& g, const cost::Devices& devices) {
  pl::PlannerOptions folded;
  folded.stages_per_rank = 2;
  return {pl::plan_with_replication(g, devices, graphpipe::partition::Options{}, pl::PlannerOptions{}, true).plan,
          pl::plan_with_replication(g, devices, graphpipe::partition::Options{}, folded, false).plan};
}

}  // namespace

TEST(Retime, OnItsOwnDescriptionAPlanIsPricedAsItWasMade) {
  const cost::Devices devices = cost::v100(4);
  int folded = 0;
  for (unsigned seed = 1; seed <= 8; ++seed) {
    const auto g = tst::planner_test_graph(seed);
    for (const gp::Plan& plan : plans_of(g, devices)) {
      const gp::Plan again = pl::retime(plan, g, devices);
      EXPECT_EQ(decisions(again), decisions(plan)) << "seed " << seed;
      EXPECT_EQ(figures(again), figures(plan)) << "seed " << seed;
      folded += plan.fold.has_value();
    }
  }
  EXPECT_GT(folded, 0);  // some plan was folded, and kept its fold
}

TEST(Retime, OnSlowerDevicesEveryStageComputesLongerAndNothingElseChanges) {
  const cost::Devices devices = cost::v100(4);
  cost::Devices slower = devices;
  slower.flops_per_second /= 2;
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const auto g = tst::planner_test_graph(seed);
    for (const gp::Plan& plan : plans_of(g, devices)) {
      const gp::Plan again = pl::retime(plan, g, slower);
      EXPECT_EQ(decisions(again), decisions(plan)) << "seed " << seed;
      for (std::size_t s = 0; s < plan.stages.size(); ++s) {
        EXPECT_GT(again.stages[s].forward_seconds, 1.5 * plan.stages[s].forward_seconds) << "seed " << seed;
        EXPECT_GT(again.stages[s].backward_seconds, 1.5 * plan.stages[s].backward_seconds) << "seed " << seed;
        EXPECT_DOUBLE_EQ(again.stages[s].memory_bytes, plan.stages[s].memory_bytes);
      }
    }
  }
}

TEST(Retime, WhatWouldNotBeTheSamePlanIsRefused) {
  const cost::Devices devices = cost::v100(4);
  const auto g = tst::planner_test_graph(2);
  gp::Plan plan = plans_of(g, devices).front();
  try {
    pl::retime(plan, g, cost::v100(1));
    ADD_FAILURE() << "a plan on more ranks than described was retimed";
  } catch (const graphpipe::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("but the devices describe 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pl::retime(plan, tst::planner_test_graph(4), devices), graphpipe::PlanningError);  // another graph
  plan.stages[0].recompute = !plan.stages[0].recompute;
  try {
    pl::retime(plan, g, devices);
    ADD_FAILURE() << "a flipped recomputation was retimed";
  } catch (const graphpipe::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0"), std::string::npos) << e.what();
  }
}
