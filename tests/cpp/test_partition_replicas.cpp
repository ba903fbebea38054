// Replicated stages in the planner (docs/design.md, "Replicated stages in the planner"):
// when replication pays and when it does not, the device budget, memory, the sequential
// (PipeDream-style) baseline, manual stage_devices, the plan's JSON and validation, and the
// replica-aware partitioners against an exhaustive search over layouts and replica counts on
// tiny graphs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <string>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/partitioner.h"
#include "partition/placement.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

graph::Node op(const std::string& name, double flops, std::int64_t params, double out_bytes) {
  graph::Node n;
  n.name = name;
  n.op = "call_module";
  n.target = "Op";
  n.module = name;
  n.forward_flops = flops;
  n.param_bytes = params;
  n.output_bytes = out_bytes;
  return n;
}

graph::Node input(const std::string& name) {
  graph::Node n;
  n.name = name;
  n.op = "input";
  n.target = name;
  n.output_bytes = 1e3;
  return n;
}

// x -> heavy: one operator that dominates the model.
graph::OpGraph heavy_operator(std::int64_t params) {
  graph::OpGraph g;
  g.add_node(input("x"));
  g.add_node(op("heavy", 1e12, params, 1e4));
  g.add_edge(0, 1, 1e3);
  g.trace_batch_size = 64;
  return g;
}

// A chain of operators with the given forward FLOPs per sample.
graph::OpGraph chain_of(const std::vector<double>& flops, std::int64_t params) {
  graph::OpGraph g;
  for (std::size_t i = 0; i < flops.size(); ++i) {
    g.add_node(op("c" + std::to_string(i), flops[i], params, 1e5));
    if (i) g.add_edge(static_cast<graph::NodeId>(i - 1), static_cast<graph::NodeId>(i), 1e5);
  }
  g.trace_batch_size = 64;
  return g;
}

pt::Options options(const std::string& partitioner, bool replicate) {
  pt::Options o;
  o.partitioner = partitioner;
  o.replicate = replicate;
  return o;
}

int devices_used(const graphpipe::plan::Plan& plan) {
  int used = 0;
  for (const graphpipe::plan::Stage& st : plan.stages) used += static_cast<int>(st.devices.size());
  return used;
}

const graphpipe::plan::Stage& stage_holding(const graphpipe::plan::Plan& plan, graph::NodeId v) {
  for (const graphpipe::plan::Stage& st : plan.stages) {
    if (std::find(st.nodes.begin(), st.nodes.end(), v) != st.nodes.end()) return st;
  }
  throw std::runtime_error("no stage holds the operator");
}

// V100s whose links are so slow that summing even a small model's gradients costs more than
// any compute it could save.
cost::Devices slow_links(int count) {
  cost::Devices d = cost::v100(count);
  for (auto& row : d.link_bandwidth) std::fill(row.begin(), row.end(), 1e3);
  return d;
}

}  // namespace

TEST(PartitionReplicas, HeavyOperatorGetsEveryDeviceWhenTheAllReduceIsCheap) {
  graph::OpGraph g = heavy_operator(1000);  // 1 kB of parameters: the all-reduce is latency only
  for (const char* name : {"graphpipe", "sequential", "metis"}) {
    graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), options(name, true));
    const graphpipe::plan::Stage& st = stage_holding(plan, 1);
    // METIS keeps its one part per device (here the input's) and hands out the rest.
    EXPECT_EQ(st.devices.size(), std::string(name) == "metis" ? 3u : 4u) << name << ": " << plan.partitioner;
    EXPECT_EQ(devices_used(plan), 4) << name;
    EXPECT_GT(st.all_reduce_seconds, 0.0) << name;
    // A replica computes a quarter of the micro-batch: its forward is about a quarter.
    graphpipe::plan::Plan single = pt::partition(g, cost::v100(1), options(name, false));
    EXPECT_LT(plan.predicted_iteration_seconds, 0.5 * single.predicted_iteration_seconds) << name;
  }
}

