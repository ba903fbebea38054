#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"

using namespace graphpipe::sim;
using graphpipe::PlanningError;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::schedule::ScheduleError;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::random_plan;
using graphpipe::testing::stage_plan;

namespace {

std::string path_names(const SimResult& r) {
  std::string out;
  for (int k : r.critical_path) out += (out.empty() ? "" : ", ") + task_name(r.tasks[k]);
  return out;
}

// The critical path is a chain of tasks each starting when the previous ends, from 0 to the end.
void expect_tight_critical_path(const SimResult& r) {
  ASSERT_FALSE(r.critical_path.empty());
  EXPECT_DOUBLE_EQ(r.tasks[r.critical_path.front()].start, 0.0);
  EXPECT_DOUBLE_EQ(r.tasks[r.critical_path.back()].end, r.iteration_seconds);
  for (std::size_t k = 1; k < r.critical_path.size(); ++k) {
    EXPECT_DOUBLE_EQ(r.tasks[r.critical_path[k - 1]].end, r.tasks[r.critical_path[k]].start);
  }
}

}  // namespace

TEST(Simulate, ChainWithFreeCommunicationTakesMPlusSMinusOneSteps) {
  // S equal stages, M micro-batches, f = 1, b = 2, free links: (M + S - 1)(f + b) under both
  // schedules and both communication models: 4 stages, 8 micro-batches -> 11 * 3 = 33 s.
  const int S = 4, M = 8;
  auto plan = chain_plan(S, M, 1.0, 2.0, 1000.0);
  for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy}) {
    for (bool overlap : {true, false}) {
      auto r = simulate(plan, generate(plan, p), devices(S), {overlap});
      EXPECT_DOUBLE_EQ(r.iteration_seconds, (M + S - 1) * 3.0) << policy_name(p) << " " << overlap;
      EXPECT_DOUBLE_EQ(r.samples_per_second, M / 33.0);
      for (const auto& rank : r.ranks) {
        // Every rank computes M (f + b) = 24 of 33 s and waits the rest.
        EXPECT_DOUBLE_EQ(rank.busy_share, 24.0 / 33.0);
        EXPECT_DOUBLE_EQ(rank.comm_share, 0.0);
        EXPECT_NEAR(rank.bubble_share, 9.0 / 33.0, 1e-12);
      }
      expect_tight_critical_path(r);
    }
  }
}

TEST(Simulate, MeasuredRuntimeCostsOfTheDevicesAreCharged) {
  // The devices' measured dispatch cost o per forward and per backward turns f + b into
  // f + b + 2o on every step of the chain, and the step's fixed cost comes on top: 4 stages,
  // 8 micro-batches, o = 0.25 -> 11 * 3.5 = 38.5 s, plus 2 s. Unmeasured (0), neither is charged.
  const int S = 4, M = 8;
  auto plan = chain_plan(S, M, 1.0, 2.0, 1000.0);
  graphpipe::cost::Devices d = devices(S);
  EXPECT_DOUBLE_EQ(simulate(plan, generate(plan, Policy::one_f_one_b), d).iteration_seconds, (M + S - 1) * 3.0);
  d.instruction_overhead_seconds = 0.25;
  d.step_overhead_seconds = 2.0;
  auto r = simulate(plan, generate(plan, Policy::one_f_one_b), d);
  EXPECT_DOUBLE_EQ(r.iteration_seconds, (M + S - 1) * 3.5 + 2.0);
}

