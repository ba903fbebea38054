// zb_graph: split backwards (I and W) scheduled so that W's fill the bubbles, on chains (against
// ZB-H1's closed form) and on stage DAGs, within the memory the plan allows.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"

using namespace graphpipe::sim;
namespace gs = graphpipe::schedule;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::random_plan;
using graphpipe::testing::stage_plan;

TEST(ZeroBubble, ChainWithEqualFIWMatchesZbH1) {
  // F = I = W = 1 (a backward of 2, split evenly), free links, no memory limit: ZB-H1's
  // iteration is M (F + I + W) + (p - 1)(F + I - W) = 3M + (p - 1); 1F1B's is (M + p - 1) 3.
  for (auto [p, M] : {std::pair{2, 4}, {4, 8}, {4, 4}, {8, 16}, {6, 24}}) {
    auto plan = chain_plan(p, M, 1.0, 2.0);
    const auto zb = simulate(plan, gs::generate(plan, gs::Policy::zb_graph), devices(p));
    const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(p));
    EXPECT_DOUBLE_EQ(zb.iteration_seconds, 3.0 * M + (p - 1)) << p << " stages, " << M << " micro-batches";
    EXPECT_DOUBLE_EQ(ofob.iteration_seconds, 3.0 * (M + p - 1));
    // ZB-H1's bubble is a third of 1F1B's: (p - 1) against 3 (p - 1) per rank.
    EXPECT_NEAR(zb.ranks[0].bubble_seconds, (p - 1) * 1.0, 1e-9);
    EXPECT_NEAR(ofob.ranks[0].bubble_seconds, (p - 1) * 3.0, 1e-9);
  }
}

namespace {

// The Transformer's 2-stage plan as profiled (ms) at M micro-batches: the first stage's I is
// empty (nothing upstream) and its W its whole backward of 42; the second's backward of 46 splits
// into `input` + `weight`.
graphpipe::plan::Plan transformer_two_stages(int M, double input, double weight) {
  auto plan = chain_plan(2, M, 1.0, 2.0);
  plan.stages[0].forward_seconds = 12.6;
  plan.stages[0].backward_seconds = 42.0;
  plan.stages[0].backward_input_seconds = 0.0;
  plan.stages[0].backward_weight_seconds = 42.0;
  plan.stages[1].forward_seconds = 12.4;
  plan.stages[1].backward_seconds = 46.0;
  plan.stages[1].backward_input_seconds = input;
  plan.stages[1].backward_weight_seconds = weight;
  return plan;
}

// A chain of p equal stages (F = 1, B = 2) at M micro-batches whose every backward splits into
// I = W = `half` (dear where 2 x half > 2).
graphpipe::plan::Plan chain_split(int p, int M, double half) {
  auto plan = chain_plan(p, M, 1.0, 2.0);
  for (auto& st : plan.stages) {
    st.backward_input_seconds = half;
    st.backward_weight_seconds = half;
  }
  return plan;
}

// Per stage, how many whole backwards (B) and weight halves (W) its lead rank runs.
std::vector<std::pair<int, int>> whole_and_weights(const gs::Schedule& s) {
  std::vector<std::pair<int, int>> out(s.num_stages());
  for (int st = 0; st < s.num_stages(); ++st) {
    for (const auto& i : s.ranks[s.lead_rank(st)]) {
      out[st].first += i.kind == gs::OpKind::backward;
      out[st].second += i.kind == gs::OpKind::backward_weight;
    }
  }
  return out;
}

}  // namespace

TEST(ZeroBubble, AFirstStageWhoseBackwardIsAllWeightsDoesNotDrainSlowerThan1F1B) {
  // The Transformer's 2-stage plan as profiled (ms): the first stage's I is empty (nothing
  // upstream), its W is its whole backward; the second's backward splits 28 + 18. Had the first
  // stage's W's waited for its (empty) I's, they would pile up after its last forward, and the
  // zero-bubble iteration would be 8% longer than 1F1B's (the order kept before); with both
  // orders list-scheduled, it is no longer.
  for (int M : {2, 4, 8}) {
    auto plan = transformer_two_stages(M, 28.0, 18.0);
    const auto zb = simulate(plan, gs::generate(plan, gs::Policy::zb_graph), devices(2));
    const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(2));
    EXPECT_LE(zb.iteration_seconds, ofob.iteration_seconds * (1.0 + 1e-12)) << M << " micro-batches";
    if (M >= 4) EXPECT_LT(zb.iteration_seconds, ofob.iteration_seconds) << M << " micro-batches";
  }
}

