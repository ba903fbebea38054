#include <gtest/gtest.h>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/in_flight.h"
#include "cost/presets.h"
#include "graph_builders.h"

using namespace graphpipe;
using namespace graphpipe::cost;

namespace {

graph::OpGraph two_nodes() {
  graph::OpGraph g;
  graph::Node a;
  a.name = "x";
  a.op = "input";
  a.output_bytes = 1000;
  g.add_node(a);
  graph::Node b;
  b.name = "fc";
  b.op = "call_module";
  b.forward_flops = 2e9;
  b.param_bytes = 4000000;
  b.buffer_bytes = 100;
  b.output_bytes = 2000;
  g.add_node(b);
  g.add_edge(0, 1, 1000);
  return g;
}

}  // namespace

TEST(CostModel, AnalyticTimeHasOverheadAndScales) {
  auto g = two_nodes();
  Devices d = v100(2);
  CostModel m(g, d);
  EXPECT_DOUBLE_EQ(m.forward_seconds(0, 8), 0.0);  // graph input
  double work1 = std::max(2e9 / d.flops_per_second, (4e6 + 3000.0) / d.memory_bandwidth);
  EXPECT_NEAR(m.forward_seconds(1, 1), d.op_overhead_seconds + work1, 1e-15);
  EXPECT_NEAR(m.backward_seconds(1, 1), d.op_overhead_seconds + 2 * work1, 1e-15);
  // Per-sample cost falls as the micro-batch grows (the overhead is amortised).
  double per1 = m.compute_seconds(1, 1);
  double per8 = m.compute_seconds(1, 8) / 8;
  double per64 = m.compute_seconds(1, 64) / 64;
  EXPECT_GT(per1, per8);
  EXPECT_GT(per8, per64);
}

TEST(CostModel, ProfileInterpolatesAndExtrapolates) {
  auto g = two_nodes();
  g.mutable_node(1).profile = {{2, 0.010, 0.0}, {8, 0.020, 0.050}};
  Devices d = v100(2);
  d.relative_speed = 2.0;
  CostModel m(g, d);
  EXPECT_TRUE(m.is_profiled(1));
  EXPECT_NEAR(m.forward_seconds(1, 2), 0.005, 1e-12);
  EXPECT_NEAR(m.forward_seconds(1, 4), (0.010 + (0.020 - 0.010) * 2 / 6) / 2, 1e-12);
  EXPECT_NEAR(m.forward_seconds(1, 16), 0.040 / 2, 1e-12);  // per-sample time of the largest
  EXPECT_NEAR(m.backward_seconds(1, 2), 0.020 / 2, 1e-12);  // not profiled: 2 x forward
  EXPECT_NEAR(m.backward_seconds(1, 8), 0.050 / 2, 1e-12);
  // Below the smallest size: the line, but never cheaper per sample than the smallest size.
  double t1 = m.forward_seconds(1, 1);
  EXPECT_GE(t1, 0.005 / 2 - 1e-15);
  EXPECT_LE(t1, 0.005);
}

TEST(CostModel, BackwardHalvesAreInterpolatedLikeTheBackward) {
  auto g = two_nodes();
  // Split at both sizes: I and W interpolate and extrapolate as the backward does; their sum is
  // what was measured, not the backward.
  g.mutable_node(1).profile = {{2, 0.010, 0.030, 0.012, 0.020}, {8, 0.020, 0.050, 0.024, 0.040}};
  Devices d = v100(2);
  d.relative_speed = 2.0;
  CostModel m(g, d);
  EXPECT_NEAR(m.backward_input_seconds(1, 2), 0.012 / 2, 1e-12);
  EXPECT_NEAR(m.backward_weight_seconds(1, 2), 0.020 / 2, 1e-12);
  EXPECT_NEAR(m.backward_input_seconds(1, 4), (0.012 + 0.012 * 2 / 6) / 2, 1e-12);
  EXPECT_NEAR(m.backward_weight_seconds(1, 4), (0.020 + 0.020 * 2 / 6) / 2, 1e-12);
  EXPECT_NEAR(m.backward_weight_seconds(1, 16), 0.080 / 2, 1e-12);  // per-sample time of the largest
  EXPECT_DOUBLE_EQ(m.backward_input_seconds(0, 4), 0.0);            // graph input
  EXPECT_DOUBLE_EQ(m.backward_weight_seconds(0, 4), 0.0);
}

TEST(CostModel, BackwardHalvesWithoutMeasurementFollowTheRule) {
  auto g = two_nodes();
  graph::Node relu;
  relu.name = "relu";
  relu.op = "call_module";
  relu.forward_flops = 1e6;
  relu.output_bytes = 2000;
  g.add_node(relu);
  g.add_edge(1, 2, 2000);
  CostModel analytic(g, v100(2));
  // With weights: half each; without: all I, no W.
  EXPECT_DOUBLE_EQ(analytic.backward_input_seconds(1, 4), analytic.backward_seconds(1, 4) / 2);
  EXPECT_DOUBLE_EQ(analytic.backward_weight_seconds(1, 4), analytic.backward_seconds(1, 4) / 2);
  EXPECT_DOUBLE_EQ(analytic.backward_input_seconds(2, 4), analytic.backward_seconds(2, 4));
  EXPECT_DOUBLE_EQ(analytic.backward_weight_seconds(2, 4), 0.0);
  // A profile from before the split was measured (I = W = 0): the rule on its backward, which
  // may itself be 2 x forward.
  g.mutable_node(1).profile = {{2, 0.010, 0.0}, {8, 0.020, 0.050}};
  g.mutable_node(2).profile = {{2, 0.001, 0.003}};
  CostModel old(g, v100(2));
  EXPECT_NEAR(old.backward_input_seconds(1, 2), 0.010, 1e-12);
  EXPECT_NEAR(old.backward_weight_seconds(1, 8), 0.025, 1e-12);
  EXPECT_NEAR(old.backward_input_seconds(2, 4), 0.006, 1e-12);
  EXPECT_DOUBLE_EQ(old.backward_weight_seconds(2, 4), 0.0);
  // A user of shared parameters (no bytes of its own) has weights too.
  g.mutable_node(2).shared_params = {"fc.weight"};
  EXPECT_NEAR(CostModel(g, v100(2)).backward_weight_seconds(2, 4), 0.003, 1e-12);
}

