// Bad input reported clearly: zero devices, more devices than operators, too little memory,
// a cyclic graph, bad batch arguments, unknown names; and the manual partitioner's checks.
#include <gtest/gtest.h>

#include "common/error.h"
#include "cost/presets.h"
#include "graph_builders.h"
#include "partition/partitioner.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

template <typename E>
void expect_error(const gp::graph::OpGraph& g, const gp::cost::Devices& d, const pt::Options& o,
                  std::vector<std::string> needles) {
  try {
    pt::partition(g, d, o);
    FAIL() << "no error; expected: " << needles.front();
  } catch (const E& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

pt::Options options(const std::string& partitioner = "graphpipe") {
  pt::Options o;
  o.partitioner = partitioner;
  o.batch_size = 8;
  return o;
}

}  // namespace

TEST(PartitionErrors, ZeroDevices) {
  auto g = tst::random_sp_graph(1, 10);
  gp::cost::Devices d = gp::cost::v100(2);
  d.count = 0;
  expect_error<gp::PlanningError>(g, d, options(), {"0 devices", "at least 1"});
}

TEST(PartitionErrors, MoreDevicesThanOperators) {
  auto g = tst::random_sp_graph(1, 5);
  expect_error<gp::PlanningError>(g, gp::cost::v100(8), options(), {"8 devices", "only 5 operators", "at most 5"});
}

TEST(PartitionErrors, TooLittleMemorySaysByHowMuch) {
  auto g = tst::random_sp_graph(3, 20);
  for (const char* name : {"graphpipe", "metis", "sequential"}) {
    auto o = options(name);
    o.memory_limit = 1e6;  // 1 MB: the weights alone do not fit
    expect_error<gp::PlanningError>(g, gp::cost::v100(4), o, {"does not fit", "over by"});
    // Activations: weights fit on 4 devices but a huge micro-batch of activations does not.
    o.memory_limit = 4.0 * g.total_param_bytes();
    o.micro_batch_size = 8;
    auto heavy = g;
    for (std::size_t v = 0; v < heavy.num_nodes(); ++v) heavy.mutable_node(static_cast<int>(v)).output_bytes = 1e9;
    expect_error<gp::PlanningError>(heavy, gp::cost::v100(4), o, {"does not fit", "over by", "stage"});
  }
}

TEST(PartitionErrors, CyclicGraph) {
  auto g = gp::testing::graph_of({{"a", "b"}, {"b", "c"}, {"c", "a"}});
  expect_error<gp::GraphError>(g, gp::cost::v100(2), options(), {"cycle"});
}

TEST(PartitionErrors, BadArguments) {
  auto g = tst::random_sp_graph(1, 10);
  auto o = options("fastest");
  expect_error<gp::PlanningError>(g, gp::cost::v100(2), o, {"unknown partitioner 'fastest'"});
  o = options();
  o.micro_batch_size = 3;
  expect_error<gp::PlanningError>(g, gp::cost::v100(2), o, {"does not divide the mini-batch of 8"});
  o = options();
  o.num_micro_batches = 4;
  o.micro_batch_size = 4;
  expect_error<gp::PlanningError>(g, gp::cost::v100(2), o, {"disagree"});
  o = options();
  o.batch_size = 0;
  g.trace_batch_size = 0;
  expect_error<gp::PlanningError>(g, gp::cost::v100(2), o, {"mini-batch size must be at least 1"});
  expect_error<gp::PlanningError>(gp::graph::OpGraph{}, gp::cost::v100(1), options(), {"empty graph"});
}

TEST(PartitionErrors, NumMicroBatchesFixesTheSize) {
  auto g = tst::random_sp_graph(1, 10);
  auto o = options();
  o.num_micro_batches = 4;
  auto plan = pt::partition(g, gp::cost::v100(2), o);
  EXPECT_EQ(plan.micro_batch_size, 2);
  EXPECT_EQ(plan.num_micro_batches, 4);
}

namespace {

// x -> enc_a.{fc1, fc2} and enc_b.{fc1} in parallel -> head.cat -> head.out
gp::graph::OpGraph modules_graph() {
  gp::graph::OpGraph g;
  auto add = [&](std::string name, std::string module, std::string op = "call_module") {
    gp::graph::Node n;
    n.name = name;
    n.module = module;
    n.op = op;
    n.forward_flops = 1e9;
    n.output_bytes = 1e4;
    return g.add_node(n);
  };
  auto x = add("x", "", "input");
  auto a1 = add("enc_a_fc1", "enc_a.fc1");
  auto a2 = add("enc_a_fc2", "enc_a.fc2");
  auto b1 = add("enc_b_fc1", "enc_b.fc1");
  auto cat = add("cat", "", "call_function");
  auto out = add("head_out", "head.out");
  for (auto [u, v] : std::vector<std::pair<int, int>>{{x, a1}, {a1, a2}, {x, b1}, {a2, cat}, {b1, cat}, {cat, out}}) {
    g.add_edge(u, v, 1e4);
  }
  return g;
}

}  // namespace

TEST(PartitionManual, MappingByModulePrefix) {
  auto g = modules_graph();
  auto o = options("manual");
  o.manual = {{"enc_a", 0}, {"enc_b", 1}, {"cat", 2}, {"head", 2}};
  auto plan = pt::partition(g, gp::cost::v100(3), o);
  ASSERT_EQ(plan.stages.size(), 3u);
  // x goes with enc_a (its first consumer), so enc_b's stage follows it: 0 -> {1, 2} shape
  // collapses to depth 3 here; with x mapped to a stage of its own the encoders run in parallel.
  EXPECT_EQ(plan.depth, 3);
  EXPECT_EQ(plan.partitioner, "manual");
  // the input went with its first consumer's stage: stage of enc_a (renumbered 0)
  EXPECT_EQ(plan.stages[0].nodes.front(), *g.find("x"));
}

TEST(PartitionManual, ParallelEncodersAsParallelStages) {
  auto g = modules_graph();
  auto o = options("manual");
  o.manual = {{"x", 0}, {"enc_a", 1}, {"enc_b", 2}, {"", 3}};
  o.micro_batch_size = 1;  // 8 micro-batches, so in-flight counts are not capped
  auto plan = pt::partition(g, gp::cost::v100(4), o);
  ASSERT_EQ(plan.stages.size(), 4u);
  EXPECT_EQ(plan.depth, 3);
  EXPECT_EQ(plan.stages[0].in_flight, 3);
}

TEST(PartitionManual, ReportsUnmappedOperators) {
  auto g = modules_graph();
  auto o = options("manual");
  o.manual = {{"enc_a", 0}, {"enc_b", 1}, {"head", 2}};
  expect_error<gp::PlanningError>(g, gp::cost::v100(3), o, {"1 operators without a stage", "cat"});
  o.manual = {{"enc", 0}, {"", 1}};  // "enc" is not a module prefix of "enc_a"
  expect_error<gp::PlanningError>(g, gp::cost::v100(3), o, {"stage 0 receives no operator"});
  o.manual = {{"", 5}};
  expect_error<gp::PlanningError>(g, gp::cost::v100(3), o, {"stage 5", "outside 0..2"});
  o.manual = {};
  expect_error<gp::PlanningError>(g, gp::cost::v100(3), o, {"needs a mapping"});
}

TEST(PartitionManual, ReportsCyclicStages) {
  auto g = modules_graph();
  auto o = options("manual");
  // enc_a.fc1 and head on stage 0, enc_a.fc2 on stage 1: 0 -> 1 -> 0, stage 0 is not convex.
  o.manual = {{"", 0}, {"enc_a.fc2", 1}};
  expect_error<gp::PlanningError>(g, gp::cost::v100(3), o, {"cycle", "enc_a_fc2"});
}