TEST(Simulate, TheStepWaitsForItsSlowestRankInProportionToTheBusiestRanksCompute) {
  // A chain of 4 stages, 8 micro-batches of f = 1, b = 2: each rank computes 8 x 3 = 24 s, so a
  // skew of 0.1 adds 2.4 s to the step; on one rank (one stage) nobody is waited for.
  const int S = 4, M = 8;
  auto plan = chain_plan(S, M, 1.0, 2.0, 1000.0);
  graphpipe::cost::Devices d = devices(S);
  const double base = simulate(plan, generate(plan, Policy::one_f_one_b), d).iteration_seconds;
  d.rank_skew_fraction = 0.1;
  EXPECT_DOUBLE_EQ(simulate(plan, generate(plan, Policy::one_f_one_b), d).iteration_seconds, base + 0.1 * M * 3.0);
  EXPECT_DOUBLE_EQ(d.rank_skew_seconds(24.0, S), 2.4);
  // A heavier last stage (b = 6 there): the busiest rank's 8 x 7 s set the wait.
  plan.stages[S - 1].backward_seconds = 6.0;
  graphpipe::cost::Devices unmeasured = devices(S);
  const double heavy = simulate(plan, generate(plan, Policy::one_f_one_b), unmeasured).iteration_seconds;
  EXPECT_DOUBLE_EQ(simulate(plan, generate(plan, Policy::one_f_one_b), d).iteration_seconds, heavy + 0.1 * M * 7.0);
  auto alone = chain_plan(1, M, 1.0, 2.0, 1000.0);
  for (int count : {1, 2}) {  // one rank, and one rank of a description of two (the other idle)
    graphpipe::cost::Devices one = devices(count);
    alone.num_devices = count;
    const auto schedule = generate(alone, Policy::one_f_one_b);
    ASSERT_EQ(schedule.num_ranks(), count);
    const double lone = simulate(alone, schedule, one).iteration_seconds;
    one.rank_skew_fraction = 0.1;
    EXPECT_DOUBLE_EQ(simulate(alone, schedule, one).iteration_seconds, lone) << count << " devices";
  }
}

TEST(Simulate, OneFOneBHoldsStagesToSinkFillDrainHoldsAll) {
  const int S = 4, M = 8;
  auto plan = chain_plan(S, M);
  auto one = simulate(plan, generate(plan, Policy::one_f_one_b), devices(S));
  auto fill = simulate(plan, generate(plan, Policy::fill_drain), devices(S));
  for (int i = 0; i < S; ++i) {
    EXPECT_EQ(one.stages[i].peak_in_flight, S - i) << "stage " << i;
    EXPECT_DOUBLE_EQ(one.stages[i].peak_activation_bytes, (S - i) * 100.0);
    EXPECT_EQ(fill.stages[i].peak_in_flight, M) << "stage " << i;
  }
}

TEST(Simulate, ParallelBranchesBeatTheSameStagesAsAChain) {
  // Branches a (rank 0) and b (rank 1) both feed the join j (rank 2); every stage has f = 1,
  // b = 2, links are free, M = 8. The graph pipeline is two stages deep, so it takes
  // (M + 1)(f + b) = 27 s; the same three stages as a chain a -> b -> j are three deep:
  // (M + 2)(f + b) = 30 s. The graph saves one (f + b) = 3 s.
  const int M = 8;
  auto graph = stage_plan(3, {{0, 2}, {1, 2}}, M);
  auto chain = chain_plan(3, M);
  for (bool overlap : {true, false}) {
    auto g = simulate(graph, generate(graph, Policy::one_f_one_b), devices(3), {overlap});
    auto c = simulate(chain, generate(chain, Policy::one_f_one_b), devices(3), {overlap});
    EXPECT_DOUBLE_EQ(g.iteration_seconds, 27.0);
    EXPECT_DOUBLE_EQ(c.iteration_seconds, 30.0);
    EXPECT_DOUBLE_EQ(c.iteration_seconds - g.iteration_seconds, 3.0);
    // And the branches hold 2 micro-batches where the chain's first stage holds 3.
    EXPECT_EQ(g.stages[0].peak_in_flight, 2);
    EXPECT_EQ(c.stages[0].peak_in_flight, 3);
  }
}

TEST(Simulate, OneMicroBatchOverASlowLink) {
  // f = 1, b = 2, a 0.5 s link each way: F0 s0 [0,1], A0 [1,1.5], F0 s1 [1.5,2.5],
  // B0 s1 [2.5,4.5], G0 [4.5,5], B0 s0 [5,7]: 7 s whatever the communication model.
  auto plan = chain_plan(2, 1, 1.0, 2.0, 1.0);
  for (bool overlap : {true, false}) {
    auto r = simulate(plan, generate(plan, Policy::one_f_one_b), devices(2, 0.5), {overlap});
    EXPECT_DOUBLE_EQ(r.iteration_seconds, 7.0);
    EXPECT_EQ(path_names(r), "F0 s0, A0 e0, F0 s1, B0 s1, G0 e0, B0 s0, OPT s0");
    EXPECT_DOUBLE_EQ(r.ranks[0].comm_seconds, 1.0);
    EXPECT_DOUBLE_EQ(r.ranks[0].busy_seconds, 3.0);
    EXPECT_DOUBLE_EQ(r.ranks[0].bubble_seconds, 3.0);
  }
}

