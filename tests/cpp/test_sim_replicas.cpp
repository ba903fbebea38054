// The simulator on replicated stages: the gradient all-reduce in buckets that start during the
// last backward, the per-pair shares of a re-sharded edge, and replicas' figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cost/all_reduce.h"
#include "cost/gradient_buckets.h"
#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"
#include "sim_tasks.h"

using namespace graphpipe::sim;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::find_task;

TEST(SimulateReplicas, AllReduceBucketsStartDuringTheLastBackward) {
  // One stage on ranks {0, 1}, two micro-batches, f = 1, b = 2, 4 MiB of gradients (no shapes):
  // DDP's buckets, a first one of 1 MiB, then the other 3 MiB in one (under the 25 MiB cap),
  // summed in `first` and `rest` seconds (rings of two over 1 MB/s links). Program: F0 B0 F1 B1
  // AR OPT; B1 runs [4, 6]; the first bucket is ready a quarter of the way, at 4.5, the second
  // at B1's end.
  auto plan = chain_plan(1, 2, 1.0, 2.0);
  plan.stages[0].devices = {0, 1};
  plan.num_devices = 2;
  plan.micro_batch_size = 2;
  const double mib = graphpipe::cost::kFirstBucketBytes;
  plan.stages[0].param_bytes = 4 * mib;
  const auto d = devices(2, 0.0, 1e6);
  const double first = graphpipe::cost::ring_all_reduce(d, {0, 1}, mib).seconds;
  const double rest = graphpipe::cost::ring_all_reduce(d, {0, 1}, 3 * mib).seconds;
  ASSERT_GT(first, 0.5);
  const auto r = simulate(plan, generate(plan, Policy::one_f_one_b), d);
  const Task& b1 = find_task(r, "B1 s0");
  const Task& ar = find_task(r, "AR s0");
  EXPECT_DOUBLE_EQ(b1.start, 4.0);  // after F0 [0, 1], B0 [1, 3], F1 [3, 4]
  EXPECT_DOUBLE_EQ(ar.start, b1.start + 0.5);
  EXPECT_LT(ar.start, b1.end);  // the sum overlaps the backward
  EXPECT_NEAR(ar.end, std::max(ar.start + first, b1.end) + rest, 1e-9);
  EXPECT_NEAR(r.iteration_seconds, ar.end, 1e-9);  // the optimizer step is free here
  // The replica's figures are its lead's.
  EXPECT_DOUBLE_EQ(r.ranks[1].busy_seconds, r.ranks[0].busy_seconds);
  EXPECT_EQ(r.ranks[1].stage, 0);
  EXPECT_GT(r.ranks[0].comm_seconds, 0.0);
}

TEST(SimulateReplicas, ReplicatedEdgesMoveEachPairsShareAtOnce) {
  // 4 MB per micro-batch over 1 MB/s links: 4 s between single stages; 2 x 2 replicas move 2 MB
  // per pair, side by side, in 2 s; one sender feeding two replicas sends 2 MB to each in turn.
  auto single = chain_plan(2, 1, 1.0, 1.0, 4e6);
  single.micro_batch_size = 4;
  auto r1 = simulate(single, generate(single, Policy::one_f_one_b), devices(4, 0.0, 1e6));
  EXPECT_DOUBLE_EQ(find_task(r1, "A0 e0").end - find_task(r1, "A0 e0").start, 4.0);

  auto pairs = single;
  pairs.stages[0].devices = {0, 1};
  pairs.stages[1].devices = {2, 3};
  pairs.num_devices = 4;
  auto r2 = simulate(pairs, generate(pairs, Policy::one_f_one_b), devices(4, 0.0, 1e6));
  EXPECT_DOUBLE_EQ(find_task(r2, "A0 e0").end - find_task(r2, "A0 e0").start, 2.0);
  EXPECT_DOUBLE_EQ(find_task(r2, "G0 e0").end - find_task(r2, "G0 e0").start, 2.0);

  auto fan = single;
  fan.stages[1].devices = {1, 2};
  fan.num_devices = 3;
  auto r3 = simulate(fan, generate(fan, Policy::one_f_one_b), devices(3, 0.0, 1e6));
  EXPECT_DOUBLE_EQ(find_task(r3, "A0 e0").end - find_task(r3, "A0 e0").start, 4.0);
}
