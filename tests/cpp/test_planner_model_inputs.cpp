// A model input moves between no stages (graph::OpGraph::edge_moves_data): every rank has the
// batch. So a plan lists no stage edge for it, its depth does not count it, the planner charges
// it no transfer, and the simulator starts a stage that reads only inputs at once, as the runtime
// does. A plan that still lists such an edge is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/in_flight.h"
#include "cost/presets.h"
#include "partition/partitioner.h"
#include "partition/problem.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"
#include "schedule/generate.h"
#include "sim/simulate.h"

namespace gp = graphpipe;
namespace pt = graphpipe::partition;

namespace {

// x -> enc_a.{fc1, fc2} and enc_b.fc1 in parallel -> cat -> head.out; `marked`: x is a model
// input (as the tracer marks placeholders), else an ordinary operator with an output.
gp::graph::OpGraph two_encoders(bool marked) {
  gp::graph::OpGraph g;
  auto add = [&](const std::string& name, const std::string& module, const std::string& op) {
    gp::graph::Node n;
    n.name = name;
    n.module = module;
    n.op = op;
    n.forward_flops = op == "input" ? 0.0 : 1e9;
    n.output_bytes = 1e4;
    n.is_input = marked && op == "input";
    return g.add_node(n);
  };
  const auto x = add("x", "", "input");
  const auto a1 = add("enc_a_fc1", "enc_a.fc1", "call_module");
  const auto a2 = add("enc_a_fc2", "enc_a.fc2", "call_module");
  const auto b1 = add("enc_b_fc1", "enc_b.fc1", "call_module");
  const auto cat = add("cat", "", "call_function");
  const auto out = add("head_out", "head.out", "call_module");
  for (auto [u, v] : std::vector<std::pair<int, int>>{{x, a1}, {a1, a2}, {x, b1}, {a2, cat}, {b1, cat}, {cat, out}}) {
    g.add_edge(u, v, 1e4);
  }
  g.mutable_node(out).is_output = true;
  return g;
}

// x with enc_a on stage 0, enc_b on stage 1, the head on stage 2.
gp::plan::Plan encoders_on_their_own_stages(const gp::graph::OpGraph& g) {
  pt::Options o;
  o.partitioner = "manual";
  o.batch_size = 8;
  o.micro_batch_size = 1;
  o.manual = {{"x", 0}, {"enc_a", 0}, {"enc_b", 1}, {"", 2}};
  return pt::partition(g, gp::cost::v100(3), o);
}

bool has_edge(const gp::plan::Plan& plan, int src, int dst) {
  for (const auto& e : plan.edges) {
    if (e.src == src && e.dst == dst) return true;
  }
  return false;
}

}  // namespace

TEST(PlannerModelInputs, AnInputMakesNoStageEdgeAndNoDepth) {
  const auto marked = encoders_on_their_own_stages(two_encoders(true));
  ASSERT_EQ(marked.stages.size(), 3u);
  EXPECT_FALSE(has_edge(marked, 0, 1)) << gp::plan::to_string(marked);
  EXPECT_TRUE(has_edge(marked, 0, 2));
  EXPECT_TRUE(has_edge(marked, 1, 2));
  EXPECT_EQ(marked.depth, 2);  // the encoders run side by side
  // The same operator as an ordinary producer does send its output: 0 -> 1 -> 2, depth 3.
  const auto unmarked = encoders_on_their_own_stages(two_encoders(false));
  EXPECT_TRUE(has_edge(unmarked, 0, 1));
  EXPECT_EQ(unmarked.depth, 3);
}

