// The METIS partitioner's guards (partition/metis/metis.h): the cases METIS 5.1 gets wrong are
// answered without asking it for them, silently and with every stage filled.
#include <gtest/gtest.h>

#include <string>

#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/metis/metis.h"
#include "partition/problem.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

// CANDLE-Uno's shape at the paper's size, where the guard was found: an input, seven branches
// of nine operators whose first layer is heavy, a concatenation and a top MLP whose first layer
// is heavier still (72 operators; a few of them hold most of the compute).
graph::OpGraph candle_like() {
  graph::OpGraph g;
  auto node = [&](const std::string& name, double gflops, std::int64_t params) {
    graph::Node n;
    n.name = name;
    n.op = "call_module";
    n.target = "Linear";
    n.module = name;
    n.forward_flops = gflops * 1e9;
    n.param_bytes = params;
    n.output_bytes = 16384;
    return g.add_node(n);
  };
  auto input = node("input", 0.0, 0);
  auto cat = -1;
  std::vector<graph::NodeId> ends;
  for (int b = 0; b < 7; ++b) {
    graph::NodeId prev = input;
    for (int l = 0; l < 9; ++l) {
      auto v = node("b" + std::to_string(b) + "_" + std::to_string(l),
                    l == 1   ? 8.0
                    : l == 0 ? 0.0
                             : 1.0,
                    l == 0   ? 0
                    : l == 1 ? 64 << 20
                             : 16 << 20);
      g.add_edge(prev, v, 16384);
      prev = v;
    }
    ends.push_back(prev);
  }
  cat = node("cat", 0.0, 0);
  for (auto e : ends) g.add_edge(e, cat, 16384);
  graph::NodeId prev = cat;
  for (int l = 0; l < 7; ++l) {
    auto v = node("top" + std::to_string(l), l == 0 ? 40.0 : 1.0, l == 0 ? 256 << 20 : 16 << 20);
    g.add_edge(prev, v, 16384);
    prev = v;
  }
  g.trace_batch_size = 128;
  return g;
}

}  // namespace

// With nearly as many parts as operators, METIS 5.1's recursive bisection runs out of vertices,
// prints "***Cannot bisect a graph with 0 vertices!" on stdout and leaves parts empty.
TEST(PartitionMetis, ManyPartsForFewOperatorsIsSilentAndFillsEveryStage) {
  const graph::OpGraph g = candle_like();
  ASSERT_EQ(g.num_nodes(), 72u);
  for (int k : {24, 25, 32, 48, 64, 72}) {
    cost::Devices d = cost::v100(k);
    cost::CostModel model(g, d);
    pt::Problem p = pt::make_problem(model, 128, 8, k, d.memory_bytes, {});
    testing::internal::CaptureStdout();
    const std::vector<int> parts = pt::metis_parts(p, k);
    const std::vector<int> stages = pt::metis_assignment(p, k);
    const std::string printed = testing::internal::GetCapturedStdout();
    EXPECT_EQ(printed, "") << k << " parts";
    ASSERT_EQ(parts.size(), g.num_nodes());
    for (int label : parts) {
      EXPECT_GE(label, 0);
      EXPECT_LT(label, k);
    }
    pt::Evaluation ev = pt::evaluate(p, stages);  // throws if a label 0..k-1 is unused
    EXPECT_TRUE(ev.acyclic) << k << " parts";
    EXPECT_EQ(ev.num_stages, k);
  }
}

// Degenerate sizes never reach METIS: no operator, one part, as many parts as operators.
TEST(PartitionMetis, DegenerateSizesAreAnsweredDirectly) {
  const graph::OpGraph g = tst::random_sp_graph(7, 9);
  cost::Devices d = cost::v100(9);
  cost::CostModel model(g, d);
  pt::Problem p = pt::make_problem(model, 8, 2, 9, d.memory_bytes, {});
  testing::internal::CaptureStdout();
  EXPECT_EQ(pt::metis_parts(p, 1), std::vector<int>(9, 0));
  std::vector<int> all = pt::metis_assignment(p, 9);
  std::vector<int> more = pt::metis_assignment(p, 20);  // capped at the operator count
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(pt::evaluate(p, all).num_stages, 9);
  EXPECT_EQ(pt::evaluate(p, more).num_stages, 9);

  graph::OpGraph empty;
  cost::CostModel empty_model(empty, cost::v100(2));
  pt::Problem nothing = pt::make_problem(empty_model, 8, 2, 2, 16e9, {});
  EXPECT_TRUE(pt::metis_parts(nothing, 2).empty());
}
