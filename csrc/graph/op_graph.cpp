#include "graph/op_graph.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <queue>
#include <sstream>

#include "common/error.h"
#include "graph/series_parallel.h"

namespace graphpipe::graph {

std::int64_t ParamShape::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

namespace {

void check_param_shapes(const Node& node) {
  if (node.param_shapes.empty()) return;
  const std::string where = "node '" + node.name + "'";
  if (node.param_shapes.size() != node.params.size()) {
    throw GraphError(where + " has " + std::to_string(node.param_shapes.size()) + " parameter shapes for " +
                     std::to_string(node.params.size()) + " parameters");
  }
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < node.params.size(); ++i) {
    const ParamShape& p = node.param_shapes[i];
    if (p.name != node.params[i]) {
      throw GraphError(where + ": parameter shape " + std::to_string(i) + " is named '" + p.name +
                       "', the parameter is '" + node.params[i] + "'");
    }
    if (p.element_size < 1) {
      throw GraphError(where + ": parameter '" + p.name + "' has element size " + std::to_string(p.element_size));
    }
    if (p.dtype.empty()) throw GraphError(where + ": parameter '" + p.name + "' has no dtype");
    for (std::int64_t d : p.shape) {
      if (d < 0) throw GraphError(where + ": parameter '" + p.name + "' has a negative dimension");
    }
    bytes += p.bytes();
  }
  if (bytes != node.param_bytes) {
    throw GraphError(where + ": its parameter shapes hold " + std::to_string(bytes) + " bytes, param_bytes says " +
                     std::to_string(node.param_bytes));
  }
}

}  // namespace

NodeId OpGraph::add_node(Node node) {
  if (node.name.empty()) throw GraphError("a node needs a non-empty name");
  if (by_name_.count(node.name) != 0) {
    throw GraphError("duplicate node name '" + node.name + "'");
  }
  check_param_shapes(node);
  const auto id = static_cast<NodeId>(nodes_.size());
  by_name_.emplace(node.name, id);
  nodes_.push_back(std::move(node));
  out_.emplace_back();
  in_.emplace_back();
  return id;
}

void OpGraph::throw_bad_node(NodeId id) const {
  throw GraphError("node id " + std::to_string(id) + " is out of range (graph has " + std::to_string(nodes_.size()) +
                   " nodes)");
}

void OpGraph::throw_bad_edge(EdgeId id) { throw GraphError("edge id " + std::to_string(id) + " is out of range"); }

EdgeId OpGraph::add_edge(NodeId src, NodeId dst, double bytes_per_sample) {
  check_node(src);
  check_node(dst);
  if (src == dst) throw GraphError("self loop on node " + describe(*this, src));
  if (!(bytes_per_sample >= 0.0)) {
    throw GraphError("edge " + nodes_[src].name + " -> " + nodes_[dst].name + " has negative or NaN bytes");
  }
  for (EdgeId e : out_[src]) {
    if (edges_[e].dst == dst) {
      throw GraphError("duplicate edge " + nodes_[src].name + " -> " + nodes_[dst].name);
    }
  }
  const auto id = static_cast<EdgeId>(edges_.size());
  edges_.push_back(Edge{src, dst, bytes_per_sample});
  out_[src].push_back(id);
  in_[dst].push_back(id);
  return id;
}

const Node& OpGraph::node(NodeId id) const {
  check_node(id);
  return nodes_[id];
}

Node& OpGraph::mutable_node(NodeId id) {
  check_node(id);
  return nodes_[id];
}

std::optional<NodeId> OpGraph::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

std::vector<NodeId> OpGraph::successors(NodeId id) const {
  std::vector<NodeId> result;
  for (EdgeId e : out_edges(id)) result.push_back(edges_[e].dst);
  return result;
}

std::vector<NodeId> OpGraph::predecessors(NodeId id) const {
  std::vector<NodeId> result;
  for (EdgeId e : in_edges(id)) result.push_back(edges_[e].src);
  return result;
}

