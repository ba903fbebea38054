// The end of a fault-tolerant step (sim/cross_replica_tail.h, cost/cross_replica.h): every rank's
// average across the replicas after its pipeline step, the replicas' agreement, then the
// optimizer steps; the pipeline step itself unchanged; the price of the average; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "common/error.h"
#include "cost/all_reduce.h"
#include "cost/cross_replica.h"
#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"
#include "sim_tasks.h"

namespace cost = graphpipe::cost;
using graphpipe::PlanningError;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::sim::SimOptions;
using graphpipe::sim::SimResult;
using graphpipe::sim::simulate;
using graphpipe::sim::Task;
using graphpipe::sim::TaskKind;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::find_task;
using graphpipe::testing::placed_chain;

namespace {

cost::CrossReplica replicas(int r, double bandwidth, double latency, double coordination) {
  cost::CrossReplica c;
  c.replicas = r;
  c.link_bandwidth = bandwidth;
  c.link_latency = latency;
  c.coordination_seconds = coordination;
  return c;
}

// Two stages of 1 MB and 3 MB of parameters on ranks 0 and 1, memory at 10 MB/s: optimizer
// steps of 0.4 and 1.2 s (4 bytes of traffic per parameter byte).
graphpipe::plan::Plan two_stages() {
  auto plan = chain_plan(2, 2, 1.0, 2.0);
  plan.stages[0].param_bytes = 1e6;
  plan.stages[1].param_bytes = 3e6;
  return plan;
}

cost::Devices slow_memory(int count) {
  auto d = devices(count, 0.0, 1e9);
  d.memory_bandwidth = 1e7;
  return d;
}

}  // namespace

TEST(CrossReplica, PricesARingOverTheReplicasAndTheLoss) {
  // A ring of R: 2 (R - 1) steps of latency + bytes / R / bandwidth, for the gradients and for
  // the 8-byte loss.
  const auto d = devices(2, 0.0, 1e9);
  const auto c = replicas(4, 1e6, 0.01, 0.0);
  const double ring = 6.0 * (0.01 + 1e6 / 4.0 / 1e6), loss = 6.0 * (0.01 + 8.0 / 4.0 / 1e6);
  EXPECT_NEAR(cost::cross_replica_seconds(c, d, 1e6), ring + loss, 1e-12);
  EXPECT_EQ(cost::cross_replica_seconds(replicas(1, 1e6, 0.01, 0.0), d, 1e6), 0.0);
  // Not given, the link is the devices' slowest; their measured collective link where given.
  auto linked = devices(2, 0.002, 5e6);
  EXPECT_NEAR(cost::cross_replica_seconds(replicas(2, 0, 0, 0), linked, 1e6),
              2.0 * (0.002 + 0.5e6 / 5e6) + 2.0 * (0.002 + 4.0 / 5e6), 1e-12);
  linked.collective_bandwidth_bytes_per_second = 1e6;
  linked.collective_latency_seconds = 0.003;
  EXPECT_NEAR(cost::cross_replica_seconds(replicas(2, 0, 0, 0), linked, 1e6),
              2.0 * (0.003 + 0.5e6 / 1e6) + 2.0 * (0.003 + 4.0 / 1e6), 1e-12);
  // A link of its own wins over the measured collective one.
  EXPECT_NEAR(cost::cross_replica_seconds(replicas(2, 2e6, 0, 0), linked, 1e6), 2.0 * 0.25 + 2.0 * (4.0 / 2e6), 1e-12);
}