TEST(ZeroBubble, AStageWhoseSplitDoesNotPayRunsWholeBackwards) {
  // The 2-stage Transformer's shape, its second stage's split 30% dearer than its backward (I +
  // W = 1.3 B): from 4 micro-batches on, splitting it delays the bottleneck stage by more than
  // the earlier I saves, so zb_graph runs it whole (B); never slower than 1F1B; the first stage,
  // whose split is free, still splits.
  for (int M : {2, 4, 8}) {
    auto plan = transformer_two_stages(M, 0.65 * 46.0, 0.65 * 46.0);
    const auto s = gs::generate(plan, gs::Policy::zb_graph);
    ASSERT_TRUE(gs::check(s).ok) << gs::check(s).to_string();
    int whole = 0, split = 0;
    for (const auto& i : s.ranks[s.lead_rank(1)]) {
      whole += i.kind == gs::OpKind::backward;
      split += i.kind == gs::OpKind::backward_input || i.kind == gs::OpKind::backward_weight;
    }
    if (M >= 4) {  // at 2 micro-batches the earlier I still pays on the timeline
      EXPECT_EQ(whole, M) << M << " micro-batches";
      EXPECT_EQ(split, 0) << M << " micro-batches";
    }
    int weights = 0;
    for (const auto& i : s.ranks[s.lead_rank(0)]) weights += i.kind == gs::OpKind::backward_weight;
    EXPECT_EQ(weights, M) << M << " micro-batches";
    const auto zb = simulate(plan, s, devices(2));
    const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(2));
    EXPECT_LE(zb.iteration_seconds, ofob.iteration_seconds * (1.0 + 1e-12)) << M << " micro-batches";
  }
}

TEST(ZeroBubble, ASplitThatCostsALittleMoreStillSplitsWhereItPays) {
  // Four equal stages of a chain, each split 2% dearer than its backward: the earlier I's still
  // shorten the pipeline's fill and drain by more than they cost, so most stages keep I and W
  // (each stage runs all its backwards one way), and the iteration stays below 1F1B's.
  auto plan = chain_split(4, 8, 1.02);
  const auto s = gs::generate(plan, gs::Policy::zb_graph);
  ASSERT_TRUE(gs::check(s).ok) << gs::check(s).to_string();
  int splitting = 0, st = 0;
  for (const auto [whole, weights] : whole_and_weights(s)) {
    EXPECT_TRUE((whole == 8 && weights == 0) || (whole == 0 && weights == 8)) << "stage " << st++;
    splitting += weights == 8;
  }
  EXPECT_GE(splitting, 2);
  const auto zb = simulate(plan, s, devices(4));
  const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(4));
  EXPECT_LT(zb.iteration_seconds, ofob.iteration_seconds);
}

TEST(ZeroBubble, AChainWhereNoSplitPaysRunsWholeBackwardsEverywhere) {
  // 16 equal stages of a chain, 64 micro-batches, each split 30% dearer than its backward: every
  // stage is the bottleneck, so no single stage gains by running whole (tried one by one, every
  // stage stayed split, 12% slower than 1F1B); the generator's first group is all of them at
  // once, which runs 1F1B's order.
  auto plan = chain_split(16, 64, 1.3);
  const auto s = gs::generate(plan, gs::Policy::zb_graph);
  ASSERT_TRUE(gs::check(s).ok) << gs::check(s).to_string();
  int st = 0;
  for (const auto [whole, weights] : whole_and_weights(s)) EXPECT_EQ(whole, 64) << "stage " << st++;
  const auto zb = simulate(plan, s, devices(16));
  const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(16));
  EXPECT_LE(zb.iteration_seconds, ofob.iteration_seconds * (1.0 + 1e-12));
}

TEST(ZeroBubble, EveryMicroBatchIsSplitAndTheScheduleCannotHang) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    auto plan = random_plan(rng);
    const auto s = gs::generate(plan, gs::Policy::zb_graph);
    ASSERT_TRUE(gs::check(s).ok) << gs::check(s).to_string();
    for (int st = 0; st < s.num_stages(); ++st) {
      int inputs = 0, weights = 0, whole = 0;
      for (const auto& i : s.ranks[s.lead_rank(st)]) {
        inputs += i.kind == gs::OpKind::backward_input;
        weights += i.kind == gs::OpKind::backward_weight;
        whole += i.kind == gs::OpKind::backward;
      }
      EXPECT_EQ(inputs, plan.num_micro_batches);
      EXPECT_EQ(weights, plan.num_micro_batches);
      EXPECT_EQ(whole, 0);
    }
    const auto r = simulate(plan, s, devices(plan.num_devices, 0.01, 1e5));
    // Never longer than doing every stage's work one after another on one rank.
    double serial = 0.0;
    for (const auto& st : plan.stages) serial += plan.num_micro_batches * (st.forward_seconds + st.backward_seconds);
    EXPECT_LE(r.iteration_seconds, serial + 2 * plan.num_micro_batches * 0.02 * plan.edges.size() + 1e-9);
  }
}

