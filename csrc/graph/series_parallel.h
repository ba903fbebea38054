// Series-parallel decomposition of an OpGraph.
//
// The tree describes the operators as nested compositions:
//   - leaf: one operator;
//   - series: children run one after another (every path from the first to the last child
//     passes through each child in order);
//   - parallel: children are independent branches between the same two enclosing operators.
// Series children are flattened (no series child of a series node), and so are parallel ones.
// A direct edge that bypasses a branch (a skip connection) adds no tree node: the tree
// partitions operators, and edges stay in the OpGraph.
//
// Method: a graph with several sources or sinks gets a virtual source and sink; then series
// reductions (an operator with one incoming and one outgoing edge) and parallel reductions
// (edges with the same ends) are applied until none applies, in O((V + E) log V). The graph is
// series-parallel iff one edge between the virtual terminals remains. Otherwise the operators
// left over are reported: they form a pattern (such as an N-shaped crossing of two paths) that
// no nesting of series and parallel compositions can express.
#pragma once

#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::graph {

struct SPNode {
  enum class Kind { leaf, series, parallel };
  Kind kind = Kind::leaf;
  NodeId op = -1;             // the operator, for a leaf
  std::vector<int> children;  // indices into SPTree::nodes, for series and parallel
};

class SPTree {
 public:
  std::vector<SPNode> nodes;
  int root = -1;

  // Operators in the subtree of `index`, series children in order, parallel ones in turn.
  std::vector<NodeId> leaves(int index) const;
  // The most children of any parallel node (1 for a chain): how many branches can run at once.
  int widest_parallel() const;
  // Nested text: S(a, P(S(b, c), d), e).
  std::string to_string(const OpGraph& graph) const;
};

struct SPDecomposition {
  bool is_series_parallel = false;
  SPTree tree;                      // meaningful only when is_series_parallel
  std::vector<NodeId> irreducible;  // operators left after all reductions, when not
  std::string report;               // one line: why the graph is not series-parallel
};

// Never throws for a valid DAG; throws GraphError (naming the cycle) for a cyclic graph.
SPDecomposition decompose_series_parallel(const OpGraph& graph);

}  // namespace graphpipe::graph