TEST(CrossReplica, BadFiguresAreRefusedByName) {
  const auto d = devices(2, 0.0, 1e9);
  auto expect_refused = [&](const cost::CrossReplica& c, const std::string& field) {
    try {
      cost::cross_replica_seconds(c, d, 1.0);
      FAIL() << "accepted " << field;
    } catch (const PlanningError& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  expect_refused(replicas(0, 0, 0, 0), "replicas");
  expect_refused(replicas(2, -1, 0, 0), "link_bandwidth");
  expect_refused(replicas(2, 0, 0.1, 0), "link_latency is given without link_bandwidth");
  expect_refused(replicas(2, 1e6, 0, -0.5), "coordination_seconds");
  // One device says nothing of a link: the caller must give one.
  EXPECT_THROW(cost::cross_replica_seconds(replicas(2, 0, 0, 0), devices(1), 1.0), PlanningError);
  EXPECT_GT(cost::cross_replica_seconds(replicas(2, 1e6, 0, 0), devices(1), 1.0), 0.0);
}

TEST(SimulateCrossReplica, EveryRankAveragesThenAllAgreeThenTheOptimizersStep) {
  const auto plan = two_stages();
  const auto d = slow_memory(2);
  const auto sched = generate(plan, Policy::one_f_one_b);
  const SimResult plain = simulate(plan, sched, d);
  SimOptions options;
  options.cross_replica = replicas(2, 1e6, 0.01, 0.5);
  const SimResult ft = simulate(plan, sched, d, options);
  // The pipeline step is the same; the optimizer steps no longer sit inside it.
  for (const char* name : {"F0 s0", "F1 s0", "B0 s1", "B1 s1", "B0 s0", "B1 s0"}) {
    EXPECT_DOUBLE_EQ(find_task(ft, name).start, find_task(plain, name).start) << name;
    EXPECT_DOUBLE_EQ(find_task(ft, name).end, find_task(plain, name).end) << name;
  }
  const Task& x0 = find_task(ft, "XR r0");
  const Task& x1 = find_task(ft, "XR r1");
  EXPECT_EQ(x0.kind, TaskKind::cross_replica);
  // Both start when the pipeline step ends (rank 0's last backward; every rank leaves the step
  // with its closing loss sum), although rank 1 finished earlier.
  EXPECT_LT(find_task(ft, "B1 s1").end, find_task(ft, "B1 s0").end);
  EXPECT_DOUBLE_EQ(x0.start, find_task(ft, "B1 s0").end);
  EXPECT_DOUBLE_EQ(x1.start, x0.start);
  EXPECT_NEAR(x0.end - x0.start, cost::cross_replica_seconds(options.cross_replica, d, 1e6), 1e-12);
  EXPECT_NEAR(x1.end - x1.start, cost::cross_replica_seconds(options.cross_replica, d, 3e6), 1e-12);
  // Rank 1 holds more parameters: its average ends last; the barrier adds the coordination.
  EXPECT_GT(x1.end, x0.end);
  const double barrier = x1.end + 0.5;
  EXPECT_NEAR(find_task(ft, "OPT s0").start, barrier, 1e-12);
  EXPECT_NEAR(find_task(ft, "OPT s1").start, barrier, 1e-12);
  EXPECT_NEAR(find_task(ft, "OPT s0").end - find_task(ft, "OPT s0").start, 0.4, 1e-12);
  EXPECT_NEAR(ft.iteration_seconds, barrier + 1.2, 1e-12);
  EXPECT_GT(ft.iteration_seconds, plain.iteration_seconds);
  // The critical path ends in the slower optimizer step, reached through the barrier.
  const Task& last = ft.tasks[ft.critical_path.back()];
  EXPECT_EQ(graphpipe::sim::task_name(last), "OPT s1");
  EXPECT_EQ(ft.tasks[last.cause].kind, TaskKind::cross_replica);
  // The average counts as communication.
  EXPECT_GT(ft.ranks[0].comm_seconds, plain.ranks[0].comm_seconds);
}

TEST(SimulateCrossReplica, OneReplicaIsThePlainStep) {
  const auto plan = two_stages();
  const auto d = slow_memory(2);
  const auto sched = generate(plan, Policy::one_f_one_b);
  SimOptions options;
  options.cross_replica = replicas(1, 1e6, 0.01, 0.5);
  EXPECT_DOUBLE_EQ(simulate(plan, sched, d, options).iteration_seconds, simulate(plan, sched, d).iteration_seconds);
}

TEST(SimulateCrossReplica, SeveralStagesPerRankStepAllTheirOptimizersAfterTheBarrier) {
  // A V on 2 ranks (rank 0: stages 0 and 3): the list scheduler may put a stage's optimizer step
  // before another stage's last backward; in a fault-tolerant step it delays nothing.
  auto plan = placed_chain(2, true, 4);
  for (auto& st : plan.stages) st.param_bytes = 2e6;
  const auto d = slow_memory(2);
  const auto sched = generate(plan, Policy::zb_graph);
  SimOptions free_optimizer;
  free_optimizer.optimizer_traffic_factor = 0.0;
  const SimResult reference = simulate(plan, sched, d, free_optimizer);
  SimOptions options;
  options.cross_replica = replicas(2, 1e7, 0.0, 0.0);
  const SimResult ft = simulate(plan, sched, d, options);
  double barrier = 0.0;
  for (const Task& t : ft.tasks) {
    if (t.kind == TaskKind::cross_replica) {
      // Each rank averages both of its stages' parameters at once.
      EXPECT_NEAR(t.end - t.start, cost::cross_replica_seconds(options.cross_replica, d, 4e6), 1e-12);
      barrier = std::max(barrier, t.end);
    }
  }
  for (std::size_t k = 0; k < reference.tasks.size(); ++k) {
    const Task& t = ft.tasks[k];
    if (t.kind == TaskKind::optimizer) {
      EXPECT_GE(t.start, barrier - 1e-12);
      EXPECT_NEAR(t.end - t.start, 0.8, 1e-12);
    } else {
      EXPECT_DOUBLE_EQ(t.end, reference.tasks[k].end) << graphpipe::sim::task_name(t);
    }
  }
  // Two optimizer steps of 0.8 s one after the other on each rank.
  EXPECT_NEAR(ft.iteration_seconds, barrier + 1.6, 1e-12);
}

TEST(SimulateCrossReplica, LocalSgdIsRefused) {
  auto plan = chain_plan(1, 2);
  plan.stages[0].devices = {0, 1};
  plan.num_devices = 2;
  plan.micro_batch_size = 2;
  SimOptions options;
  options.cross_replica = replicas(2, 1e6, 0, 0);
  options.sync = cost::SyncMethod{cost::SyncKind::local_sgd, 4.0};
  try {
    simulate(plan, generate(plan, Policy::one_f_one_b), devices(2, 0.0, 1e9), options);
    FAIL() << "local SGD accepted";
  } catch (const PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("local_sgd"), std::string::npos) << e.what();
  }
}

TEST(SimulateCrossReplica, AReplicatedStagesLeadAveragesForItsReplicas) {
  // Stage 0 on ranks 0 and 1 (the simulator replays the lead, rank 0), stage 1 on rank 2: an
  // average on ranks 0 and 2, each of its own stage's bytes; rank 1's figures are rank 0's.
  auto plan = two_stages();
  plan.stages[0].devices = {0, 1};
  plan.stages[1].devices = {2};
  plan.num_devices = 3;
  plan.micro_batch_size = 2;
  const auto d = slow_memory(3);
  SimOptions options;
  options.cross_replica = replicas(3, 1e6, 0.01, 0.0);
  const SimResult ft = simulate(plan, generate(plan, Policy::one_f_one_b), d, options);
  int averages = 0;
  for (const Task& t : ft.tasks) {
    if (t.kind != TaskKind::cross_replica) continue;
    ++averages;
    EXPECT_NE(t.rank, 1);
    const double held = t.rank == 0 ? 1e6 : 3e6;
    EXPECT_NEAR(t.end - t.start, cost::cross_replica_seconds(options.cross_replica, d, held), 1e-12);
  }
  EXPECT_EQ(averages, 2);
  EXPECT_DOUBLE_EQ(ft.ranks[1].comm_seconds, ft.ranks[0].comm_seconds);
}
