// The simulator with sync methods (sim/simulate.h, cost/sync_cost.h): local SGD's averaging after
// the optimizer step and its amortised iteration, top-k's compression tasks before smaller
// collectives, the plan's method as the default, and PowerSGD's need for parameter shapes.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "cost/all_reduce.h"
#include "cost/gradient_buckets.h"
#include "cost/sync_cost.h"
#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"

using namespace graphpipe::sim;
namespace cost = graphpipe::cost;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;

namespace {

const Task* find(const SimResult& r, const std::string& name) {
  for (const auto& t : r.tasks) {
    if (task_name(t) == name) return &t;
  }
  return nullptr;
}

// One stage on ranks {0, 1}, two micro-batches, f = 1, b = 2 (F0 [0, 1], B0 [1, 3], F1 [3, 4],
// B1 [4, 6]), 4 MiB of float32 gradients in one parameter, 100 MB/s links.
graphpipe::plan::Plan replicated_stage() {
  auto plan = chain_plan(1, 2, 1.0, 2.0);
  plan.stages[0].devices = {0, 1};
  plan.num_devices = 2;
  plan.micro_batch_size = 2;
  plan.stages[0].param_bytes = 4 * cost::kFirstBucketBytes;
  plan.stages[0].parameters = {{"w", {1024, 1024}, "float32", 4, true}};
  return plan;
}

SimResult run(const graphpipe::plan::Plan& plan, std::optional<cost::SyncMethod> sync, bool sync_step = true) {
  SimOptions o;
  o.sync = sync;
  o.sync_step = sync_step;
  return simulate(plan, generate(plan, Policy::one_f_one_b), devices(2, 0.0, 1e8), o);
}

cost::SyncMethod local_sgd(double period) {
  cost::SyncMethod m;
  m.kind = cost::SyncKind::local_sgd;
  m.period = period;
  return m;
}

}  // namespace

TEST(SimulateSync, CollectivesBesideTheBackwardCostTheRankTheirOverlapLoss) {
  // Two buckets (3 MiB, then 1 MiB: w2 fills DDP's first bucket on its own): the first's sum
  // runs beside the last backward, the second's after it. On devices whose collectives share
  // the compute's cores the rank goes on later by loss x the first's collective; with one bucket
  // nothing runs beside the backward and the loss costs nothing.
  auto plan = replicated_stage();
  plan.stages[0].parameters = {{"w1", {512, 512}, "float32", 4, true}, {"w2", {768, 1024}, "float32", 4, true}};
  auto step = [](const graphpipe::plan::Plan& p, double loss) {
    auto d = devices(2, 0.0, 1e8);
    d.collective_overlap_loss = loss;
    return simulate(p, generate(p, Policy::one_f_one_b), d, SimOptions{}).iteration_seconds;
  };
  const double free = step(plan, 0.0);
  const double once = step(plan, 1.0) - free;
  EXPECT_GT(once, 0.0);
  EXPECT_NEAR(step(plan, 2.0) - free, 2.0 * once, 1e-12);
  // The first bucket's collective alone: 3 MiB of the 4 MiB the AR task sums past the backward.
  auto d = devices(2, 0.0, 1e8);
  const SimResult r = simulate(plan, generate(plan, Policy::one_f_one_b), d, SimOptions{});
  const Task* ar = find(r, "AR s0");
  ASSERT_NE(ar, nullptr);
  EXPECT_LT(once, ar->end - ar->start);
  auto one_bucket = replicated_stage();
  EXPECT_DOUBLE_EQ(step(one_bucket, 1.0), step(one_bucket, 0.0));
}

TEST(SimulateSync, LocalSgdAveragesAfterTheOptimizerStep) {
  const auto plan = replicated_stage();
  const double average = cost::ring_all_reduce(devices(2, 0.0, 1e8), {0, 1}, 4 * cost::kFirstBucketBytes).seconds;
  ASSERT_GT(average, 0.01);
  // A local step: no exchange at all, the iteration ends with the last backward (the optimizer
  // step is free on these devices).
  const SimResult local = run(plan, local_sgd(4.0), false);
  EXPECT_DOUBLE_EQ(local.iteration_seconds, 6.0);
  EXPECT_EQ(find(local, "AVG s0"), nullptr);
  ASSERT_NE(find(local, "AR s0"), nullptr);
  EXPECT_EQ(find(local, "AR s0")->end - find(local, "AR s0")->start, 0.0);
  // A step that averages: the all-reduce of the parameters runs after OPT, not overlapped.
  const SimResult sync = run(plan, local_sgd(4.0), true);
  const Task* avg = find(sync, "AVG s0");
  ASSERT_NE(avg, nullptr);
  EXPECT_DOUBLE_EQ(avg->start, find(sync, "OPT s0")->end);
  EXPECT_NEAR(avg->end - avg->start, average, 1e-12);
  EXPECT_NEAR(sync.iteration_seconds, 6.0 + average, 1e-12);
  EXPECT_EQ(sync.critical_path.back(), static_cast<int>(avg - sync.tasks.data()));
  // Amortised over the period either way; the throughput is per amortised iteration.
  for (const SimResult* r : {&local, &sync}) {
    EXPECT_NEAR(r->amortized_iteration_seconds, 6.0 + average / 4.0, 1e-12);
    EXPECT_NEAR(r->samples_per_second, r->samples / r->amortized_iteration_seconds, 1e-9);
  }
  EXPECT_GT(sync.ranks[0].comm_seconds, 0.0);
}