TEST(PlannerModelInputs, TheSimulatorStartsAStageThatReadsOnlyInputsAtOnce) {
  const auto g = two_encoders(true);
  const auto plan = encoders_on_their_own_stages(g);
  const auto devices = gp::cost::v100(3);
  const auto r = gp::sim::simulate(plan, gp::schedule::generate(plan, gp::schedule::Policy::one_f_one_b), devices);
  for (const auto& t : r.tasks) {
    // Stage 1's first forward waits for nothing: stage 0 sends it nothing.
    if (t.kind == gp::sim::TaskKind::forward && t.stage == 1 && t.micro_batch == 0) EXPECT_DOUBLE_EQ(t.start, 0.0);
    EXPECT_FALSE((t.kind == gp::sim::TaskKind::activation || t.kind == gp::sim::TaskKind::gradient) && t.stage == 0 &&
                 t.peer == 1)
        << gp::sim::task_name(t);
  }
}

TEST(PlannerModelInputs, ThePlannerChargesAnInputNoBytesOrTime) {
  const auto g = two_encoders(true);
  const gp::cost::CostModel model(g, gp::cost::v100(3));
  const auto p = pt::make_problem(model, 8, 1, 3, 0.0, gp::cost::in_flight_1f1b);
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const bool from_input = g.node(g.edge(static_cast<gp::graph::EdgeId>(e)).src).is_input;
    EXPECT_EQ(p.edge_bytes[e] == 0.0, from_input) << "edge " << e;
    EXPECT_EQ(p.edge_seconds[e] == 0.0, from_input) << "edge " << e;
  }
}

namespace {

// The loader's message for `doc`, which it must refuse.
std::string refusal(const nlohmann::json& doc, const gp::graph::OpGraph& g) {
  try {
    gp::plan::loads_plan(doc.dump(), g);
  } catch (const gp::FormatError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST(PlannerModelInputs, APlanListingAnInputEdgeIsRefusedByName) {
  const auto g = two_encoders(true);
  auto doc = nlohmann::json::parse(gp::plan::dumps(encoders_on_their_own_stages(g), g, 2));
  // What a plan saved before the rule lists: x -> enc_b.fc1 (operator edge 2) as stage edge 0 -> 1.
  doc["edges"].push_back({{"src", 0}, {"dst", 1}, {"edges", {2}}, {"tensors", 1}, {"bytes", 1e4}});
  std::string message = refusal(doc, g);
  EXPECT_NE(message.find("stage edge 0 -> 1 lists operator edges out of model inputs"), std::string::npos) << message;
  // An input edge riding beside data on a listed edge: named the same way.
  doc = nlohmann::json::parse(gp::plan::dumps(encoders_on_their_own_stages(g), g, 2));
  for (auto& e : doc["edges"]) {
    if (e["src"] == 0 && e["dst"] == 2) e["edges"].push_back(2);
  }
  message = refusal(doc, g);
  EXPECT_NE(message.find("stage edge 0 -> 2 lists operator edges out of model inputs"), std::string::npos) << message;
}

TEST(PlannerModelInputs, APlanFromBeforeTheRuleLoadsWithItsInputEdgesDropped) {
  const auto g = two_encoders(true);
  const auto current = encoders_on_their_own_stages(g);
  auto doc = nlohmann::json::parse(gp::plan::dumps(current, g, 2));
  // As saved before the rule: x -> enc_b.fc1 (operator edge 2) on a stage edge 0 -> 1, depth 3.
  doc["edges"].push_back({{"src", 0}, {"dst", 1}, {"edges", {2}}, {"tensors", 1}, {"bytes", 1e4}});
  doc["depth"] = 3;
  const auto loaded = gp::plan::loads_plan(doc.dump(), g, /*drop_input_edges=*/true);
  EXPECT_EQ(loaded.depth, 2);
  EXPECT_FALSE(has_edge(loaded, 0, 1));
  EXPECT_EQ(loaded.edges.size(), current.edges.size());
  for (std::size_t i = 0; i < loaded.edges.size(); ++i) {
    EXPECT_EQ(loaded.edges[i].edges, current.edges[i].edges);
    EXPECT_EQ(loaded.edges[i].tensors, current.edges[i].tensors);
  }
  EXPECT_THROW(gp::plan::loads_plan(doc.dump(), g), gp::FormatError);  // refused without the flag
}