TEST(PartitionReplicas, NoReplicationWhenTheAllReduceIsVeryExpensive) {
  graph::OpGraph g = heavy_operator(400000000);  // 400 MB of gradients over 1 kB/s links
  for (const char* name : {"graphpipe", "sequential", "metis"}) {
    pt::Options o = options(name, true);
    o.memory_limit = 1e12;
    graphpipe::plan::Plan plan = pt::partition(g, slow_links(4), o);
    for (const graphpipe::plan::Stage& st : plan.stages) {
      EXPECT_EQ(st.devices.size(), 1u) << name << " replicated stage " << st.id;
      EXPECT_EQ(st.all_reduce_seconds, 0.0) << name;
    }
  }
}

TEST(PartitionReplicas, DevicesStayWithinTheBudgetAndPlansValidate) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    for (auto g : {tst::random_sp_graph(seed, 24), tst::random_dag(seed, 20), tst::random_chain(seed, 16)}) {
      g.trace_batch_size = 16;
      for (int count : {3, 8, 24}) {
        for (const char* name : {"graphpipe", "sequential", "metis"}) {
          graphpipe::plan::Plan plan = pt::partition(g, cost::v100(count, 8), options(name, true));
          EXPECT_LE(devices_used(plan), count) << name << " seed " << seed;
          std::vector<int> seen;
          for (const graphpipe::plan::Stage& st : plan.stages) {
            EXPECT_GE(plan.micro_batch_size, static_cast<std::int64_t>(st.devices.size())) << name;
            EXPECT_EQ(st.all_reduce_seconds > 0.0, st.devices.size() > 1 && st.param_bytes > 0) << name;
            seen.insert(seen.end(), st.devices.begin(), st.devices.end());
          }
          std::sort(seen.begin(), seen.end());
          EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end()) << name << ": a device in two stages";
          EXPECT_NO_THROW(graphpipe::plan::validate_plan(plan, g));
          EXPECT_EQ(tst::check_plan(plan, g, count), "") << name;
        }
      }
    }
  }
}

TEST(PartitionReplicas, ReplicationNeverLosesToOneDevicePerStageOnTheSameLayouts) {
  // With replicate=true the sequential partitioner's candidates include plain data parallelism
  // and its chain with replicas, and every greedy step must not lengthen the predicted step; the
  // graphpipe portfolio keeps the non-replicated chains and down-set layouts (topped up). So on
  // these graphs neither may predict a slower step than without replication by more than the
  // search tolerance.
  for (unsigned seed = 1; seed <= 5; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(seed, 30);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "metis"}) {
      graphpipe::plan::Plan plain = pt::partition(g, cost::v100(8), options(name, false));
      graphpipe::plan::Plan replicated = pt::partition(g, cost::v100(8), options(name, true));
      EXPECT_LE(replicated.predicted_iteration_seconds, plain.predicted_iteration_seconds * 1.01)
          << name << " seed " << seed;
    }
  }
}

TEST(PartitionReplicas, ReplicateOffKeepsOneDevicePerStage) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(seed, 40);
    for (const char* name : {"graphpipe", "sequential", "metis"}) {
      graphpipe::plan::Plan plan = pt::partition(g, cost::v100(8), options(name, false));
      for (const graphpipe::plan::Stage& st : plan.stages) {
        EXPECT_EQ(st.devices, std::vector<int>{st.id}) << name;
        EXPECT_EQ(st.all_reduce_seconds, 0.0) << name;
      }
    }
  }
  // And more devices than operators stays an error without replication, naming the way out.
  graph::OpGraph g = heavy_operator(1000);
  try {
    pt::partition(g, cost::v100(4), options("graphpipe", false));
    FAIL() << "4 devices for 2 operators must be refused without replicate";
  } catch (const gp::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("replicate"), std::string::npos) << e.what();
  }
}

