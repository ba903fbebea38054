// A stage's split backward (I, then W) priced as the runtime runs it: I only over the operators
// a received tensor reaches, W from where the parameters' paths join I's (the weights' gradients,
// no activation gradient of I's again), the whole backward of what I does not reach
// (partition/backward_halves.h); and how evaluate() and the
// plan carry the halves (recomputation, the zero-bubble step estimate, plan JSON).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/presets.h"
#include "partition/backward_halves.h"
#include "partition/evaluate.h"
#include "partition/plan_build.h"
#include "partition/problem.h"
#include "plan/plan_io.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;

namespace {

// x (model input) -> a (weights) -> r (none) -> b (weights), the output.
graph::OpGraph chain4() {
  graph::OpGraph g;
  for (const char* name : {"x", "a", "r", "b"}) {
    graph::Node n;
    n.name = name;
    const std::string s = name;
    n.op = s == "x" ? "input" : "call_module";
    n.is_input = s == "x";
    n.is_output = s == "b";
    n.forward_flops = 1e6;
    n.output_bytes = 64;
    n.param_bytes = s == "a" || s == "b" ? 4096 : 0;
    g.add_node(n);
  }
  g.add_edge(0, 1, 64);
  g.add_edge(1, 2, 64);
  g.add_edge(2, 3, 64);
  g.trace_batch_size = 4;
  return g;
}

// Per-operator I and W of chain4: x, a, r, b.
const std::vector<double> kInput = {0.0, 1.0, 2.0, 3.0};
const std::vector<double> kWeight = {0.0, 10.0, 0.0, 30.0};

std::vector<pt::BackwardHalves> halves(const graph::OpGraph& g, const std::vector<int>& stage_of) {
  const int k = *std::max_element(stage_of.begin(), stage_of.end()) + 1;
  return pt::backward_halves(g, g.topological_order(), stage_of, k, kInput, kWeight);
}

}  // namespace

TEST(BackwardHalves, AStageThatReceivesNothingHasNoInputHalf) {
  auto g = chain4();
  auto h = halves(g, {0, 0, 0, 0});
  // W: a's weights; r and b after a's weights, so their input gradients again; b's weights.
  EXPECT_DOUBLE_EQ(h[0].input, 0.0);
  EXPECT_FALSE(h[0].input_walks);
  EXPECT_DOUBLE_EQ(h[0].weight, 10.0 + 2.0 + (3.0 + 30.0));
}

TEST(BackwardHalves, InputHalfRunsFromTheReceivedTensorsWeightHalfFromTheParameters) {
  auto g = chain4();
  auto h = halves(g, {0, 0, 1, 1});
  EXPECT_DOUBLE_EQ(h[0].input, 0.0);
  EXPECT_DOUBLE_EQ(h[0].weight, 10.0);
  // Stage 1 receives a's output: I runs r and b; W runs only b's weights (nothing before b in
  // the stage depends on a parameter of it).
  EXPECT_DOUBLE_EQ(h[1].input, 2.0 + 3.0);
  EXPECT_TRUE(h[1].input_walks);
  EXPECT_DOUBLE_EQ(h[1].weight, 30.0);
  // Stage 0 ends after r: W walks r's input gradient again to reach a's weights.
  h = halves(g, {0, 0, 0, 1});
  EXPECT_DOUBLE_EQ(h[0].weight, 10.0 + 2.0);
  EXPECT_DOUBLE_EQ(h[1].input, 3.0);
  EXPECT_DOUBLE_EQ(h[1].weight, 30.0);
}

