#include <gtest/gtest.h>

#include <random>
#include <string>

#include "schedule/generate.h"
#include "schedule/schedule_json.h"
#include "schedule_plans.h"

using namespace graphpipe::schedule;
using graphpipe::FormatError;
using graphpipe::testing::chain_plan;
using graphpipe::testing::random_plan;

namespace {

template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kTwoStages =
    "schedule manual: 2 stages, 1 micro-batches, 2 ranks\n"
    "stage ranks: 0 1\n"
    "edges: 0->1\n"
    "rank 0 | 0F0 0SF0e0 0RB0e0 0B0 0OPT\n"
    "rank 1 | 1RF0e0 1F0 1B0 1SB0e0\n";

}  // namespace

TEST(Instruction, TokensRoundTrip) {
  for (Instruction i : {Instruction{OpKind::forward, 1, 0, -1}, Instruction{OpKind::backward, 12, 255, -1},
                        Instruction{OpKind::send_activation, 0, 3, 2}, Instruction{OpKind::recv_activation, 1, 3, 2},
                        Instruction{OpKind::send_gradient, 1, 7, 10}, Instruction{OpKind::recv_gradient, 0, 7, 10},
                        Instruction{OpKind::optimizer_step, 4, -1, -1}, Instruction{OpKind::all_reduce, 4, -1, -1}}) {
    EXPECT_EQ(parse_token(to_token(i)), i) << to_token(i);
    EXPECT_EQ(parse_kind_name(kind_name(i.kind)), i.kind);
  }
  EXPECT_EQ(to_token({OpKind::forward, 1, 0, -1}), "1F0");
  EXPECT_EQ(to_token({OpKind::send_activation, 0, 3, 2}), "0SF3e2");
  EXPECT_EQ(to_token({OpKind::optimizer_step, 4, -1, -1}), "4OPT");
}

TEST(Instruction, BadTokensSayWhatIsWrong) {
  EXPECT_NE(error_of([] { parse_token("F0"); }).find("stage number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_token("1X0"); }).find("unknown code 'X'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_token("1F"); }).find("missing micro-batch"), std::string::npos);
  EXPECT_NE(error_of([] { parse_token("1SF0"); }).find("e<edge>"), std::string::npos);
  EXPECT_NE(error_of([] { parse_token("1F0e1"); }).find("trailing 'e1'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_token("1OPT3"); }).find("trailing '3'"), std::string::npos);
  EXPECT_THROW(parse_token("1SF0e"), FormatError);
}

TEST(ScheduleText, HandWrittenTableParses) {
  Schedule s = parse(kTwoStages);
  EXPECT_EQ(s.kind, "manual");
  EXPECT_EQ(s.num_stages(), 2);
  EXPECT_EQ(s.ranks[0].size(), 5u);
  EXPECT_EQ(s.ranks[1][0], (Instruction{OpKind::recv_activation, 1, 0, 0}));
  EXPECT_EQ(parse(s.to_string()), s);
}

TEST(ScheduleText, PrintsAlignedTable) {
  Schedule s = parse(kTwoStages);
  EXPECT_EQ(s.to_string(),
            "schedule manual: 2 stages, 1 micro-batches, 2 ranks\n"
            "stage ranks: 0 1\n"
            "edges: 0->1\n"
            "step   | 0      1      2      3      4\n"
            "rank 0 | 0F0    0SF0e0 0RB0e0 0B0    0OPT\n"
            "rank 1 | 1RF0e0 1F0    1B0    1SB0e0\n");
  EXPECT_EQ(s.compute_table(), "rank 0: F0 B0 OPT\nrank 1: F0 B0\n");
}

TEST(ScheduleText, GeneratedSchedulesRoundTripThroughTextAndJson) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    auto plan = random_plan(rng);
    for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy}) {
      Schedule s = generate(plan, p);
      ASSERT_EQ(parse(s.to_string()), s) << s.to_string();
      ASSERT_EQ(loads(dumps(s)), s);
    }
  }
}

