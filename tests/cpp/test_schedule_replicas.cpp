// Replicated stages in schedules: each stage's ranks, the replicas' copies of the lead's
// program, the all_reduce instruction, the text and JSON forms, and the row shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule/schedule_json.h"
#include "schedule/shards.h"
#include "schedule_plans.h"

namespace gs = graphpipe::schedule;
using graphpipe::PlanningError;
using graphpipe::testing::chain_plan;

namespace {

// Stage 0 on ranks {0, 1}, stage 1 on rank {2}.
graphpipe::plan::Plan two_by_one(int micro_batches = 3) {
  auto plan = chain_plan(2, micro_batches);
  plan.stages[0].devices = {0, 1};
  plan.stages[1].devices = {2};
  plan.num_devices = 3;
  plan.micro_batch_size = 4;
  plan.batch_size = 4 * micro_batches;
  return plan;
}

std::vector<std::string> tokens(const std::vector<gs::Instruction>& program) {
  std::vector<std::string> out;
  for (const auto& i : program) out.push_back(gs::to_token(i));
  return out;
}

}  // namespace

TEST(ScheduleReplicas, ReplicasRunTheLeadsProgramWithAnAllReduceBeforeTheStep) {
  for (auto policy : {gs::Policy::one_f_one_b, gs::Policy::fill_drain, gs::Policy::one_f_one_b_greedy}) {
    const auto s = gs::generate(two_by_one(), policy);
    EXPECT_EQ(s.stage_ranks, (std::vector<std::vector<int>>{{0, 1}, {2}}));
    EXPECT_EQ(s.ranks[1], s.ranks[0]);
    const auto lead = tokens(s.ranks[0]);
    ASSERT_GE(lead.size(), 2u);
    EXPECT_EQ(lead[lead.size() - 2], "0AR");
    EXPECT_EQ(lead.back(), "0OPT");
    const auto single = tokens(s.ranks[2]);
    EXPECT_EQ(std::count(single.begin(), single.end(), "1AR"), 0);
    EXPECT_TRUE(gs::check(s).ok) << gs::check(s).to_string();
  }
}

TEST(ScheduleReplicas, ValidateRefusesDivergingReplicasAndMisplacedAllReduces) {
  const auto good = gs::generate(two_by_one(), gs::Policy::one_f_one_b);

  auto diverging = good;
  std::swap(diverging.ranks[1][0], diverging.ranks[1][1]);
  try {
    gs::validate(diverging);
    FAIL() << "a replica with its own program was accepted";
  } catch (const gs::ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("must equal that of the stage's lead, rank 0"), std::string::npos) << e.what();
  }

  auto missing = good;
  for (int r : {0, 1}) {
    auto& p = missing.ranks[r];
    p.erase(
        std::remove_if(p.begin(), p.end(), [](const gs::Instruction& i) { return i.kind == gs::OpKind::all_reduce; }),
        p.end());
  }
  try {
    gs::validate(missing);
    FAIL() << "a replicated stage without its all_reduce was accepted";
  } catch (const gs::ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("lacks 0AR"), std::string::npos) << e.what();
  }

  auto single = good;
  auto& p2 = single.ranks[2];
  p2.insert(p2.end() - 1, gs::Instruction{gs::OpKind::all_reduce, 1, -1, -1});
  EXPECT_THROW(gs::validate(single), gs::ScheduleError);

  auto early = good;
  for (int r : {0, 1}) {
    auto& p = early.ranks[r];
    auto ar =
        std::find_if(p.begin(), p.end(), [](const gs::Instruction& i) { return i.kind == gs::OpKind::all_reduce; });
    gs::Instruction moved = *ar;
    p.erase(ar);
    p.insert(p.begin(), moved);
  }
  try {
    gs::validate(early);
    FAIL() << "an all_reduce before the last backward was accepted";
  } catch (const gs::ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("all-reduce"), std::string::npos) << e.what();
  }

  auto shared_rank = two_by_one();
  shared_rank.stages[1].devices = {1};
  EXPECT_THROW(gs::generate(shared_rank, gs::Policy::one_f_one_b), gs::ScheduleError);
}

TEST(ScheduleReplicas, TextAndJsonRoundTripWithReplicas) {
  const auto s = gs::generate(two_by_one(), gs::Policy::one_f_one_b);
  const std::string text = s.to_string();
  EXPECT_NE(text.find("stage ranks: 0,1 2"), std::string::npos) << text;
  EXPECT_EQ(gs::parse(text), s);
  EXPECT_EQ(gs::loads(gs::dumps(s)), s);
  // Schedules written before replicated stages list one integer per stage.
  const auto plain = gs::generate(chain_plan(2, 2), gs::Policy::one_f_one_b);
  auto doc = gs::to_json(plain);
  doc["stage_ranks"] = nlohmann::json::array({0, 1});
  EXPECT_EQ(gs::from_json(doc), plain);
}

TEST(ScheduleShards, RowsSplitLikeTensorSplit) {
  // torch.tensor_split(torch.arange(5), 3) -> [0, 1], [2, 3], [4]
  EXPECT_EQ(gs::shard_rows(5, 3, 0), (gs::RowRange{0, 2}));
  EXPECT_EQ(gs::shard_rows(5, 3, 1), (gs::RowRange{2, 4}));
  EXPECT_EQ(gs::shard_rows(5, 3, 2), (gs::RowRange{4, 5}));
  EXPECT_EQ(gs::shard_rows(8, 1, 0), (gs::RowRange{0, 8}));
  for (std::int64_t rows : {3, 7, 12}) {
    for (int d = 1; d <= 3; ++d) {
      std::int64_t covered = 0;
      for (int i = 0; i < d; ++i) {
        const auto r = gs::shard_rows(rows, d, i);
        EXPECT_EQ(r.begin, covered);
        covered = r.end;
      }
      EXPECT_EQ(covered, rows);
    }
  }
  EXPECT_EQ(gs::overlap(gs::shard_rows(6, 2, 0), gs::shard_rows(6, 3, 1)).size(), 1);  // rows 2..3
  EXPECT_EQ(gs::overlap(gs::shard_rows(6, 2, 0), gs::shard_rows(6, 3, 2)).size(), 0);
  EXPECT_THROW(gs::shard_rows(2, 3, 0), PlanningError);
  EXPECT_THROW(gs::shard_rows(4, 2, 2), PlanningError);
}