TEST(BackwardHalves, WeightHalfStartsWhereParametersJoinTheInputPath) {
  // Stage 1 receives a's output and holds r and b: a weighted operator fed by what I ran costs
  // only its weights in W, never the input gradients between it and the received tensor.
  auto g = chain4();
  const std::vector<double> input = {0.0, 1.0, 2.0, 3.0}, weight = {0.0, 10.0, 20.0, 30.0};
  auto h = pt::backward_halves(g, g.topological_order(), {0, 0, 1, 1}, 2, input, weight);
  EXPECT_DOUBLE_EQ(h[1].input, 2.0 + 3.0);
  EXPECT_DOUBLE_EQ(h[1].weight, 20.0 + 30.0);  // the old rule priced b's I again: 20 + 3 + 30
  // A join: b adds the received path (r) to a local weighted branch (w, fed by the model input):
  // W runs w wholly and b again for w's operand.
  graph::OpGraph j = chain4();
  graph::Node w;
  w.name = "w";
  w.op = "call_module";
  w.forward_flops = 1e6;
  w.output_bytes = 64;
  w.param_bytes = 4096;
  const auto wid = j.add_node(w);
  j.add_edge(0, wid, 64);
  j.add_edge(wid, 3, 64);
  const std::vector<double> input5 = {0.0, 1.0, 2.0, 3.0, 4.0}, weight5 = {0.0, 10.0, 0.0, 0.0, 40.0};
  h = pt::backward_halves(j, j.topological_order(), {0, 0, 1, 1, 1}, 2, input5, weight5);
  EXPECT_DOUBLE_EQ(h[1].input, 2.0 + 3.0);
  EXPECT_DOUBLE_EQ(h[1].weight, 40.0 + 3.0);
}

TEST(BackwardHalves, ModelInputsAreReadNotReceived) {
  // The stage after the model input's own reads it locally (no gradient): no I.
  auto g = chain4();
  auto h = halves(g, {0, 1, 1, 1});
  EXPECT_DOUBLE_EQ(h[1].input, 0.0);
  EXPECT_FALSE(h[1].input_walks);
  EXPECT_DOUBLE_EQ(h[1].weight, 10.0 + 2.0 + 33.0);
}

TEST(BackwardHalves, RejectsMismatchedSizes) {
  auto g = chain4();
  EXPECT_THROW(pt::backward_halves(g, g.topological_order(), {0, 0, 0}, 1, kInput, kWeight), graphpipe::PlanningError);
  EXPECT_THROW(pt::backward_halves(g, g.topological_order(), {0, 0, 0, 2}, 2, kInput, kWeight),
               graphpipe::PlanningError);
}

namespace {

pt::Problem problem(const graph::OpGraph& g, const cost::CostModel& model) {
  pt::Problem p = pt::make_problem(model, 4, 1, 4, 1e12, {});
  p.forward = {0.0, 0.5, 0.25, 1.5};
  p.backward = {0.0, 10.5, 2.0, 31.0};
  p.backward_input = kInput;
  p.backward_weight = kWeight;
  p.edge_seconds.assign(g.num_edges(), 0.0);
  p.optimizer.assign(g.num_nodes(), 0.0);
  return p;
}

}  // namespace

TEST(BackwardHalves, EvaluateAndThePlanCarryEachStagesHalves) {
  auto g = chain4();
  cost::CostModel model(g, cost::v100(4));
  pt::Problem p = problem(g, model);
  pt::Evaluation ev = pt::evaluate(p, {0, 0, 1, 1});
  ASSERT_TRUE(ev.acyclic);
  EXPECT_DOUBLE_EQ(ev.stages[0].backward_input, 0.0);
  EXPECT_DOUBLE_EQ(ev.stages[0].backward_weight, 10.0);
  EXPECT_DOUBLE_EQ(ev.stages[1].backward_input, 5.0);
  EXPECT_DOUBLE_EQ(ev.stages[1].backward_weight, 30.0);
  EXPECT_DOUBLE_EQ(ev.stages[1].backward, 33.0);  // the unsplit backward stays the operators' sum
  graphpipe::plan::Plan plan = pt::build_plan(p, {0, 0, 1, 1}, "manual");
  EXPECT_DOUBLE_EQ(plan.stages[1].backward_input_seconds, 5.0);
  EXPECT_DOUBLE_EQ(plan.stages[1].backward_weight_seconds, 30.0);
  // JSON keeps them; a plan written before they existed loads with both 0 (not known).
  const std::string text = graphpipe::plan::dumps(plan, g);
  graphpipe::plan::Plan back = graphpipe::plan::loads_plan(text, g);
  EXPECT_DOUBLE_EQ(back.stages[0].backward_weight_seconds, 10.0);
  EXPECT_DOUBLE_EQ(back.stages[1].backward_input_seconds, 5.0);
  auto doc = nlohmann::json::parse(text);
  for (auto& stage : doc["stages"]) {
    stage.erase("backward_input_seconds");
    stage.erase("backward_weight_seconds");
  }
  graphpipe::plan::Plan old = graphpipe::plan::loads_plan(doc.dump(), g);
  EXPECT_DOUBLE_EQ(old.stages[1].backward_input_seconds, 0.0);
  EXPECT_DOUBLE_EQ(old.stages[1].backward_weight_seconds, 0.0);
  EXPECT_DOUBLE_EQ(old.stages[1].backward_seconds, 33.0);
  doc["stages"][1]["backward_input_seconds"] = -1.0;
  EXPECT_THROW(graphpipe::plan::loads_plan(doc.dump(), g), graphpipe::FormatError);
}