TEST(CostModel, MemoryFactorsPerOptimizer) {
  auto g = two_nodes();
  Devices d = v100(2);
  EXPECT_DOUBLE_EQ(CostModel(g, d, Optimizer::sgd).static_bytes(1), 2 * 4e6 + 100);
  EXPECT_DOUBLE_EQ(CostModel(g, d, Optimizer::momentum).static_bytes(1), 3 * 4e6 + 100);
  EXPECT_DOUBLE_EQ(CostModel(g, d, Optimizer::adam).static_bytes(1), 4 * 4e6 + 100);
  CostModel m(g, d);
  EXPECT_DOUBLE_EQ(m.activation_bytes(1, 4), 8000);
  EXPECT_DOUBLE_EQ(CostModel::stage_memory(10, 3, 4), 22);
  EXPECT_EQ(parse_optimizer("adamw"), Optimizer::adam);
  EXPECT_THROW(parse_optimizer("lion"), PlanningError);
}

TEST(CostModel, OptimizerStepIsItsTrafficPlusItsOptimizersPricePerTrainedTensor) {
  auto g = two_nodes();
  Devices d = v100(2);
  const double traffic = kOptimizerTrafficFactor * 4e6 / d.memory_bandwidth;
  EXPECT_DOUBLE_EQ(CostModel(g, d).optimizer_seconds(1), traffic);  // unmeasured: its bytes alone
  d.optimizer_tensor_seconds = {{"sgd", 1e-6}, {"adam", 1e-5}};
  // No names: one flat tensor, at the price of the model's optimizer (Adam by default).
  EXPECT_DOUBLE_EQ(CostModel(g, d).optimizer_seconds(1), traffic + 1e-5);
  EXPECT_DOUBLE_EQ(CostModel(g, d, Optimizer::sgd).optimizer_seconds(1), traffic + 1e-6);
  EXPECT_DOUBLE_EQ(CostModel(g, d, Optimizer::momentum).optimizer_seconds(1), traffic);  // not measured
  EXPECT_DOUBLE_EQ(CostModel(g, d).optimizer_seconds(0), 0.0);                           // the input owns nothing
  // Named and shaped: each trained tensor pays, a frozen one does not.
  graph::Node& fc = g.mutable_node(1);
  fc.params = {"fc.weight", "fc.bias", "fc.scale"};
  fc.param_shapes = {{"fc.weight", {999, 1000}}, {"fc.bias", {999}}, {"fc.scale", {1}, "float32", 4, false}};
  ASSERT_EQ(param_tensor_count(fc), 2U);
  EXPECT_DOUBLE_EQ(CostModel(g, d).optimizer_seconds(1), traffic + 2e-5);
  EXPECT_DOUBLE_EQ(optimizer_step_seconds(4e6, 2, d, Optimizer::adam), traffic + 2e-5);
  EXPECT_DOUBLE_EQ(optimizer_step_seconds(4e6, 2, d, Optimizer::sgd, 2 * kOptimizerTrafficFactor), 2 * traffic + 2e-6);
}

TEST(CostModel, TransferUsesSlowestLink) {
  auto g = two_nodes();
  Devices d = v100(8);
  CostModel m(g, d);
  EXPECT_NEAR(m.transfer_seconds(12.5e9), 1.0 + 10e-6, 1e-12);
  EXPECT_DOUBLE_EQ(m.transfer_seconds(0.0), 0.0);
  EXPECT_DOUBLE_EQ(CostModel(g, v100(1)).transfer_seconds(1e9), 0.0);  // one device: no link
}

TEST(CostModel, RejectsInvalidDevices) {
  auto g = two_nodes();
  Devices d = v100(2);
  d.memory_bytes = -1;
  EXPECT_THROW(CostModel(g, d), PlanningError);
}

TEST(CostInFlight, OneFOneBDepthRule) {
  // chain of 4: 4,3,2,1
  EXPECT_EQ(in_flight_1f1b(4, {{0, 1}, {1, 2}, {2, 3}}, 100), (std::vector<int>{4, 3, 2, 1}));
  // fork-join: 0 -> {1, 2} -> 3: depth 3
  EXPECT_EQ(in_flight_1f1b(4, {{0, 1}, {0, 2}, {1, 3}, {2, 3}}, 100), (std::vector<int>{3, 2, 2, 1}));
  // capped by the micro-batches of a step
  EXPECT_EQ(in_flight_1f1b(4, {{0, 1}, {1, 2}, {2, 3}}, 2), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_THROW(in_flight_1f1b(2, {{1, 0}}, 4), PlanningError);
}