TEST(ZeroBubble, ParallelBranchesFillTheirBubblesWithWeights) {
  // A fork-join: 0 -> {1, 2, 3} -> 4, the branch 2 twice as slow. The graph-aware zero-bubble
  // schedule beats the graph-aware 1F1B on the same plan.
  auto plan = stage_plan(5, {{0, 1}, {0, 2}, {0, 3}, {1, 4}, {2, 4}, {3, 4}}, 8);
  plan.stages[2].forward_seconds = 2.0;
  plan.stages[2].backward_seconds = 4.0;
  const auto zb = simulate(plan, gs::generate(plan, gs::Policy::zb_graph), devices(5));
  const auto ofob = simulate(plan, gs::generate(plan, gs::Policy::one_f_one_b), devices(5));
  EXPECT_LT(zb.iteration_seconds, ofob.iteration_seconds);
}

TEST(ZeroBubble, MemoryLimitBoundsTheMicroBatchesHeldUntilTheirW) {
  // 100 bytes of activations per micro-batch, 1000 static bytes: a 1,250-byte limit lets a
  // stage hold 2 micro-batches until their W (at least 1F1B's limit), one of 1,450 bytes 4.
  for (double limit : {1250.0, 1450.0}) {
    auto plan = chain_plan(4, 8, 1.0, 2.0);
    plan.memory_limit_bytes = limit;
    for (auto& st : plan.stages) st.static_bytes = 1000.0;
    const auto s = gs::generate(plan, gs::Policy::zb_graph);
    const auto r = simulate(plan, s, devices(4));
    const auto h = gs::in_flight_limits(plan, gs::Policy::one_f_one_b);
    const int allowed = static_cast<int>((limit - 1000.0) / 100.0);
    for (int st = 0; st < 4; ++st) {
      EXPECT_LE(r.stages[st].peak_in_flight, std::max(h[st], allowed)) << "stage " << st << ", limit " << limit;
    }
  }
}

TEST(ZeroBubble, TokensRoundTrip) {
  for (const char* token : {"1I0", "3W12"}) EXPECT_EQ(gs::to_token(gs::parse_token(token)), token);
  auto plan = chain_plan(3, 4);
  const auto s = gs::generate(plan, "zb_graph");
  EXPECT_EQ(gs::parse(s.to_string()), s);
}

TEST(ZeroBubble, BackwardSplitUsesTheStagesOwnHalves) {
  graphpipe::plan::Stage st;
  st.forward_seconds = 1.0;
  st.backward_seconds = 2.0;
  // Not priced (a plan from before the halves were): half of the backward each.
  EXPECT_EQ(gs::backward_split(st), (std::pair{1.0, 1.0}));
  // A recomputed stage's backward holds its forward again, which I runs first.
  st.recompute = true;
  st.backward_seconds = 3.0;
  EXPECT_EQ(gs::backward_split(st), (std::pair{2.0, 1.0}));
  // Priced: the stage's own figures, whatever their sum (W walks activation gradients again).
  st.backward_input_seconds = 0.25;
  st.backward_weight_seconds = 3.5;
  EXPECT_EQ(gs::backward_split(st), (std::pair{0.25, 3.5}));
  // A stage whose I runs nothing (it receives no tensor that needs a gradient).
  st.backward_input_seconds = 0.0;
  EXPECT_EQ(gs::backward_split(st), (std::pair{0.0, 3.5}));
}

TEST(ZeroBubble, SimulatedHalvesTakeEachStagesFigures) {
  // A chain of 3 stages with different I and W each; on stage 1 I + W (2.5) is above its
  // backward (2), and that split does not pay: stage 1 runs whole backwards of 2.
  auto plan = chain_plan(3, 6);
  const std::vector<std::pair<double, double>> halves = {{0.0, 2.0}, {0.75, 1.75}, {1.5, 0.5}};
  for (int s = 0; s < 3; ++s) {
    plan.stages[s].backward_input_seconds = halves[s].first;
    plan.stages[s].backward_weight_seconds = halves[s].second;
  }
  const auto r = simulate(plan, gs::generate(plan, gs::Policy::zb_graph), devices(3));
  int inputs = 0, weights = 0, whole = 0;
  for (const auto& task : r.tasks) {
    if (task.kind == TaskKind::backward_input) {
      ++inputs;
      EXPECT_DOUBLE_EQ(task.end - task.start, halves[task.stage].first) << task_name(task);
    } else if (task.kind == TaskKind::backward_weight) {
      ++weights;
      EXPECT_DOUBLE_EQ(task.end - task.start, halves[task.stage].second) << task_name(task);
    } else if (task.kind == TaskKind::backward) {
      ++whole;
      EXPECT_EQ(task.stage, 1) << task_name(task);
      EXPECT_DOUBLE_EQ(task.end - task.start, 2.0) << task_name(task);
    }
  }
  EXPECT_EQ(inputs, 2 * 6);
  EXPECT_EQ(weights, 2 * 6);
  EXPECT_EQ(whole, 6);
  // Every rank computes M (F + its backward): stage 1's whole backward of 2, not I + W = 2.5.
  EXPECT_NEAR(r.ranks[1].busy_seconds, 6 * (1.0 + 2.0), 1e-9);
  EXPECT_NEAR(r.ranks[2].busy_seconds, 6 * (1.0 + 2.0), 1e-9);
  EXPECT_GE(r.iteration_seconds, 6 * 3.0);
}
