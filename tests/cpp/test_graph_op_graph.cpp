#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "graph/op_graph.h"
#include "graph_builders.h"

using graphpipe::GraphError;
using graphpipe::graph::NodeId;
using graphpipe::graph::OpGraph;
using graphpipe::testing::graph_of;

namespace {

std::vector<std::string> names(const OpGraph& g, const std::vector<NodeId>& ids) {
  std::vector<std::string> result;
  for (NodeId id : ids) result.push_back(g.node(id).name);
  return result;
}

}  // namespace

TEST(OpGraph, TopologicalOrderRespectsEveryEdge) {
  auto g = graph_of({{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}, {"d", "e"}, {"a", "e"}});
  auto order = g.topological_order();
  ASSERT_EQ(order.size(), g.num_nodes());
  std::vector<std::size_t> position(g.num_nodes());
  for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = i;
  for (const auto& e : g.edges()) EXPECT_LT(position[e.src], position[e.dst]);
  EXPECT_EQ(names(g, order), (std::vector<std::string>{"a", "b", "c", "d", "e"}));
}

TEST(OpGraph, TopologicalOrderBreaksTiesByInsertionOrder) {
  // c is inserted before b, and both only depend on a: the order keeps insertion order.
  auto g = graph_of({{"a", "c"}, {"a", "b"}, {"c", "d"}, {"b", "d"}});
  EXPECT_EQ(names(g, g.topological_order()), (std::vector<std::string>{"a", "c", "b", "d"}));
}

TEST(OpGraph, CycleIsReportedWithItsNodes) {
  auto g = graph_of({{"in", "x"}, {"x", "y"}, {"y", "z"}, {"z", "x"}, {"z", "out"}});
  auto cycle = g.find_cycle();
  ASSERT_TRUE(cycle.has_value());
  auto cycle_names = names(g, *cycle);
  std::sort(cycle_names.begin(), cycle_names.end());
  EXPECT_EQ(cycle_names, (std::vector<std::string>{"x", "y", "z"}));
  try {
    g.topological_order();
    FAIL() << "a cyclic graph must not have a topological order";
  } catch (const GraphError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("cycle"), std::string::npos) << message;
    EXPECT_NE(message.find("x -> y -> z -> x"), std::string::npos) << message;
  }
  EXPECT_THROW(g.validate(), GraphError);
}

TEST(OpGraph, AcyclicGraphHasNoCycle) {
  auto g = graph_of({{"a", "b"}, {"b", "c"}, {"a", "c"}});
  EXPECT_FALSE(g.find_cycle().has_value());
  EXPECT_NO_THROW(g.validate());
}

TEST(OpGraph, SourcesSinksAndReachability) {
  auto g = graph_of({{"a", "b"}, {"b", "d"}, {"c", "d"}, {"d", "e"}, {"d", "f"}});
  EXPECT_EQ(names(g, g.sources()), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(names(g, g.sinks()), (std::vector<std::string>{"e", "f"}));
  const NodeId a = *g.find("a");
  const NodeId c = *g.find("c");
  const NodeId f = *g.find("f");
  EXPECT_TRUE(g.reaches(a, f));
  EXPECT_FALSE(g.reaches(f, a));
  EXPECT_FALSE(g.reaches(a, c));
  auto from_c = g.reachable_from(c);
  EXPECT_EQ(std::count(from_c.begin(), from_c.end(), true), 4);  // c, d, e, f
}

TEST(OpGraph, RejectsBadEdgesAndNames) {
  auto g = graph_of({{"a", "b"}});
  EXPECT_THROW(g.add_edge(0, 1, 1.0), GraphError);   // duplicate
  EXPECT_THROW(g.add_edge(0, 0, 1.0), GraphError);   // self loop
  EXPECT_THROW(g.add_edge(0, 7, 1.0), GraphError);   // unknown node
  EXPECT_THROW(g.add_edge(1, 0, -1.0), GraphError);  // negative bytes
  graphpipe::graph::Node dup;
  dup.name = "a";
  EXPECT_THROW(g.add_node(dup), GraphError);
  EXPECT_THROW(g.add_node(graphpipe::graph::Node{}), GraphError);
}

TEST(OpGraph, OutputsMustBeReachableFromInputs) {
  auto g = graph_of({{"in", "h"}, {"h", "out"}, {"const", "other"}});
  g.mutable_node(*g.find("in")).is_input = true;
  g.mutable_node(*g.find("out")).is_output = true;
  EXPECT_NO_THROW(g.validate());
  g.mutable_node(*g.find("other")).is_output = true;
  try {
    g.validate();
    FAIL() << "an output unreachable from the inputs must be rejected";
  } catch (const GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("'other'"), std::string::npos) << e.what();
  }
}

TEST(OpGraph, FingerprintTellsModelsApart) {
  auto a = graph_of({{"a", "b"}, {"b", "c"}});
  auto same = graph_of({{"a", "b"}, {"b", "c"}});
  auto other = graph_of({{"a", "b"}, {"a", "c"}});
  EXPECT_EQ(a.fingerprint(), same.fingerprint());
  EXPECT_NE(a.fingerprint(), other.fingerprint());
}

TEST(OpGraph, SummaryNamesCountsAndStructure) {
  auto g = graph_of({{"a", "b"}, {"a", "c"}, {"b", "d"}, {"c", "d"}});
  auto text = g.summary();
  EXPECT_NE(text.find("4 nodes, 4 edges"), std::string::npos) << text;
  EXPECT_NE(text.find("series-parallel: yes"), std::string::npos) << text;
  EXPECT_NE(text.find("widest level: 2"), std::string::npos) << text;
}