TEST(SimulateSync, LocalSgdLowersTheAmortisedIterationAndPeriodOneAveragesEveryStep) {
  const auto plan = replicated_stage();
  const SimResult all = run(plan, std::nullopt);  // the plan's method: the all-reduce
  EXPECT_EQ(all.sync, cost::SyncMethod{});
  EXPECT_EQ(all.amortized_iteration_seconds, all.iteration_seconds);
  const SimResult h4 = run(plan, local_sgd(4.0));
  EXPECT_LT(h4.amortized_iteration_seconds, all.iteration_seconds);
  // Period 1: the parameters' all-reduce every step, after the optimizer step: the local step
  // plus one all-reduce of the parameter bytes. With one bucket (one 4 MiB parameter), final
  // only at the end of the backward, and a free optimizer step, that is what summing the
  // gradients costs.
  const SimResult h1 = run(plan, local_sgd(1.0));
  const double average = cost::ring_all_reduce(devices(2, 0.0, 1e8), {0, 1}, 4 * cost::kFirstBucketBytes).seconds;
  EXPECT_NEAR(h1.amortized_iteration_seconds, 6.0 + average, 1e-12);
  EXPECT_DOUBLE_EQ(h1.amortized_iteration_seconds, h1.iteration_seconds);
  EXPECT_NEAR(h1.iteration_seconds, all.iteration_seconds, 1e-12);
}

TEST(SimulateSync, TopKCompressesEachBucketBeforeItsSmallerCollectives) {
  auto plan = replicated_stage();
  plan.stages[0].parameters = {{"a", {512, 1024}, "float32", 4, true}, {"b", {512, 1024}, "float32", 4, true}};
  cost::SyncMethod m;
  m.kind = cost::SyncKind::top_k;
  m.ratio = 0.01;
  auto d = devices(2, 0.0, 1e8);
  d.memory_bandwidth = 1e9;
  SimOptions o;
  o.sync = m;
  const SimResult r = simulate(plan, generate(plan, Policy::one_f_one_b), d, o);
  // Two buckets (b, then a: 2 MiB each, the first reaches the cap); each is compressed once its
  // gradients are final, halfway and at the end of B1 [4, 6].
  const Task* c0 = find(r, "C0 s0");
  const Task* c1 = find(r, "C1 s0");
  const Task* ar = find(r, "AR s0");
  ASSERT_TRUE(c0 && c1 && ar);
  const cost::SyncCost priced =
      cost::stage_sync_cost(m, d, {0, 1}, plan.stages[0].parameters, 0.0, cost::kDefaultBucketBytes);
  ASSERT_EQ(priced.buckets.size(), 2u);
  EXPECT_DOUBLE_EQ(c0->start, 5.0);
  EXPECT_NEAR(c0->end - c0->start, priced.buckets[0].compute_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(c1->start, 6.0);
  EXPECT_DOUBLE_EQ(ar->start, c0->end);
  EXPECT_NEAR(ar->end, c1->end + priced.buckets[1].comm_seconds, 1e-12);
  // The gathered entries are a small fraction of the all-reduce's bytes.
  const cost::SyncCost summed =
      cost::stage_sync_cost(cost::SyncMethod{}, d, {0, 1}, plan.stages[0].parameters, 0.0, cost::kDefaultBucketBytes);
  EXPECT_LT(10.0 * priced.comm_seconds, summed.comm_seconds);
  // The compression is compute on the rank (the first bucket's overlaps the backward: only the
  // last one's adds to the busy time).
  SimOptions plain;
  const SimResult all = simulate(plan, generate(plan, Policy::one_f_one_b), d, plain);
  EXPECT_NEAR(r.ranks[0].busy_seconds - all.ranks[0].busy_seconds, priced.buckets[1].compute_seconds, 1e-9);
}

TEST(SimulateSync, ThePlansMethodIsTheDefaultAndPowerSgdNeedsShapes) {
  auto plan = replicated_stage();
  plan.sync = local_sgd(2.0);
  const SimResult r = run(plan, std::nullopt);
  EXPECT_EQ(r.sync, plan.sync);
  EXPECT_NE(find(r, "AVG s0"), nullptr);
  plan.stages[0].parameters.clear();
  cost::SyncMethod psgd;
  psgd.kind = cost::SyncKind::power_sgd;
  EXPECT_THROW(run(plan, psgd), graphpipe::PlanningError);
  psgd.rank = 0;
  EXPECT_THROW(run(replicated_stage(), psgd), graphpipe::PlanningError);
}
