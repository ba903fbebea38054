// Small graphs for the C++ tests, built from an edge list of node names.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::testing {

// Nodes are created in first-appearance order; every edge carries 4 bytes per sample.
inline graph::OpGraph graph_of(const std::vector<std::pair<std::string, std::string>>& edges) {
  graph::OpGraph g;
  auto id = [&](const std::string& name) {
    if (auto found = g.find(name)) return *found;
    graph::Node n;
    n.name = name;
    n.op = "call_function";
    n.target = "op";
    n.forward_flops = 1.0;
    return g.add_node(n);
  };
  for (const auto& [a, b] : edges) {
    auto u = id(a);
    auto v = id(b);
    g.add_edge(u, v, 4.0);
  }
  return g;
}

}  // namespace graphpipe::testing