namespace {
template <typename Pred>
std::vector<NodeId> select(std::size_t n, Pred pred) {
  std::vector<NodeId> result;
  for (std::size_t i = 0; i < n; ++i) {
    if (pred(static_cast<NodeId>(i))) result.push_back(static_cast<NodeId>(i));
  }
  return result;
}
}  // namespace

std::vector<NodeId> OpGraph::sources() const {
  return select(nodes_.size(), [&](NodeId i) { return in_[i].empty(); });
}
std::vector<NodeId> OpGraph::sinks() const {
  return select(nodes_.size(), [&](NodeId i) { return out_[i].empty(); });
}
std::vector<NodeId> OpGraph::inputs() const {
  return select(nodes_.size(), [&](NodeId i) { return nodes_[i].is_input; });
}
std::vector<NodeId> OpGraph::outputs() const {
  return select(nodes_.size(), [&](NodeId i) { return nodes_[i].is_output; });
}

std::vector<NodeId> OpGraph::topological_order() const {
  std::vector<std::size_t> pending(nodes_.size());
  std::priority_queue<NodeId, std::vector<NodeId>, std::greater<>> ready;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    pending[i] = in_[i].size();
    if (pending[i] == 0) ready.push(static_cast<NodeId>(i));
  }
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    NodeId v = ready.top();
    ready.pop();
    order.push_back(v);
    for (EdgeId e : out_[v]) {
      if (--pending[edges_[e].dst] == 0) ready.push(edges_[e].dst);
    }
  }
  if (order.size() != nodes_.size()) {
    auto cycle = find_cycle();
    std::string names;
    if (cycle) {
      for (NodeId v : *cycle) names += nodes_[v].name + " -> ";
      names += nodes_[cycle->front()].name;
    }
    throw GraphError("the graph has a cycle: " + names);
  }
  return order;
}

std::optional<std::vector<NodeId>> OpGraph::find_cycle() const {
  // Iterative three-colour DFS; the grey stack is the current path, so a back edge to a grey
  // node closes a cycle made of the path's tail.
  enum : char { white, grey, black };
  std::vector<char> colour(nodes_.size(), white);
  std::vector<std::pair<NodeId, std::size_t>> stack;
  for (std::size_t root = 0; root < nodes_.size(); ++root) {
    if (colour[root] != white) continue;
    stack.emplace_back(static_cast<NodeId>(root), 0);
    colour[root] = grey;
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      if (next == out_[v].size()) {
        colour[v] = black;
        stack.pop_back();
        continue;
      }
      NodeId w = edges_[out_[v][next++]].dst;
      if (colour[w] == grey) {
        std::vector<NodeId> cycle;
        auto it = std::find_if(stack.begin(), stack.end(), [&](auto& f) { return f.first == w; });
        for (; it != stack.end(); ++it) cycle.push_back(it->first);
        return cycle;
      }
      if (colour[w] == white) {
        colour[w] = grey;
        stack.emplace_back(w, 0);
      }
    }
  }
  return std::nullopt;
}

std::vector<bool> OpGraph::reachable_from(NodeId from) const {
  check_node(from);
  std::vector<bool> seen(nodes_.size(), false);
  std::vector<NodeId> todo{from};
  seen[from] = true;
  while (!todo.empty()) {
    NodeId v = todo.back();
    todo.pop_back();
    for (EdgeId e : out_[v]) {
      NodeId w = edges_[e].dst;
      if (!seen[w]) {
        seen[w] = true;
        todo.push_back(w);
      }
    }
  }
  return seen;
}

bool OpGraph::reaches(NodeId from, NodeId to) const {
  check_node(to);
  return reachable_from(from)[to];
}