TEST(BackwardHalves, ARecomputedForwardGoesToTheHalfThatRunsFirst) {
  // Three stages {x, a} | {r} | {b}; activations sized so that the first two do not fit with
  // their micro-batches in flight (3 and 2) but do recomputed.
  auto g = chain4();
  cost::CostModel model(g, cost::v100(4));
  pt::Problem p = problem(g, model);
  p.static_bytes.assign(4, 0.0);
  p.act_bytes = {0.0, 1000.0, 1000.0, 100.0};
  p.edge_bytes.assign(g.num_edges(), 10.0);
  p.memory_limit = 1500.0;
  pt::Evaluation ev = pt::evaluate(p, {0, 0, 1, 2});
  ASSERT_TRUE(ev.stages[0].recompute);
  ASSERT_TRUE(ev.stages[1].recompute);
  ASSERT_FALSE(ev.stages[2].recompute);
  // Stage 0 receives nothing, so its I runs nothing: W uses the activations first.
  EXPECT_DOUBLE_EQ(ev.stages[0].backward_input, 0.0);
  EXPECT_DOUBLE_EQ(ev.stages[0].backward_weight, 10.0 + 0.5);
  EXPECT_DOUBLE_EQ(ev.stages[0].backward, 10.5 + 0.5);
  // Stage 1 receives a's output: its I runs first, with the forward again.
  EXPECT_DOUBLE_EQ(ev.stages[1].backward_input, 2.0 + 0.25);
  EXPECT_DOUBLE_EQ(ev.stages[1].backward_weight, 0.0);
  EXPECT_DOUBLE_EQ(ev.stages[2].backward_input, 3.0);
}

TEST(BackwardHalves, ZeroBubbleStepUsesTheSlowestStagesHalves) {
  auto g = chain4();
  cost::CostModel model(g, cost::v100(4));
  pt::Problem p = problem(g, model);
  p.zero_bubble = true;
  pt::Evaluation ev = pt::evaluate(p, {0, 0, 1, 1});
  // Stage 1: F = 1.75, I = 5, W = 30, no transfers: M (F + I + W) + (depth - 1) max(0, F + I - W).
  EXPECT_DOUBLE_EQ(ev.split_bottleneck, 1.75 + 5.0 + 30.0);
  EXPECT_DOUBLE_EQ(ev.split_fill, 0.0);
  EXPECT_DOUBLE_EQ(ev.iteration_seconds(p), 4 * 36.75);
  // Where a stage's I and W are each half its backward, this is ZB-H1 on the 1F1B bottleneck,
  // M (F + B) + (depth - 1) F, the estimate from before the halves were priced apart.
  p.backward_input[3] = 14.5;
  p.backward_weight[3] = 16.5;
  ev = pt::evaluate(p, {0, 0, 1, 1});
  ASSERT_DOUBLE_EQ(ev.stages[1].backward_input, ev.stages[1].backward / 2.0);
  ASSERT_DOUBLE_EQ(ev.stages[1].backward_weight, ev.stages[1].backward / 2.0);
  EXPECT_DOUBLE_EQ(ev.bottleneck, 1.75 + 33.0);
  EXPECT_DOUBLE_EQ(ev.iteration_seconds(p), 4 * ev.bottleneck + 1 * 1.75);
  p.zero_bubble = false;
  EXPECT_DOUBLE_EQ(ev.iteration_seconds(p), (4 + 2 - 1) * ev.bottleneck);
}
