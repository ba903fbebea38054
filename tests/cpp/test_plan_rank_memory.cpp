// What a rank of a plan holds by the memory model (the sum over the stages it runs) and what the
// plan's limit leaves of it: the budget of the receive buffers the runtime posts ahead.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error.h"
#include "plan/rank_memory.h"

namespace gp = graphpipe;
using gp::plan::Plan;

namespace {

// Three stages on two ranks: stages 0 and 2 on rank 0 (an early and a late stage, as the V places
// them), stage 1 on rank 1.
Plan three_stages_on_two_ranks(double limit) {
  Plan plan;
  plan.num_devices = 2;
  plan.memory_limit_bytes = limit;
  plan.stages.resize(3);
  plan.stages[0].devices = {0};
  plan.stages[0].memory_bytes = 100.0;
  plan.stages[1].devices = {1};
  plan.stages[1].memory_bytes = 40.0;
  plan.stages[2].devices = {0};
  plan.stages[2].memory_bytes = 30.0;
  return plan;
}

}  // namespace

TEST(PlanRankMemory, ARankHoldsTheSumOfItsStagesAndTheLimitLeavesTheRest) {
  const Plan plan = three_stages_on_two_ranks(200.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_bytes(plan, 0), 130.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_bytes(plan, 1), 40.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(plan, 0), 70.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(plan, 1), 160.0);
}

TEST(PlanRankMemory, AReplicatedStageCountsOneReplicaOnEachOfItsRanks) {
  Plan plan = three_stages_on_two_ranks(120.0);
  plan.stages.resize(1);
  plan.stages[0].devices = {0, 1};
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_bytes(plan, 0), 100.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_bytes(plan, 1), 100.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(plan, 1), 20.0);
}

TEST(PlanRankMemory, NoLimitLeavesNoBoundAndARankOverItsLimitNone) {
  EXPECT_TRUE(std::isinf(gp::plan::rank_memory_headroom(three_stages_on_two_ranks(0.0), 0)));
  // A plan read from a file or built by hand may predict more than its limit: nothing is left.
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(three_stages_on_two_ranks(120.0), 0), 0.0);
  Plan idle = three_stages_on_two_ranks(200.0);
  idle.num_devices = 3;  // rank 2 runs no stage
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_bytes(idle, 2), 0.0);
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(idle, 2), 200.0);
  // A job with more ranks than the plan has devices: the others are idle.
  EXPECT_DOUBLE_EQ(gp::plan::rank_memory_headroom(idle, 5), 200.0);
}

TEST(PlanRankMemory, ANegativeRankIsNamed) {
  try {
    gp::plan::rank_memory_headroom(three_stages_on_two_ranks(200.0), -1);
    FAIL() << "no error";
  } catch (const gp::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("rank -1 is negative"), std::string::npos) << e.what();
  }
}
