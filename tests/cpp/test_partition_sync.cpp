// The planner with sync methods (Options::sync; docs/design.md, "Pricing the sync methods"):
// cheaper methods buy replicas the all-reduce cannot, the plan's figures are the pricing's,
// the plan carries its method through JSON, the stage parameters come in the runtime's order,
// and PowerSGD refuses a graph without parameter shapes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "cost/presets.h"
#include "cost/sync_cost.h"
#include "partition/partitioner.h"
#include "plan/plan_io.h"
#include "plan/stage_parameters.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;

namespace {

graph::Node input() {
  graph::Node n;
  n.name = "x";
  n.op = "input";
  n.target = "x";
  n.output_bytes = 1e3;
  n.is_input = true;
  return n;
}

// x -> heavy: one operator that dominates the model, holding a rows x cols weight (with its
// shape unless `shapes` is false).
graph::OpGraph heavy_operator(std::int64_t rows, std::int64_t cols, bool shapes = true) {
  graph::OpGraph g;
  g.add_node(input());
  graph::Node n;
  n.name = "heavy";
  n.op = "call_module";
  n.target = "Linear";
  n.module = "heavy";
  n.forward_flops = 1e12;
  n.output_bytes = 1e4;
  n.params = {"heavy.weight"};
  n.param_bytes = rows * cols * 4;
  if (shapes) n.param_shapes = {{"heavy.weight", {rows, cols}, "float32", 4, true}};
  n.is_output = true;
  g.add_node(n);
  g.add_edge(0, 1, 1e3);
  g.trace_batch_size = 64;
  return g;
}

// V100s whose links move 1 MB/s: summing 400 MB of gradients costs minutes.
cost::Devices slow_links(int count) {
  cost::Devices d = cost::v100(count);
  for (auto& row : d.link_bandwidth) std::fill(row.begin(), row.end(), 1e6);
  return d;
}

pt::Options options(const std::string& partitioner, cost::SyncMethod sync) {
  pt::Options o;
  o.partitioner = partitioner;
  o.replicate = true;
  o.memory_limit = 1e12;
  o.sync = sync;
  return o;
}

cost::SyncMethod method(cost::SyncKind kind) {
  cost::SyncMethod m;
  m.kind = kind;
  return m;
}

}  // namespace

TEST(PartitionSync, CheaperSyncMethodsBuyReplicasTheAllReduceCannot) {
  const graph::OpGraph g = heavy_operator(10000, 10000);  // 400 MB of float32 weights
  const cost::Devices d = slow_links(4);
  auto local = method(cost::SyncKind::local_sgd);
  local.period = 10000.0;
  for (const char* name : {"graphpipe", "sequential"}) {
    const graphpipe::plan::Plan plain = pt::partition(g, d, options(name, {}));
    EXPECT_EQ(plain.stages.back().devices.size(), 1u) << name;
    for (const cost::SyncMethod& m : {method(cost::SyncKind::power_sgd), local}) {
      const graphpipe::plan::Plan plan = pt::partition(g, d, options(name, m));
      EXPECT_EQ(plan.sync, m);
      const graphpipe::plan::Stage& heavy = plan.stages.back();
      EXPECT_GT(heavy.devices.size(), 1u) << name << " " << m.describe();
      EXPECT_LT(plan.predicted_iteration_seconds, 0.75 * plain.predicted_iteration_seconds)
          << name << " " << m.describe();
      // The plan's figure is the pricing of the stage's gradients as one bucket on its ranks.
      const cost::GroupPricer pricer(d, heavy.devices, false);
      const cost::SyncLoad load = cost::tensor_load(m, g.node(1).param_shapes[0], d);
      EXPECT_DOUBLE_EQ(heavy.all_reduce_seconds, cost::price_sync(m, {load}, pricer).seconds()) << m.describe();
      EXPECT_GT(heavy.all_reduce_seconds, 0.0);
      ASSERT_EQ(heavy.parameters.size(), 1u);
      EXPECT_EQ(heavy.parameters[0].name, "heavy.weight");
    }
  }
}