TEST(ScheduleText, MalformedTextIsReportedWithItsLine) {
  EXPECT_NE(error_of([] { parse("schedule x\n"); }).find("line 1"), std::string::npos);
  std::string bad_rank = std::string(kTwoStages) + "rank 7 | 1F0\n";
  EXPECT_NE(error_of([&] { parse(bad_rank); }).find("line 6: rank 7 out of range"), std::string::npos);
  std::string no_edges = "schedule m: 1 stages, 1 micro-batches, 1 ranks\nstage ranks: 0\nrank 0 | 0F0 0B0\n";
  EXPECT_NE(error_of([&] { parse(no_edges); }).find("'edges:'"), std::string::npos);
}

TEST(ScheduleValidate, NamesRankStepAndToken) {
  // The forward of stage 1 runs before the receive of its input.
  std::string text =
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0SF0e0 0RB0e0 0B0\n"
      "rank 1 | 1F0 1RF0e0 1B0 1SB0e0\n";
  EXPECT_EQ(error_of([&] { parse(text); }),
            "rank 1, step 0 (1F0): the forward of micro-batch 0 at stage 1 comes before the "
            "receive of the activation of micro-batch 0 over edge 0 at stage 1 (step 1) that it "
            "needs");
  std::string missing =
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0SF0e0 0RB0e0 0B0\n"
      "rank 1 | 1RF0e0 1F0 1B0\n";
  EXPECT_NE(error_of([&] { parse(missing); }).find("rank 1 lacks 1SB0e0"), std::string::npos);
  std::string wrong_rank =
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0SF0e0 0RB0e0 0B0 1F0\n"
      "rank 1 | 1RF0e0 1F0 1B0 1SB0e0\n";
  EXPECT_NE(error_of([&] { parse(wrong_rank); }).find("rank 0, step 4 (1F0): stage 1 runs on rank 1"),
            std::string::npos);
  std::string wrong_end =
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0 1\nedges: 0->1\n"
      "rank 0 | 0F0 0RF0e0 0RB0e0 0B0\n"
      "rank 1 | 1RF0e0 1F0 1B0 1SB0e0\n";
  EXPECT_NE(error_of([&] { parse(wrong_end); }).find("belongs to stage 1"), std::string::npos);
  std::string shared =
      "schedule manual: 2 stages, 1 micro-batches, 2 ranks\nstage ranks: 0,1 0\nedges: 0->1\n"
      "rank 0 | 0F0\nrank 1 | 0F0\n";
  EXPECT_NE(error_of([&] { parse(shared); }).find("one of them is replicated"), std::string::npos);
  std::string local_transfer =  // stages 0 and 1 share rank 0: their edge has no sends
      "schedule manual: 2 stages, 1 micro-batches, 1 ranks\nstage ranks: 0 0\nedges: 0->1\n"
      "rank 0 | 0F0 0SF0e0 1RF0e0 1F0\n";
  EXPECT_NE(error_of([&] { parse(local_transfer); }).find("on one rank, so its tensors stay there"), std::string::npos);
}

TEST(ScheduleJson, HeaderAndFieldsAreChecked) {
  Schedule s = generate(chain_plan(2, 2), Policy::one_f_one_b);
  auto doc = to_json(s);
  EXPECT_EQ(doc["format"], "graphpipe.schedule");
  EXPECT_EQ(doc["schema_version"], kScheduleSchemaVersion);
  EXPECT_EQ(doc["ranks"][1][0], "1RF0e0");
  auto wrong_version = doc;
  wrong_version["schema_version"] = 99;
  EXPECT_NE(error_of([&] { from_json(wrong_version); }).find("version 99"), std::string::npos);
  auto bad_token = doc;
  bad_token["ranks"][1][2] = "1Q0";
  EXPECT_NE(error_of([&] { from_json(bad_token); }).find("$.ranks[1][2]: bad schedule token"), std::string::npos);
  auto bad_edge = doc;
  bad_edge["edges"][0].erase("dst");
  EXPECT_NE(error_of([&] { from_json(bad_edge); }).find("$.edges[0]: missing field 'dst'"), std::string::npos);
  EXPECT_THROW(loads("{not json"), FormatError);
}

TEST(ScheduleJson, SavesAndLoadsAFile) {
  Schedule s = generate(chain_plan(3, 4), Policy::fill_drain);
  const std::string path = ::testing::TempDir() + "/graphpipe_schedule_test.json";
  save(s, path);
  EXPECT_EQ(load(path), s);
}
