#include <gtest/gtest.h>

#include <string>

#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule_plans.h"

using namespace graphpipe::schedule;

TEST(Check, AcceptsAGeneratedSchedule) {
  auto result = check(generate(graphpipe::testing::chain_plan(4, 8), Policy::one_f_one_b));
  EXPECT_TRUE(result.ok) << result.to_string();
  EXPECT_TRUE(result.blocked.empty());
  EXPECT_GT(result.batches, 0u);
  EXPECT_NO_THROW(require_deadlock_free(generate(graphpipe::testing::chain_plan(4, 8), Policy::fill_drain)));
}

TEST(Check, ReportsACyclicWaitWithRanksAndInstructions) {
  // Well formed, but stage 0 waits for the gradient before it has sent the activation the
  // gradient depends on: rank 0 waits for rank 1's send, rank 1 for rank 0's.
  Schedule s = parse(
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0RB0e0 0B0 0SF0e0\n"
      "rank 1 | 1RF0e0 1F0 1B0 1SB0e0\n");
  CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  ASSERT_EQ(result.blocked.size(), 2u);
  EXPECT_EQ(result.blocked[0].rank, 0);
  EXPECT_EQ(result.blocked[0].step, 1u);
  EXPECT_EQ(to_token(result.blocked[0].instruction), "0RB0e0");
  EXPECT_EQ(result.blocked[1].rank, 1);
  EXPECT_EQ(result.blocked[1].step, 0u);
  EXPECT_EQ(to_token(result.blocked[1].instruction), "1RF0e0");
  EXPECT_EQ(result.to_string(),
            "the schedule hangs: 2 rank(s) blocked\n"
            "  rank 0 blocks at step 1 on 0RB0e0: waits for rank 1 to post the matching send "
            "1SB0e0; rank 1 blocks at step 0 on 1RF0e0\n"
            "  rank 1 blocks at step 0 on 1RF0e0: waits for rank 0 to post the matching send "
            "0SF0e0; rank 0 blocks at step 1 on 0RB0e0");
  EXPECT_THROW(require_deadlock_free(s), ScheduleError);
}

TEST(Check, ReportsTransfersPostedInDifferentOrders) {
  // Rank 0 sends micro-batch 0 then 1; rank 1 receives 1 first: FIFO matching would hand it
  // the wrong tensor.
  Schedule s = parse(
      "schedule manual: 2 stages, 2 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0F1 0SF0e0 0SF1e0 0RB0e0 0RB1e0 0B0 0B1\n"
      "rank 1 | 1RF1e0 1RF0e0 1F0 1F1 1B0 1B1 1SB0e0 1SB1e0\n");
  CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  ASSERT_EQ(result.blocked.size(), 2u);
  EXPECT_NE(result.blocked[1].reason.find("order mismatch: rank 1 posts 1RF1e0 but the next "
                                          "message rank 0 sends it is 0SF0e0"),
            std::string::npos)
      << result.to_string();
}

TEST(Check, BatchingLetsBothSidesPostBeforeWaiting) {
  // Rank 0 sends activation 1 and waits for gradient 0 in one batch; rank 1 sends gradient 0 and
  // receives activation 1 in one batch. One send each way at once: fine when posted together.
  Schedule s = parse(
      "schedule manual: 2 stages, 2 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0SF0e0 0F1 0SF1e0 0RB0e0 0B0 0RB1e0 0B1\n"
      "rank 1 | 1RF0e0 1F0 1B0 1SB0e0 1RF1e0 1F1 1B1 1SB1e0\n");
  EXPECT_TRUE(check(s).ok) << check(s).to_string();
}

TEST(Check, ThreeRanksWaitingInACircle) {
  // 0 -> 1 -> 2 and 0 -> 2. Rank 0 sends the skip activation (edge 2) only after its backward,
  // so rank 2 waits for rank 0, rank 0 for rank 1's gradient, and rank 1 for rank 2's.
  Schedule s = parse(
      "schedule manual: 3 stages, 1 micro-batches, 3 ranks\nstage ranks: 0 1 2\n"
      "edges: 0->1 1->2 0->2\n"
      "rank 0 | 0F0 0SF0e0 0RB0e0 0RB0e2 0B0 0SF0e2\n"
      "rank 1 | 1RF0e0 1F0 1SF0e1 1RB0e1 1B0 1SB0e0\n"
      "rank 2 | 2RF0e1 2RF0e2 2F0 2B0 2SB0e1 2SB0e2\n");
  CheckResult result = check(s);
  ASSERT_FALSE(result.ok);
  ASSERT_EQ(result.blocked.size(), 3u) << result.to_string();
  EXPECT_EQ(to_token(result.blocked[0].instruction), "0RB0e0");
  EXPECT_EQ(to_token(result.blocked[1].instruction), "1RB0e1");
  EXPECT_EQ(to_token(result.blocked[2].instruction), "2RF0e2");
  EXPECT_NE(result.blocked[2].reason.find("waits for rank 0 to post the matching send 0SF0e2"), std::string::npos)
      << result.to_string();
}
