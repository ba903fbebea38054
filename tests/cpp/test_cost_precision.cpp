// Pricing a model's compute precision (graph/precision.h): which rate the devices give for it
// (cost/devices.h flops_for), the presets' datasheet rates, the rates' JSON form and validation,
// and the cost model's analytic time at that rate while measured times stay as measured.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/devices_json.h"
#include "cost/presets.h"
#include "graph/graph_json.h"

namespace gp = graphpipe;
using gp::cost::CostModel;
using gp::cost::Devices;
using gp::graph::Precision;

namespace {

// An input feeding one compute-bound operator (many FLOPs, few bytes).
gp::graph::OpGraph matmul_graph(Precision precision) {
  gp::graph::OpGraph g;
  gp::graph::Node x;
  x.name = "x";
  x.op = "input";
  x.output_bytes = 1024;
  g.add_node(x);
  gp::graph::Node fc;
  fc.name = "fc";
  fc.op = "call_module";
  fc.forward_flops = 4e9;
  fc.param_bytes = 1 << 20;
  fc.output_bytes = 1024;
  g.add_node(fc);
  g.add_edge(0, 1, 1024);
  g.compute_precision = precision;
  return g;
}

}  // namespace

TEST(CostPrecision, RateFollowsThePrecisionAndFallsBackToFloat32) {
  Devices d = gp::cost::a100(1);
  EXPECT_DOUBLE_EQ(d.flops_for(Precision::float32), d.flops_per_second);
  EXPECT_DOUBLE_EQ(d.flops_for(Precision::bfloat16), d.bfloat16_flops_per_second);
  EXPECT_DOUBLE_EQ(d.flops_for(Precision::float16), d.float16_flops_per_second);
  EXPECT_DOUBLE_EQ(d.flops_for(Precision::float64), d.flops_per_second);  // no float64 rate
  d.bfloat16_flops_per_second = 0.0;                                      // not given
  EXPECT_DOUBLE_EQ(d.flops_for(Precision::bfloat16), d.flops_per_second);
}

TEST(CostPrecision, PresetsCarryHalfTheDatasheetPeaks) {
  Devices a100 = gp::cost::a100(1);
  EXPECT_DOUBLE_EQ(a100.flops_per_second, 19.5e12 / 2);
  EXPECT_DOUBLE_EQ(a100.bfloat16_flops_per_second, 312e12 / 2);
  EXPECT_DOUBLE_EQ(a100.float16_flops_per_second, 312e12 / 2);
  Devices v100 = gp::cost::v100(1);
  EXPECT_DOUBLE_EQ(v100.float16_flops_per_second, 125e12 / 2);
  EXPECT_DOUBLE_EQ(v100.flops_for(Precision::bfloat16), v100.flops_per_second);  // no bf16 tensor cores
  Devices h100 = gp::cost::h100(1);
  EXPECT_NEAR(h100.bfloat16_flops_per_second, 989e12 / 2, 1e12);
  Devices cpu = gp::cost::cpu_rank(1, false);
  EXPECT_DOUBLE_EQ(cpu.flops_for(Precision::bfloat16), cpu.flops_per_second);  // measured by a profile
  EXPECT_EQ(gp::cost::preset("a100", 16).node_of(8), 1);                       // 8 per node
}

TEST(CostPrecision, AnalyticTimeUsesTheGraphsRate) {
  Devices d = gp::cost::a100(2);
  auto f32 = matmul_graph(Precision::float32);
  auto bf16 = matmul_graph(Precision::bfloat16);
  CostModel m32(f32, d);
  CostModel m16(bf16, d);
  EXPECT_DOUBLE_EQ(m32.flops_per_second(), d.flops_per_second);
  EXPECT_DOUBLE_EQ(m16.flops_per_second(), d.bfloat16_flops_per_second);
  // Compute bound: forward = overhead + flops * b / rate at each precision.
  EXPECT_NEAR(m32.forward_seconds(1, 4), d.op_overhead_seconds + 4e9 * 4 / d.flops_per_second, 1e-15);
  EXPECT_NEAR(m16.forward_seconds(1, 4), d.op_overhead_seconds + 4e9 * 4 / d.bfloat16_flops_per_second, 1e-15);
  EXPECT_LT(m16.compute_seconds(1, 4) * 10, m32.compute_seconds(1, 4));  // 16x the rate
}

TEST(CostPrecision, MeasuredTimesStayAsMeasured) {
  auto bf16 = matmul_graph(Precision::bfloat16);
  bf16.mutable_node(1).profile = {{4, 0.010, 0.020}};
  CostModel m(bf16, gp::cost::a100(2));
  EXPECT_DOUBLE_EQ(m.forward_seconds(1, 4), 0.010);
  EXPECT_DOUBLE_EQ(m.backward_seconds(1, 4), 0.020);
}

TEST(CostPrecision, RatesRoundTripThroughJson) {
  Devices d = gp::cost::h100(8);
  Devices back = gp::cost::loads_devices(gp::cost::dumps(d));
  EXPECT_DOUBLE_EQ(back.bfloat16_flops_per_second, d.bfloat16_flops_per_second);
  EXPECT_DOUBLE_EQ(back.float16_flops_per_second, d.float16_flops_per_second);
  EXPECT_EQ(gp::cost::dumps(back), gp::cost::dumps(d));
  // A file without them (written before they existed, or a CPU rank) prices every precision at
  // the float32 rate.
  auto doc = nlohmann::json::parse(gp::cost::dumps(d));
  doc.erase("bfloat16_flops_per_second");
  doc.erase("float16_flops_per_second");
  Devices old = gp::cost::loads_devices(doc.dump());
  EXPECT_DOUBLE_EQ(old.flops_for(Precision::bfloat16), d.flops_per_second);
  EXPECT_FALSE(
      nlohmann::json::parse(gp::cost::dumps(gp::cost::cpu_rank(2, false))).contains("float16_flops_per_second"));
}

TEST(CostPrecision, NegativeRateIsRefusedNamingTheField) {
  Devices d = gp::cost::a100(2);
  d.bfloat16_flops_per_second = -1.0;
  try {
    d.validate();
    FAIL() << "accepted a negative bfloat16 rate";
  } catch (const gp::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16_flops_per_second"), std::string::npos) << e.what();
  }
  auto doc = nlohmann::json::parse(gp::cost::dumps(gp::cost::a100(2)));
  doc["float16_flops_per_second"] = -5;
  try {
    gp::cost::loads_devices(doc.dump());
    FAIL() << "loaded a negative float16 rate";
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.float16_flops_per_second"), std::string::npos) << e.what();
  }
}
