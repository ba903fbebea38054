// Several stages per rank (schedule.h): a rank holding several stages, each alone on it, runs
// them one compute at a time; the generator interleaves their work on the rank, an edge between
// two of them (local) has no transfer instructions, and every policy's schedule is well formed
// and deadlock-free, on chains placed looping (rank r holds stages r, r + R, ...) or in a V (rank
// r holds stages r and 2R - 1 - r) and on random stage DAGs placed at random.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule/schedule.h"
#include "schedule_plans.h"

namespace {

using graphpipe::plan::Plan;
using graphpipe::schedule::Instruction;
using graphpipe::schedule::OpKind;
using graphpipe::schedule::Policy;
using graphpipe::schedule::Schedule;
using graphpipe::schedule::ScheduleError;
using graphpipe::testing::placed_chain;
using graphpipe::testing::random_plan;

const std::vector<Policy> kPolicies = {Policy::fill_drain, Policy::one_f_one_b, Policy::one_f_one_b_greedy,
                                       Policy::zb_graph};

std::set<int> stages_on(const Schedule& s, int rank) {
  std::set<int> out;
  for (const Instruction& i : s.ranks[rank]) out.insert(i.stage);
  return out;
}

}  // namespace

TEST(StagesPerRank, LoopingAndVChainsScheduleUnderEveryPolicy) {
  for (const bool v : {false, true}) {
    for (const int ranks : {2, 3}) {
      for (const Policy policy : kPolicies) {
        const Plan plan = placed_chain(ranks, v, 6);
        const Schedule s = graphpipe::schedule::generate(plan, policy);  // validates
        graphpipe::schedule::require_deadlock_free(s);
        ASSERT_EQ(s.num_ranks(), ranks);
        for (int r = 0; r < ranks; ++r) {
          const std::set<int> want = v ? std::set<int>{r, 2 * ranks - 1 - r} : std::set<int>{r, r + ranks};
          EXPECT_EQ(stages_on(s, r), want) << "rank " << r;
        }
      }
    }
  }
}

TEST(StagesPerRank, ALocalEdgeHasNoTransfers) {
  // In a V on 2 ranks, stages 1 and 2 share rank 1: edge 1 (1->2) stays there; edges 0 and 2
  // cross ranks and carry one send and one receive per micro-batch and direction.
  const Plan plan = placed_chain(2, true, 4);
  const Schedule s = graphpipe::schedule::generate(plan, Policy::one_f_one_b);
  EXPECT_FALSE(s.local(0));
  EXPECT_TRUE(s.local(1));
  EXPECT_FALSE(s.local(2));
  std::vector<int> transfers(3, 0);
  for (const auto& program : s.ranks) {
    for (const Instruction& i : program) {
      if (graphpipe::schedule::is_transfer(i.kind)) ++transfers[i.edge];
    }
  }
  EXPECT_EQ(transfers, (std::vector<int>{16, 0, 16}));
  // The text form names the shared rank twice and reads back.
  EXPECT_NE(s.to_string().find("stage ranks: 0 1 1 0"), std::string::npos) << s.to_string();
  EXPECT_EQ(graphpipe::schedule::parse(s.to_string()), s);
}

TEST(StagesPerRank, ARankInterleavesItsStagesWork) {
  // Looping on 2 ranks: rank 0 runs stage 2's first forward before stage 0's last, so the
  // micro-batches flow down the chain while stage 0 still has work (not stage after stage).
  const Plan plan = placed_chain(2, false, 4);
  const Schedule s = graphpipe::schedule::generate(plan, Policy::one_f_one_b);
  long first_of_two = -1, last_of_zero = -1;
  for (std::size_t k = 0; k < s.ranks[0].size(); ++k) {
    const Instruction& i = s.ranks[0][k];
    if (i.kind != OpKind::forward) continue;
    if (i.stage == 2 && first_of_two < 0) first_of_two = static_cast<long>(k);
    if (i.stage == 0) last_of_zero = static_cast<long>(k);
  }
  EXPECT_LT(first_of_two, last_of_zero) << s.compute_table();
}

TEST(StagesPerRank, RandomDagsOnFewerRanksAreDeadlockFree) {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 200; ++trial) {
    Plan plan = random_plan(rng, 9, 6);
    const int S = static_cast<int>(plan.stages.size());
    const int R = std::uniform_int_distribution<int>(1, S)(rng);
    plan.num_devices = R;
    for (auto& stage : plan.stages) stage.devices = {std::uniform_int_distribution<int>(0, R - 1)(rng)};
    for (const Policy policy : kPolicies) {
      const Schedule s = graphpipe::schedule::generate(plan, policy);
      const auto result = graphpipe::schedule::check(s);
      EXPECT_TRUE(result.ok) << "trial " << trial << ": " << result.to_string();
    }
  }
}

TEST(StagesPerRank, AConsumerBeforeItsLocalProducerIsRefused) {
  // Stages 0 and 1 on rank 0, edge 0->1 local: stage 1's forward needs stage 0's first.
  const std::string text =
      "schedule manual: 2 stages, 1 micro-batches, 1 ranks\nstage ranks: 0 0\nedges: 0->1\n"
      "rank 0 | 1F0 0F0 1B0 0B0\n";
  try {
    graphpipe::schedule::parse(text);
    FAIL() << "expected ScheduleError";
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("comes before the forward of micro-batch 0 at stage 0"), std::string::npos)
        << e.what();
  }
}