TEST(PartitionReplicas, MemoryLimitIsHonouredAndReplicasShrinkActivations) {
  // Activations dominate: 64 MB per sample out of the heavy operator. One replica of the whole
  // micro-batch cannot hold them; shards can.
  graph::OpGraph g;
  g.add_node(input("x"));
  g.add_node(op("heavy", 1e11, 1000, 64e6));
  g.add_edge(0, 1, 1e3);
  g.trace_batch_size = 8;
  pt::Options o = options("graphpipe", true);
  o.micro_batch_size = 8;
  o.memory_limit = 200e6;  // 8 rows x 64 MB = 512 MB > 200 MB; 2 rows = 128 MB fits
  for (const char* name : {"graphpipe", "sequential", "metis"}) {
    o.partitioner = name;
    graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), o);
    for (const graphpipe::plan::Stage& st : plan.stages) EXPECT_LE(st.memory_bytes, o.memory_limit) << name;
    EXPECT_GE(stage_holding(plan, 1).devices.size(), 3u) << name;
  }
  o.memory_limit = 60e6;  // not even one row fits
  o.partitioner = "graphpipe";
  EXPECT_THROW(pt::partition(g, cost::v100(4), o), gp::PlanningError);
}

TEST(PartitionReplicas, SequentialWithReplicationIsPipeDreamStyle) {
  // A chain with one operator eight times heavier than the rest: a pipeline of one device per
  // stage is bound by it, so it must get the most replicas of a chain that uses the devices.
  graph::OpGraph g = chain_of({1e10, 1e10, 8e10, 1e10, 1e10}, 40000000);
  graphpipe::plan::Plan plain = pt::partition(g, cost::v100(5), options("sequential", false));
  graphpipe::plan::Plan plan = pt::partition(g, cost::v100(8), options("sequential", true));
  EXPECT_TRUE(plan.chain);
  EXPECT_LE(devices_used(plan), 8);
  EXPECT_LT(plan.predicted_iteration_seconds, plain.predicted_iteration_seconds);
  if (plan.stages.size() > 1) {
    const std::size_t heavy = stage_holding(plan, 2).devices.size();
    for (const graphpipe::plan::Stage& st : plan.stages) EXPECT_LE(st.devices.size(), heavy);
  }
  // Stages keep contiguous ranks inside a node (v100 preset: 4 per node).
  for (const graphpipe::plan::Stage& st : plan.stages) {
    for (std::size_t i = 1; i < st.devices.size(); ++i) EXPECT_EQ(st.devices[i], st.devices[i - 1] + 1);
  }
}

TEST(PartitionReplicas, PlainDataParallelismIsACandidate) {
  // Equal operators, 2 kB of parameters: nothing beats every device computing its shard of the
  // whole model (no bubble, no transfers), so both baselines end there.
  graph::OpGraph g = chain_of({1e10, 1e10, 1e10, 1e10}, 500);
  for (const char* name : {"graphpipe", "sequential"}) {
    graphpipe::plan::Plan plan = pt::partition(g, cost::v100(8), options(name, true));
    ASSERT_EQ(plan.stages.size(), 1u) << name << " chose " << plan.partitioner;
    EXPECT_EQ(plan.stages[0].devices.size(), 8u) << name;
  }
}

