// A host CPU shared by all ranks (sim/host_contention.h, SimOptions::host_cores): the busy-rank
// measure on a timeline, and processor sharing in the simulator, checked where its answer is
// known in closed form.
#include <gtest/gtest.h>

#include <random>

#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/host_contention.h"
#include "sim/simulate.h"

namespace sim = graphpipe::sim;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::random_plan;
using graphpipe::testing::stage_plan;

TEST(HostContention, MeanBusyRanksCountsEachRankOnce) {
  // Rank 0 busy over [0, 4) (two overlapping demands), rank 1 over [2, 6), a transfer between
  // ranks 2 and 3 over [3, 5).
  std::vector<sim::CpuDemand> demands{{0, 3, 0, -1}, {1, 4, 0, -1}, {2, 6, 1, -1}, {3, 5, 2, 3}, {7, 7, 0, -1}};
  auto busy = sim::mean_busy_ranks(demands, 4);
  // [0, 3): rank 0 alone on [0, 2), ranks 0 and 1 on [2, 3): (2 + 2) / 3.
  EXPECT_NEAR(busy[0], 4.0 / 3.0, 1e-12);
  // [1, 4): 1 on [1, 2), 2 on [2, 3), 4 on [3, 4): 7 / 3.
  EXPECT_NEAR(busy[1], 7.0 / 3.0, 1e-12);
  // [2, 6): 2 on [2, 3), 4 on [3, 4), 3 on [4, 5), 1 on [5, 6): 10 / 4.
  EXPECT_NEAR(busy[2], 10.0 / 4.0, 1e-12);
  // [3, 5): 4 on [3, 4), 3 on [4, 5).
  EXPECT_NEAR(busy[3], 3.5, 1e-12);
  EXPECT_EQ(busy[4], 0.0);  // empty interval
}

TEST(HostContention, EnoughCoresChangeNothing) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    auto plan = random_plan(rng);
    const int S = static_cast<int>(plan.stages.size());
    auto schedule = generate(plan, Policy::one_f_one_b);
    sim::SimOptions alone;
    alone.task_overhead_seconds = 0.3;
    sim::SimOptions shared = alone;
    shared.host_cores = S;  // a core per rank
    shared.host_runs_compute = true;
    const auto a = sim::simulate(plan, schedule, devices(S), alone);
    const auto b = sim::simulate(plan, schedule, devices(S), shared);
    EXPECT_DOUBLE_EQ(a.iteration_seconds, b.iteration_seconds) << "trial " << trial;
  }
}

TEST(HostContention, TwoIndependentStagesOnOneCoreTakeTwiceAsLong) {
  // Two stages with no edge between them run side by side; on one shared core each gets half.
  const int M = 6;
  auto plan = stage_plan(2, {}, M, 1.0, 2.0);
  auto schedule = generate(plan, Policy::one_f_one_b);
  sim::SimOptions alone;
  const double own = sim::simulate(plan, schedule, devices(2), alone).iteration_seconds;
  EXPECT_DOUBLE_EQ(own, M * 3.0);
  sim::SimOptions shared;
  shared.host_cores = 1;
  shared.host_runs_compute = true;
  EXPECT_NEAR(sim::simulate(plan, schedule, devices(2), shared).iteration_seconds, 2.0 * own, 0.01 * own);
  // Emulated compute takes no core: only the dispatch overhead is shared.
  shared.host_runs_compute = false;
  shared.task_overhead_seconds = 0.5;
  alone.task_overhead_seconds = 0.5;
  const double with_overhead = sim::simulate(plan, schedule, devices(2), alone).iteration_seconds;
  const double contended = sim::simulate(plan, schedule, devices(2), shared).iteration_seconds;
  EXPECT_GT(contended, with_overhead);
  EXPECT_LT(contended, with_overhead + 2 * M * 0.5 + 1e-9);  // at most the overhead once more
}

TEST(HostContention, AChainContendsLessThanParallelStages) {
  // Four stages: as a chain (one after another in the fill and drain) and as a fork-join of
  // two parallel middle stages. On two shared cores the chain's stretch is smaller.
  const int M = 8;
  auto chain = chain_plan(4, M, 1.0, 2.0);
  auto fork = stage_plan(4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}}, M, 1.0, 2.0);
  sim::SimOptions alone;
  alone.host_runs_compute = true;
  sim::SimOptions shared = alone;
  shared.host_cores = 2;
  auto ratio = [&](const graphpipe::partition::Plan& plan) {
    auto schedule = generate(plan, Policy::one_f_one_b);
    return sim::simulate(plan, schedule, devices(4), shared).iteration_seconds /
           sim::simulate(plan, schedule, devices(4), alone).iteration_seconds;
  };
  const double chain_ratio = ratio(chain), fork_ratio = ratio(fork);
  EXPECT_GT(chain_ratio, 1.0);
  EXPECT_GT(fork_ratio, 1.0);
  EXPECT_LE(fork_ratio, 2.0 + 1e-9);  // 4 ranks on 2 cores: at most twice as long
  EXPECT_LT(chain_ratio, fork_ratio);  // 1.55 and 1.69 when written
}

TEST(HostContention, NegativeCoresAreRejected) {
  auto plan = chain_plan(2, 2);
  sim::SimOptions options;
  options.host_cores = -1;
  EXPECT_THROW(sim::simulate(plan, generate(plan, Policy::one_f_one_b), devices(2), options),
               graphpipe::PlanningError);
}
