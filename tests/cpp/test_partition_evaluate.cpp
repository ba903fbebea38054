// The evaluator's step estimate: (M + depth - 1) x slowest stage plus the optimizer tail, the
// part of the stages' optimizer steps that outlasts the pipeline (evaluate.h).
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/problem.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;

namespace {

// x (input) -> a -> b, cut as {x, a} | {b}.
graph::OpGraph chain3() {
  graph::OpGraph g;
  for (const char* name : {"x", "a", "b"}) {
    graph::Node n;
    n.name = name;
    n.op = std::string(name) == "x" ? "input" : "call_module";
    n.forward_flops = 1e6;
    n.output_bytes = 64;
    n.param_bytes = std::string(name) == "b" ? 8000 : 0;
    g.add_node(n);
  }
  g.add_edge(0, 1, 64);
  g.add_edge(1, 2, 64);
  g.trace_batch_size = 4;
  return g;
}

}  // namespace

TEST(PartitionEvaluate, OptimizerStepOverlapsTheBackwardUpstream) {
  auto g = chain3();
  cost::CostModel model(g, cost::v100(2));
  pt::Problem p = pt::make_problem(model, 4, 1, 2, 1e12, {});
  EXPECT_DOUBLE_EQ(p.optimizer[2], cost::kOptimizerTrafficFactor * 8000 / model.devices().memory_bandwidth);
  p.forward = {0.0, 1.0, 1.0};
  p.backward = {0.0, 2.0, 1.0};
  p.edge_seconds = {0.0, 0.0};
  // Stage 1 (b) steps for 5 s after its last backward, while stage 0 still runs 2 s of backward.
  p.optimizer = {0.0, 1.0, 5.0};
  pt::Evaluation ev = pt::evaluate(p, {0, 0, 1});
  ASSERT_TRUE(ev.acyclic);
  EXPECT_DOUBLE_EQ(ev.bottleneck, 3.0);
  EXPECT_DOUBLE_EQ(ev.optimizer_tail, 3.0);
  EXPECT_DOUBLE_EQ(ev.iteration_seconds(p), (4 + 2 - 1) * 3.0 + 3.0);
  // The source stage's step has nothing upstream to hide behind.
  p.optimizer = {0.0, 4.0, 5.0};
  EXPECT_DOUBLE_EQ(pt::evaluate(p, {0, 0, 1}).optimizer_tail, 4.0);
  // Short steps vanish behind the upstream backward: no tail.
  p.optimizer = {0.0, 0.0, 1.5};
  EXPECT_DOUBLE_EQ(pt::evaluate(p, {0, 0, 1}).optimizer_tail, 0.0);
}