TEST(PartitionReplicas, PlacementKeepsReplicasInsideANode) {
  cost::Devices d = cost::v100(16, 8);
  // 3 + 5 fill node 0; 6 cannot share with them, so it starts node 1; 2 follows its producer.
  auto placed = pt::place_stages(d, {3, 5, 6, 2}, {{0, 1}, {1, 2}, {2, 3}}, {1.0, 1.0, 1.0});
  EXPECT_EQ(placed[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(placed[1], (std::vector<int>{3, 4, 5, 6, 7}));
  EXPECT_EQ(placed[2], (std::vector<int>{8, 9, 10, 11, 12, 13}));
  EXPECT_EQ(placed[3], (std::vector<int>{14, 15}));
  // A stage wider than a node takes whole free nodes.
  placed = pt::place_stages(d, {2, 8}, {{0, 1}}, {1.0});
  EXPECT_EQ(placed[1], (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_THROW(pt::place_stages(d, {9, 8}, {}, {}), gp::PlanningError);
}

// Placed on the whole budget, a plan's ranks would depend on devices it does not use: the
// partial last node of 52 V100s (8 a node) has 4 ranks, of 53 five, and a stage of 8 that spans
// nodes takes that node whole first. On the plan's first ranks the placement is the same for
// every budget, which is what keeps PipeDream's candidates, and so the sequential planner, never
// slower with more devices.
TEST(PartitionReplicas, PlacementOnTheFirstRanksIgnoresTheRestOfTheBudget) {
  const std::vector<int> replicas{3, 8, 8, 8, 8, 8, 8};  // 51 devices
  std::vector<std::pair<int, int>> edges;
  for (int s = 0; s + 1 < 7; ++s) edges.push_back({s, s + 1});
  const std::vector<double> bytes(edges.size(), 1.0);
  const auto on52 = pt::place_stages(cost::v100(52, 8), replicas, edges, bytes);
  const auto on53 = pt::place_stages(cost::v100(53, 8), replicas, edges, bytes);
  EXPECT_NE(on52.back(), on53.back());  // 4 + 4 across two nodes against 5 + 3
  for (int budget : {51, 52, 53, 64}) {
    EXPECT_EQ(pt::place_stages(cost::v100(budget, 8), replicas, edges, bytes, 51),
              pt::place_stages(cost::v100(51, 8), replicas, edges, bytes))
        << budget;
  }
  EXPECT_THROW(pt::place_stages(cost::v100(64, 8), replicas, edges, bytes, 50), gp::PlanningError);
}

TEST(PartitionReplicas, ManualStageDevices) {
  graph::OpGraph g = chain_of({1e10, 1e10, 1e10}, 1000);
  pt::Options o = options("manual", false);
  o.manual = {{"c0", 0}, {"c1", 1}, {"c2", 1}};
  o.stage_devices = {{0, {2, 0}}};
  graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), o);
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.stages[0].devices, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.stages[1].devices, (std::vector<int>{1}));  // the lowest rank no stage names
  EXPECT_GT(plan.stages[0].all_reduce_seconds, 0.0);
  EXPECT_GE(plan.micro_batch_size, 2);
  auto message = [&](std::map<int, std::vector<int>> devices) {
    o.stage_devices = std::move(devices);
    try {
      pt::partition(g, cost::v100(4), o);
    } catch (const gp::PlanningError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{5, {0}}}).find("stage 5"), std::string::npos);
  EXPECT_NE(message({{0, {}}}).find("no device"), std::string::npos);
  EXPECT_NE(message({{0, {0, 1}}, {1, {1}}}).find("stages 0 and 1 both run on rank 1, and one of them is replicated"),
            std::string::npos);
  EXPECT_NE(message({{0, {0, 0}}}).find("twice"), std::string::npos);
  EXPECT_NE(message({{0, {7}}}).find("device 7"), std::string::npos);
  o.micro_batch_size = 1;
  EXPECT_NE(message({{0, {0, 1}}}).find("stage 0 has 2 devices"), std::string::npos);
  o.micro_batch_size = 0;
  o.partitioner = "graphpipe";
  EXPECT_NE(message({{0, {0, 1}}}).find("manual"), std::string::npos);
}