TEST(Simulate, EveryTensorOfAnEdgePaysTheLatency) {
  // As above with three tensors on the edge, each its own send: every transfer takes 3 x 0.5 s,
  // so the iteration is 2 x 1 s longer.
  auto plan = chain_plan(2, 1, 1.0, 2.0, 1.0);
  plan.edges[0].tensors = 3;
  auto r = simulate(plan, generate(plan, Policy::one_f_one_b), devices(2, 0.5));
  EXPECT_DOUBLE_EQ(r.iteration_seconds, 9.0);
}

TEST(Simulate, OverlapHidesTransfersBehindCompute) {
  // Two stages, two micro-batches, f = b = 1, 0.5 s links. 1F1B programs:
  //   rank 0: F0 [SF0] F1 [SF1 RB0] B0 [RB1] B1     rank 1: [RF0] F0 B0 [RF1 SB0] F1 B1 [SB1]
  // Blocking: F0 0-1, A0 1-1.5, F1 1.5-2.5 | F0 1.5-2.5, B0 2.5-3.5, then A1 and G0 both
  // 3.5-4, F1 4-5, B1 5-6, G1 6-6.5; rank 0: B0 4-5, B1 6.5-7.5 -> 7.5 s.
  // Overlapped: F1 runs 1-2 while A0 moves, A1 2-2.5; rank 1: F0 1.5-2.5, B0 2.5-3.5,
  // G0 3.5-4, F1 3.5-4.5, B1 4.5-5.5, G1 5.5-6; rank 0: B0 4-5, B1 6-7 -> 7 s.
  auto plan = chain_plan(2, 2, 1.0, 1.0, 1.0);
  auto schedule = generate(plan, Policy::one_f_one_b);
  auto blocking = simulate(plan, schedule, devices(2, 0.5), {false});
  auto overlapped = simulate(plan, schedule, devices(2, 0.5), {true});
  EXPECT_DOUBLE_EQ(blocking.iteration_seconds, 7.5);
  EXPECT_DOUBLE_EQ(overlapped.iteration_seconds, 7.0);
  EXPECT_EQ(path_names(overlapped), "F0 s0, A0 e0, F0 s1, B0 s1, F1 s1, B1 s1, G1 e0, B1 s0, OPT s0");
  expect_tight_critical_path(blocking);
  expect_tight_critical_path(overlapped);
}

TEST(Simulate, OptimizerStepIsMemoryBound) {
  // 4 x 50 parameter bytes at 100 bytes/s: 2 s after each rank's last backward.
  auto plan = chain_plan(4, 8);
  for (auto& st : plan.stages) st.param_bytes = 50.0;
  auto d = devices(4);
  d.memory_bandwidth = 100.0;
  auto r = simulate(plan, generate(plan, Policy::one_f_one_b), d);
  EXPECT_DOUBLE_EQ(r.iteration_seconds, 35.0);
  EXPECT_EQ(task_name(r.tasks[r.critical_path.back()]), "OPT s0");
}

