#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "graph/series_parallel.h"
#include "graph_builders.h"

using graphpipe::graph::decompose_series_parallel;
using graphpipe::graph::NodeId;
using graphpipe::graph::OpGraph;
using graphpipe::graph::SPNode;
using graphpipe::testing::graph_of;

namespace {

std::string tree_text(const OpGraph& g) {
  auto d = decompose_series_parallel(g);
  EXPECT_TRUE(d.is_series_parallel) << d.report;
  return d.tree.to_string(g);
}

// Every operator appears exactly once among the leaves.
void expect_partition(const OpGraph& g) {
  auto d = decompose_series_parallel(g);
  ASSERT_TRUE(d.is_series_parallel) << d.report;
  auto leaves = d.tree.leaves(d.tree.root);
  std::sort(leaves.begin(), leaves.end());
  std::vector<NodeId> all(g.num_nodes());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<NodeId>(i);
  EXPECT_EQ(leaves, all);
}

}  // namespace

TEST(SeriesParallel, ChainIsOneSeries) {
  auto g = graph_of({{"a", "b"}, {"b", "c"}, {"c", "d"}});
  EXPECT_EQ(tree_text(g), "S(a, b, c, d)");
  expect_partition(g);
}

TEST(SeriesParallel, SingleNode) {
  OpGraph g;
  graphpipe::graph::Node n;
  n.name = "only";
  g.add_node(n);
  EXPECT_EQ(tree_text(g), "only");
}

TEST(SeriesParallel, ForkJoinBranchesArePartsOfOneParallel) {
  auto g = graph_of({{"fork", "a1"},
                     {"a1", "a2"},
                     {"a2", "join"},
                     {"fork", "b1"},
                     {"b1", "join"},
                     {"fork", "c1"},
                     {"c1", "c2"},
                     {"c2", "join"}});
  EXPECT_EQ(tree_text(g), "S(fork, P(S(a1, a2), b1, S(c1, c2)), join)");
  auto d = decompose_series_parallel(g);
  EXPECT_EQ(d.tree.widest_parallel(), 3);
}

TEST(SeriesParallel, SkipConnectionAddsNoBranch) {
  // A residual block: x -> f -> g -> add, and x -> add directly.
  auto g = graph_of({{"x", "f"}, {"f", "g"}, {"g", "add"}, {"x", "add"}, {"add", "out"}});
  EXPECT_EQ(tree_text(g), "S(x, f, g, add, out)");
}

TEST(SeriesParallel, SeveralInputsAndOutputs) {
  // Two independent inputs joined, then two heads: sources and sinks share virtual terminals.
  auto g = graph_of({{"in1", "m1"}, {"in2", "m2"}, {"m1", "cat"}, {"m2", "cat"}, {"cat", "head1"}, {"cat", "head2"}});
  EXPECT_EQ(tree_text(g), "S(P(S(in1, m1), S(in2, m2)), cat, P(head1, head2))");
  expect_partition(g);
}

TEST(SeriesParallel, NestedParallel) {
  auto g =
      graph_of({{"s", "a"}, {"a", "a1"}, {"a", "a2"}, {"a1", "aj"}, {"a2", "aj"}, {"aj", "t"}, {"s", "b"}, {"b", "t"}});
  EXPECT_EQ(tree_text(g), "S(s, P(S(a, P(a1, a2), aj), b), t)");
}

TEST(SeriesParallel, NGraphIsNotSeriesParallel) {
  // The forbidden pattern: a->c, a->d, b->d with a common source and sink.
  auto g = graph_of({{"s", "a"}, {"s", "b"}, {"a", "c"}, {"a", "d"}, {"b", "d"}, {"c", "t"}, {"d", "t"}});
  auto d = decompose_series_parallel(g);
  EXPECT_FALSE(d.is_series_parallel);
  std::set<std::string> left;
  for (NodeId id : d.irreducible) left.insert(g.node(id).name);
  EXPECT_TRUE(left.count("a") && left.count("d")) << d.report;
  EXPECT_NE(d.report.find("N-shaped"), std::string::npos) << d.report;
  EXPECT_NE(d.report.find("'a'"), std::string::npos) << d.report;
}

TEST(SeriesParallel, RandomSeriesParallelCompositionsDecompose) {
  // Build random graphs by nesting series and parallel compositions, then check that the
  // decomposition recovers a tree whose leaves are all operators.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    OpGraph g;
    int counter = 0;
    auto fresh = [&] {
      graphpipe::graph::Node n;
      n.name = "n" + std::to_string(counter++);
      return g.add_node(n);
    };
    // Each composition returns (entry, exit) nodes.
    auto build = [&](auto& self, int depth) -> std::pair<NodeId, NodeId> {
      int choice = depth == 0 ? 0 : static_cast<int>(rng() % 3);
      if (choice == 0) {
        NodeId v = fresh();
        return {v, v};
      }
      if (choice == 1) {
        auto [a_in, a_out] = self(self, depth - 1);
        auto [b_in, b_out] = self(self, depth - 1);
        g.add_edge(a_out, b_in, 1.0);
        return {a_in, b_out};
      }
      NodeId fork = fresh();
      NodeId join = fresh();
      int branches = 2 + static_cast<int>(rng() % 3);
      for (int b = 0; b < branches; ++b) {
        auto [in, out] = self(self, depth - 1);
        g.add_edge(fork, in, 1.0);
        g.add_edge(out, join, 1.0);
      }
      return {fork, join};
    };
    build(build, 4);
    expect_partition(g);
  }
}