void OpGraph::validate() const {
  if (nodes_.empty()) throw GraphError("the graph has no nodes");
  for (const Node& n : nodes_) check_param_shapes(n);
  (void)topological_order();  // throws on a cycle, naming it
  std::vector<NodeId> starts = inputs();
  if (starts.empty()) starts = sources();
  std::vector<bool> seen(nodes_.size(), false);
  std::vector<NodeId> todo = starts;
  for (NodeId s : starts) seen[s] = true;
  while (!todo.empty()) {
    NodeId v = todo.back();
    todo.pop_back();
    for (EdgeId e : out_[v]) {
      if (!seen[edges_[e].dst]) {
        seen[edges_[e].dst] = true;
        todo.push_back(edges_[e].dst);
      }
    }
  }
  for (NodeId o : outputs()) {
    if (!seen[o]) {
      throw GraphError("output " + describe(*this, o) + " is not reachable from any input");
    }
  }
}

double OpGraph::total_forward_flops() const {
  double total = 0.0;
  for (const Node& n : nodes_) total += n.forward_flops;
  return total;
}

std::int64_t OpGraph::total_param_bytes() const {
  std::int64_t total = 0;
  for (const Node& n : nodes_) total += n.param_bytes;
  return total;
}

std::string OpGraph::fingerprint() const {
  // FNV-1a, 64 bit: cheap, stable across platforms, and enough to tell models apart.
  std::uint64_t hash = 1469598103934665603ULL;
  auto mix = [&](std::string_view text) {
    for (unsigned char c : text) {
      hash ^= c;
      hash *= 1099511628211ULL;
    }
    hash ^= 0xff;
    hash *= 1099511628211ULL;
  };
  for (const Node& n : nodes_) {
    mix(n.name);
    mix(n.op);
    mix(n.target);
  }
  for (const Edge& e : edges_) {
    mix(std::to_string(e.src) + ">" + std::to_string(e.dst));
  }
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(hash));
  return buffer;
}

std::string OpGraph::summary() const {
  std::ostringstream out;
  out << "OpGraph";
  if (!model_name.empty()) out << " of " << model_name;
  out << ": " << nodes_.size() << " nodes, " << edges_.size() << " edges\n";
  auto names = [&](const std::vector<NodeId>& ids) {
    std::string text;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i == 6) {
        text += ", ... (" + std::to_string(ids.size()) + " in all)";
        break;
      }
      text += (i ? ", " : "") + nodes_[ids[i]].name;
    }
    return text;
  };
  out << "  inputs:  " << names(inputs()) << "\n";
  out << "  outputs: " << names(outputs()) << "\n";
  out << "  forward GFLOPs per sample: " << total_forward_flops() / 1e9
      << ", parameters: " << static_cast<double>(total_param_bytes()) / (1 << 20) << " MiB"
      << ", traced at batch " << trace_batch_size << " in " << to_string(compute_precision) << "\n";
  try {
    auto order = topological_order();
    // Width: the most nodes that share one depth level, a quick view of the branching.
    std::vector<int> depth(nodes_.size(), 0);
    int max_depth = 0;
    for (NodeId v : order) {
      for (EdgeId e : out_[v]) depth[edges_[e].dst] = std::max(depth[edges_[e].dst], depth[v] + 1);
      max_depth = std::max(max_depth, depth[v]);
    }
    std::vector<int> width(static_cast<std::size_t>(max_depth) + 1, 0);
    for (int d : depth) ++width[d];
    out << "  longest path: " << max_depth + 1
        << " nodes, widest level: " << *std::max_element(width.begin(), width.end()) << " nodes\n";
    auto sp = decompose_series_parallel(*this);
    if (sp.is_series_parallel) {
      out << "  series-parallel: yes, widest parallel split: " << sp.tree.widest_parallel() << "\n";
    } else {
      out << "  series-parallel: no (" << sp.report << ")\n";
    }
  } catch (const GraphError& e) {
    out << "  invalid: " << e.what() << "\n";
  }
  return out.str();
}

std::string describe(const OpGraph& graph, NodeId id) {
  const Node& n = graph.node(id);
  return "'" + n.name + "' (" + n.op + " " + n.target + ")";
}

}  // namespace graphpipe::graph
