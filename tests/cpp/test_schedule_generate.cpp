#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule_plans.h"

using namespace graphpipe::schedule;
using graphpipe::PlanningError;
using graphpipe::testing::chain_plan;
using graphpipe::testing::random_plan;
using graphpipe::testing::stage_plan;

namespace {

// The forwards and backwards of one rank as "F0 F1 B0 ...".
std::string compute_order(const Schedule& s, int rank) {
  std::string out;
  for (const auto& i : s.ranks[rank]) {
    if (i.kind != OpKind::forward && i.kind != OpKind::backward) continue;
    if (!out.empty()) out += ' ';
    out += std::string(kind_code(i.kind)) + std::to_string(i.micro_batch);
  }
  return out;
}

std::string tokens(const std::vector<Instruction>& program) {
  std::string out;
  for (const auto& i : program) out += (out.empty() ? "" : " ") + to_token(i);
  return out;
}

}  // namespace

TEST(Generate, ClassicOneFOneBOnAChain) {
  // Megatron / torch.distributed.pipelining 1F1B for S = 4, M = 8: stage i warms up with S - i
  // forwards, alternates one backward and one forward, and drains its backwards.
  auto s = generate(chain_plan(4, 8), Policy::one_f_one_b);
  EXPECT_EQ(compute_order(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(compute_order(s, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(compute_order(s, 2), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  EXPECT_EQ(compute_order(s, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Communication as in Megatron: the last stage returns gradient k and receives activation k+1
  // in one batch (consecutive transfers are posted together), stage 2 sends activation k+1 and
  // receives gradient k in one batch.
  EXPECT_EQ(tokens({s.ranks[3].begin(), s.ranks[3].begin() + 8}), "3RF0e2 3F0 3B0 3RF1e2 3SB0e2 3F1 3B1 3SB1e2");
  EXPECT_EQ(tokens({s.ranks[2].begin() + 4, s.ranks[2].begin() + 12}),
            "2F1 2RF2e1 2SF1e2 2RB0e2 2B0 2SB0e1 2F2 2RB1e2");
  EXPECT_EQ(to_token(s.ranks[3].back()), "3OPT");
}

TEST(Generate, OneFOneBOrderDoesNotDependOnStageCosts) {
  auto plan = chain_plan(4, 8);
  plan.stages[0].forward_seconds = 10.0;  // a slow first stage would tempt a greedy scheduler
  plan.stages[2].backward_seconds = 0.0;
  auto s = generate(plan, Policy::one_f_one_b);
  EXPECT_EQ(compute_order(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(compute_order(s, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_TRUE(check(s).ok);
}

TEST(Generate, GreedyMatchesOneFOneBOnEqualChain) {
  auto plan = chain_plan(4, 8);
  auto a = generate(plan, Policy::one_f_one_b);
  auto b = generate(plan, Policy::one_f_one_b_greedy);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(compute_order(a, r), compute_order(b, r)) << "rank " << r;
}

TEST(Generate, FillDrainRunsAllForwardsFirst) {
  auto s = generate(chain_plan(3, 4), Policy::fill_drain);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(compute_order(s, r), "F0 F1 F2 F3 B0 B1 B2 B3");
  EXPECT_EQ(s.kind, "fill_drain");
}

TEST(Generate, InFlightLimitsFollowLongestPathToSink) {
  // 0 -> {1, 2}; 1 -> 3 -> 5; 2 -> 4 -> 5: depth 4 from stage 0.
  auto plan = stage_plan(6, {{0, 1}, {0, 2}, {1, 3}, {2, 4}, {3, 5}, {4, 5}}, 8);
  EXPECT_EQ(stages_to_sink(plan), (std::vector<int>{4, 3, 3, 2, 2, 1}));
  EXPECT_EQ(in_flight_limits(plan, Policy::one_f_one_b), (std::vector<int>{4, 3, 3, 2, 2, 1}));
  EXPECT_EQ(in_flight_limits(plan, Policy::fill_drain), (std::vector<int>(6, 8)));
  // A stage with a short and a long successor takes the long one: 0 -> 1 -> 2 -> 3 and 0 -> 3.
  auto skip = stage_plan(4, {{0, 1}, {1, 2}, {2, 3}, {0, 3}}, 2);
  EXPECT_EQ(stages_to_sink(skip), (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(in_flight_limits(skip, Policy::one_f_one_b), (std::vector<int>{2, 2, 2, 1}));
}

TEST(Generate, GraphPlanWarmsUpByDepthNotStageCount) {
  // Six stages as a two-branch graph of depth 3: the first stage holds 3 micro-batches where a
  // six-stage chain holds 6.
  auto graph = stage_plan(6, {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 5}, {2, 5}, {3, 5}, {4, 5}}, 8);
  auto s = generate(graph, Policy::one_f_one_b);
  EXPECT_EQ(compute_order(s, 0), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  auto chain = generate(chain_plan(6, 8), Policy::one_f_one_b);
  EXPECT_EQ(compute_order(chain, 0).substr(0, 20), "F0 F1 F2 F3 F4 F5 B0");
}

TEST(Generate, RanksFollowStageDevices) {
  auto plan = chain_plan(3, 2);
  plan.stages[0].devices = {2};
  plan.stages[2].devices = {0};
  plan.num_devices = 4;
  auto s = generate(plan, "1f1b");
  EXPECT_EQ(s.stage_ranks, (std::vector<std::vector<int>>{{2}, {1}, {0}}));
  EXPECT_EQ(s.num_ranks(), 4);
  EXPECT_TRUE(s.ranks[3].empty());
  EXPECT_EQ(s.ranks[2].front().stage, 0);
  EXPECT_TRUE(check(s).ok);
}

TEST(Generate, AReplicatedStageSharingARankIsRefusedClearly) {
  // Several stages on one rank are scheduled (test_schedule_stages_per_rank.cpp), but not where
  // one of them is replicated: its replicas run the lead's program in lockstep.
  auto plan = chain_plan(3, 2);
  plan.stages[2].devices = {0, 1};
  plan.micro_batch_size = 2;
  try {
    generate(plan, Policy::one_f_one_b);
    FAIL() << "expected ScheduleError";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("stages 0 and 2 both run on rank 0, and one of them is replicated"),
              std::string::npos)
        << e.what();
  }
}

TEST(Generate, BadArgumentsAreRefused) {
  EXPECT_THROW(generate(chain_plan(2, 2), "zero_bubble"), PlanningError);
  auto plan = chain_plan(2, 2);
  plan.num_micro_batches = 0;
  EXPECT_THROW(generate(plan, Policy::fill_drain), PlanningError);
  auto backwards = chain_plan(2, 2);
  backwards.edges[0].src = 1;
  backwards.edges[0].dst = 0;
  EXPECT_THROW(generate(backwards, Policy::fill_drain), PlanningError);
  auto homeless = chain_plan(2, 2);
  homeless.stages[1].devices.clear();
  EXPECT_THROW(generate(homeless, Policy::fill_drain), ScheduleError);
}

TEST(Generate, EveryGeneratedScheduleOnRandomDagsCompletes) {
  std::mt19937 rng(20240604);
  int schedules = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto plan = random_plan(rng);
    for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy}) {
      Schedule s = generate(plan, p);  // validates
      CheckResult result = check(s);
      ASSERT_TRUE(result.ok) << "trial " << trial << " " << policy_name(p) << "\n"
                             << result.to_string() << "\n"
                             << s.to_string();
      ++schedules;
    }
  }
  EXPECT_EQ(schedules, 9000);
}