TEST(Simulate, OptimizerStepPaysItsOptimizersPricePerTensorOfEachStage) {
  // The OptimizerStepIsMemoryBound plan with a measured price per tensor: a stage of three
  // trained tensors (and one frozen) adds 3 x 0.5 s to its step; a stage without shapes, one.
  auto plan = chain_plan(4, 8);
  for (auto& st : plan.stages) st.param_bytes = 50.0;
  plan.stages[0].parameters = {{"a", {5}}, {"b", {5}}, {"c", {2, 1}}, {"frozen", {1}, "float32", 4, false}};
  auto d = devices(4);
  d.memory_bandwidth = 100.0;
  d.optimizer_tensor_seconds = {{"adam", 0.5}, {"sgd", 0.25}};
  const auto steps_of = [&](const SimOptions& options) {
    auto r = simulate(plan, generate(plan, Policy::one_f_one_b), d, options);
    std::vector<double> steps(4, -1.0);
    for (const auto& t : r.tasks) {
      if (t.kind == TaskKind::optimizer) steps[t.stage] = t.end - t.start;
    }
    return std::pair{steps, r};
  };
  // A plan without an optimizer is priced as the planner's default, Adam.
  auto [steps, r] = steps_of({});
  EXPECT_DOUBLE_EQ(steps[0], 2.0 + 1.5);
  EXPECT_DOUBLE_EQ(steps[1], 2.0 + 0.5);
  EXPECT_DOUBLE_EQ(r.iteration_seconds, 35.0 + 1.5);
  EXPECT_EQ(task_name(r.tasks[r.critical_path.back()]), "OPT s0");
  // The plan's optimizer, then the one the options name over it.
  plan.optimizer = "sgd";
  EXPECT_DOUBLE_EQ(steps_of({}).first[0], 2.0 + 0.75);
  SimOptions adam;
  adam.optimizer = graphpipe::cost::Optimizer::adam;
  EXPECT_DOUBLE_EQ(steps_of(adam).first[0], 2.0 + 1.5);
  plan.optimizer = "momentum";  // not measured: its bytes alone
  EXPECT_DOUBLE_EQ(steps_of({}).first[0], 2.0);
}

TEST(Simulate, TaskListDescribesEveryTask) {
  auto plan = chain_plan(3, 4, 1.0, 2.0, 8.0);
  auto r = simulate(plan, generate(plan, Policy::one_f_one_b), devices(3, 0.1));
  // 3 * 4 forwards and backwards, 2 edges * 4 micro-batches * 2 directions, 3 optimizer steps.
  EXPECT_EQ(r.tasks.size(), 24u + 16u + 3u);
  int activations = 0;
  for (const auto& t : r.tasks) {
    EXPECT_LE(t.start, t.end);
    if (t.kind == TaskKind::activation) {
      ++activations;
      EXPECT_EQ(t.peer, t.rank + 1);
      EXPECT_NEAR(t.end - t.start, 0.1, 1e-12);
    }
  }
  EXPECT_EQ(activations, 8);
  EXPECT_NE(r.summary().find("critical path"), std::string::npos);
}

TEST(Simulate, RejectsAScheduleForAnotherPlanOrTooFewDevices) {
  auto plan = chain_plan(3, 4);
  auto other = stage_plan(3, {{0, 2}, {1, 2}}, 4);
  EXPECT_THROW(simulate(plan, generate(other, Policy::one_f_one_b), devices(3)), ScheduleError);
  EXPECT_THROW(simulate(plan, generate(chain_plan(3, 5), Policy::one_f_one_b), devices(3)), ScheduleError);
  EXPECT_THROW(simulate(plan, generate(plan, Policy::one_f_one_b), devices(2)), PlanningError);
}

TEST(Simulate, RandomDagsCompleteAndOverlapNeverHurts) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 500; ++trial) {
    auto plan = random_plan(rng);
    auto d = devices(static_cast<int>(plan.stages.size()), 0.01, 1e4);
    for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy}) {
      auto schedule = generate(plan, p);
      auto blocking = simulate(plan, schedule, d, {false});
      auto overlapped = simulate(plan, schedule, d, {true});
      ASSERT_LE(overlapped.iteration_seconds, blocking.iteration_seconds + 1e-9) << "trial " << trial;
      for (const auto& r : {blocking, overlapped}) {
        for (const auto& rank : r.ranks) ASSERT_LE(rank.busy_seconds, r.iteration_seconds + 1e-9);
        expect_tight_critical_path(r);
        if (p != Policy::fill_drain) {
          auto limits = graphpipe::schedule::in_flight_limits(plan, p);
          for (const auto& st : r.stages) ASSERT_LE(st.peak_in_flight, limits[st.stage]);
        }
      }
    }
  }
}

TEST(Simulate, ThirtyTwoStagesTimesTwoHundredFiftySixMicroBatchesIsFast) {
  auto plan = chain_plan(32, 256, 1e-3, 2e-3, 1e6);
  auto schedule = generate(plan, Policy::one_f_one_b);
  auto d = devices(32, 1e-5, 1e10);
  const auto start = std::chrono::steady_clock::now();
  auto r = simulate(plan, schedule, d);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);  // generous; benchmarks/sim_bench.py measures the real figure
  EXPECT_GT(r.iteration_seconds, (256 + 31) * 3e-3);
}