TEST(PartitionSync, PlansCarryTheirMethodThroughJson) {
  const graph::OpGraph g = heavy_operator(1000, 1000);
  auto m = method(cost::SyncKind::top_k);
  m.ratio = 0.05;
  const graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), options("graphpipe", m));
  const graphpipe::plan::Plan back = graphpipe::plan::plan_from_json(graphpipe::plan::to_json(plan, g), g);
  EXPECT_EQ(back.sync, m);
  ASSERT_EQ(back.stages.size(), plan.stages.size());
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    ASSERT_EQ(back.stages[s].parameters.size(), plan.stages[s].parameters.size());
    for (std::size_t i = 0; i < plan.stages[s].parameters.size(); ++i) {
      EXPECT_EQ(back.stages[s].parameters[i].name, plan.stages[s].parameters[i].name);
    }
  }
  // A plan written before sync methods existed was made for the all-reduce.
  auto doc = graphpipe::plan::to_json(plan, g);
  doc.erase("sync");
  EXPECT_EQ(graphpipe::plan::plan_from_json(doc, g).sync, cost::SyncMethod{});
  doc = graphpipe::plan::to_json(plan, g);
  doc["sync"]["ratio"] = 2.0;
  EXPECT_THROW(graphpipe::plan::plan_from_json(doc, g), graphpipe::FormatError);
}

TEST(PartitionSync, PowerSgdRefusesAGraphWithoutShapes) {
  const graph::OpGraph g = heavy_operator(1000, 1000, false);
  try {
    pt::partition(g, cost::v100(4), options("graphpipe", method(cost::SyncKind::power_sgd)));
    FAIL() << "PowerSGD was priced without parameter shapes";
  } catch (const graphpipe::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("shapes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("heavy"), std::string::npos) << e.what();
  }
  // The all-reduce needs only the bytes.
  EXPECT_NO_THROW(pt::partition(g, cost::v100(4), options("graphpipe", {})));
}

TEST(PartitionSync, StageParametersComeInTheStageModulesOrder) {
  // The operators use enc.l1, then dec.l1, then enc.l2, then read `pos` directly (and tie
  // enc.l1.weight): torch's stage module holds pos at its root, then enc (l1, l2), then dec.
  graph::OpGraph g;
  auto node = [&](const std::string& name, std::vector<std::string> params, std::vector<std::string> shared) {
    graph::Node n;
    n.name = name;
    n.op = "call_module";
    for (const auto& p : params) n.param_shapes.push_back({p, {2, 3}, "float32", 4, true});
    n.params = std::move(params);
    n.shared_params = std::move(shared);
    n.param_bytes = static_cast<std::int64_t>(n.params.size()) * 24;
    return g.add_node(n);
  };
  node("a", {"enc.l1.weight", "enc.l1.bias"}, {});
  node("b", {"dec.l1.weight"}, {});
  node("c", {"enc.l2.weight"}, {});
  node("d", {"pos"}, {"enc.l1.weight"});
  for (graph::NodeId v = 1; v < 4; ++v) g.add_edge(v - 1, v, 1.0);
  graphpipe::plan::Plan plan;
  plan.stages.resize(2);
  plan.stages[0].nodes = {0, 1, 2, 3};
  plan.stages[1].nodes = {3};
  graphpipe::plan::fill_stage_parameters(plan, g);
  std::vector<std::string> names;
  for (const auto& p : plan.stages[0].parameters) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"pos", "enc.l1.weight", "enc.l1.bias", "enc.l2.weight", "dec.l1.weight"}));
  // A stage that uses a tied parameter holds it too.
  names.clear();
  for (const auto& p : plan.stages[1].parameters) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"pos", "enc.l1.weight"}));
}