TEST(PartitionReplicas, JsonRoundTripAndValidation) {
  graph::OpGraph g = chain_of({1e10, 8e10, 1e10}, 4000000);
  pt::Options o = options("manual", false);
  o.manual = {{"c0", 0}, {"c1", 1}, {"c2", 2}};
  o.stage_devices = {{1, {1, 2, 3}}};
  o.micro_batch_size = 4;
  o.batch_size = 16;
  graphpipe::plan::Plan plan = pt::partition(g, cost::v100(5), o);
  ASSERT_EQ(plan.stages[1].devices.size(), 3u);
  ASSERT_GT(plan.stages[1].all_reduce_seconds, 0.0);
  graphpipe::plan::Plan back = graphpipe::plan::loads_plan(graphpipe::plan::dumps(plan, g), g);
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    EXPECT_EQ(back.stages[s].devices, plan.stages[s].devices);
    EXPECT_DOUBLE_EQ(back.stages[s].all_reduce_seconds, plan.stages[s].all_reduce_seconds);
  }
  // A file from before replicated stages has no all_reduce_seconds: it reads as 0.
  auto doc = graphpipe::plan::to_json(plan, g);
  for (auto& st : doc["stages"]) st.erase("all_reduce_seconds");
  EXPECT_EQ(graphpipe::plan::plan_from_json(doc, g).stages[1].all_reduce_seconds, 0.0);
  // Three replicas need at least three rows per micro-batch.
  graphpipe::plan::Plan bad = plan;
  bad.micro_batch_size = 2;
  bad.num_micro_batches = 8;
  try {
    graphpipe::plan::validate_plan(bad, g);
    FAIL() << "a micro-batch of 2 rows cannot feed 3 replicas";
  } catch (const gp::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1 has 3 replicas"), std::string::npos) << e.what();
  }
  bad = plan;
  bad.stages[0].devices = {2};
  EXPECT_THROW(graphpipe::plan::validate_plan(bad, g), gp::PlanningError);  // device 2 given twice
}

namespace {

// Every layout (valid partition into at most k stages) with every replica vector of at most
// `devices` devices in all, each at most the micro-batch's rows: the least predicted step.
double exhaustive_replicated_step(const pt::Problem& p, int k, int devices) {
  double best = std::numeric_limits<double>::infinity();
  tst::for_each_replicated_layout(p, k, devices,
                                  [&](const std::vector<int>& assignment, const std::vector<int>& replicas) {
                                    pt::Evaluation ev = pt::evaluate(p, assignment, replicas);
                                    if (ev.fits()) best = std::min(best, ev.iteration_seconds(p));
                                  });
  return best;
}

}  // namespace

TEST(PartitionReplicas, AgainstExhaustiveSearchOverLayoutsAndReplicaCounts) {
  // Tiny graphs (5-6 operators) on 4 devices at a fixed micro-batch size: the least step over
  // every layout and replica vector bounds every plan from below (the partitioners are judged
  // by the same evaluation), and graphpipe with replication must come close to it.
  constexpr int kDevices = 4;
  double worst = 0.0;
  int compared = 0;
  for (unsigned seed = 1; seed <= 8; ++seed) {
    for (int n : {5, 6}) {
      graph::OpGraph g = seed % 2 ? tst::random_sp_graph(seed, n) : tst::random_chain(seed, n);
      cost::Devices d = cost::v100(kDevices);
      cost::CostModel model(g, d);
      pt::Options o = options("graphpipe", true);
      o.batch_size = 16;
      o.micro_batch_size = 4;
      o.tolerance = 1e-4;
      pt::Problem p = pt::make_problem(model, 16, 4, kDevices, d.memory_bytes, {});
      p.replicas = std::make_shared<const pt::ReplicaTable>(model, 4, kDevices);
      p.device_budget = kDevices;
      const double reference = exhaustive_replicated_step(p, kDevices, kDevices);
      ASSERT_LT(reference, std::numeric_limits<double>::infinity()) << "seed " << seed;
      graphpipe::plan::Plan plan = pt::partition(g, d, o);
      EXPECT_GE(plan.predicted_iteration_seconds, reference * (1.0 - 1e-9)) << "seed " << seed << " n " << n;
      const double gap = plan.predicted_iteration_seconds / reference - 1.0;
      worst = std::max(worst, gap);
      ++compared;
      EXPECT_LE(gap, 0.10) << "seed " << seed << " n " << n << ": graphpipe " << plan.predicted_iteration_seconds
                           << " s, exhaustive " << reference << " s";
    }
  }
  std::printf("graphpipe with replication vs exhaustive (layouts x replica counts): worst gap %.2f%% over %d graphs\n",
              100.0 * worst, compared);
}
