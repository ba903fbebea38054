// A plan records the precision its graph computes in and the rate it was priced at, keeps them
// in its JSON (a plan written before they existed reads as float32), and shows them in its table.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "cost/presets.h"
#include "partition/partitioner.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace pt = graphpipe::partition;

namespace {

gp::plan::Plan plan_in(const gp::graph::OpGraph& g) {
  pt::Options o;
  o.batch_size = 16;
  o.micro_batch_size = 4;
  return pt::partition(g, gp::cost::a100(4), o);
}

}  // namespace

TEST(PartitionPrecision, PlanRecordsPrecisionAndRate) {
  gp::graph::OpGraph g = gp::testing::random_sp_graph(7, 24);
  const gp::plan::Plan f32 = plan_in(g);
  g.compute_precision = gp::graph::Precision::bfloat16;
  const gp::plan::Plan bf16 = plan_in(g);
  EXPECT_EQ(f32.precision, gp::graph::Precision::float32);
  EXPECT_EQ(bf16.precision, gp::graph::Precision::bfloat16);
  EXPECT_DOUBLE_EQ(f32.compute_flops_per_second, gp::cost::a100(1).flops_per_second);
  EXPECT_DOUBLE_EQ(bf16.compute_flops_per_second, gp::cost::a100(1).bfloat16_flops_per_second);
  EXPECT_NE(gp::plan::to_string(bf16, g).find("precision bfloat16: activations and transfers 2 bytes/element"),
            std::string::npos)
      << gp::plan::to_string(bf16, g);
  EXPECT_NE(gp::plan::to_string(f32).find("precision float32: activations and transfers 4 bytes/element"),
            std::string::npos);

  const std::string text = gp::plan::dumps(bf16, g, 1);
  const gp::plan::Plan back = gp::plan::loads_plan(text, g);
  EXPECT_EQ(back.precision, gp::graph::Precision::bfloat16);
  EXPECT_DOUBLE_EQ(back.compute_flops_per_second, bf16.compute_flops_per_second);
  auto doc = nlohmann::json::parse(text);
  doc.erase("compute_dtype");  // a plan written before the precision was recorded
  doc.erase("compute_flops_per_second");
  const gp::plan::Plan old = gp::plan::loads_plan(doc.dump(), g);
  EXPECT_EQ(old.precision, gp::graph::Precision::float32);
  EXPECT_DOUBLE_EQ(old.compute_flops_per_second, 0.0);
}
