#include "graph/series_parallel.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace graphpipe::graph {

std::vector<NodeId> SPTree::leaves(int index) const {
  std::vector<NodeId> result;
  std::vector<int> todo{index};
  while (!todo.empty()) {
    int i = todo.back();
    todo.pop_back();
    const SPNode& n = nodes.at(static_cast<std::size_t>(i));
    if (n.kind == SPNode::Kind::leaf) {
      result.push_back(n.op);
    } else {
      for (auto it = n.children.rbegin(); it != n.children.rend(); ++it) todo.push_back(*it);
    }
  }
  return result;
}

int SPTree::widest_parallel() const {
  int widest = nodes.empty() ? 0 : 1;
  for (const SPNode& n : nodes) {
    if (n.kind == SPNode::Kind::parallel) widest = std::max(widest, static_cast<int>(n.children.size()));
  }
  return widest;
}

std::string SPTree::to_string(const OpGraph& graph) const {
  std::string out;
  auto visit = [&](auto& self, int i) -> void {
    const SPNode& n = nodes.at(static_cast<std::size_t>(i));
    if (n.kind == SPNode::Kind::leaf) {
      out += graph.node(n.op).name;
      return;
    }
    out += n.kind == SPNode::Kind::series ? "S(" : "P(";
    for (std::size_t c = 0; c < n.children.size(); ++c) {
      if (c) out += ", ";
      self(self, n.children[c]);
    }
    out += ")";
  };
  if (root >= 0) visit(visit, root);
  return out;
}

namespace {

constexpr int kEmpty = -1;  // a fragment with no operator (a plain edge)

// Builds the tree while reducing: every live edge of the working multigraph carries the
// fragment of operators strictly between its two ends.
class Reducer {
 public:
  explicit Reducer(const OpGraph& graph) : graph_(graph) {
    const int n = static_cast<int>(graph.num_nodes());
    source_ = n;
    sink_ = n + 1;
    out_.resize(n + 2);
    in_.resize(n + 2);
    removed_.assign(n + 2, false);
    for (const Edge& e : graph.edges()) add_edge(e.src, e.dst, kEmpty);
    for (NodeId s : graph.sources()) add_edge(source_, s, kEmpty);
    for (NodeId t : graph.sinks()) add_edge(t, sink_, kEmpty);
  }

  SPDecomposition run() {
    // Visit in topological order first so that chains collapse front to back; then drain the
    // worklist of vertices whose neighbourhood changed.
    std::vector<int> work;
    auto order = graph_.topological_order();
    for (auto it = order.rbegin(); it != order.rend(); ++it) work.push_back(*it);
    work.push_back(source_);
    work.push_back(sink_);
    while (!work.empty()) {
      int v = work.back();
      work.pop_back();
      if (removed_[v]) continue;
      merge_parallel(v, out_, work, true);
      merge_parallel(v, in_, work, false);
      if (v == source_ || v == sink_) continue;
      auto ins = live(in_[v]);
      auto outs = live(out_[v]);
      if (ins.size() == 1 && outs.size() == 1) {
        Link a = links_[ins[0]];
        Link b = links_[outs[0]];
        links_[ins[0]].alive = links_[outs[0]].alive = false;
        removed_[v] = true;
        add_edge(a.u, b.v, series({a.fragment, leaf(v), b.fragment}));
        work.push_back(a.u);
        work.push_back(b.v);
      }
    }
    SPDecomposition result;
    auto final_edges = live(out_[source_]);
    std::vector<NodeId> left;
    for (int v = 0; v < source_; ++v) {
      if (!removed_[v]) left.push_back(v);
    }
    if (left.empty() && final_edges.size() == 1 && links_[final_edges[0]].v == sink_ &&
        links_[final_edges[0]].fragment != kEmpty) {
      result.is_series_parallel = true;
      result.tree = compact(links_[final_edges[0]].fragment);
      return result;
    }
    result.irreducible = left;
    std::string names;
    for (std::size_t i = 0; i < left.size() && i < 8; ++i) {
      names += (i ? ", " : "") + describe(graph_, left[i]);
    }
    if (left.size() > 8) names += ", ...";
    result.report = std::to_string(left.size()) + " operators remain after all series and parallel reductions (" +
                    names +
                    "); paths between them cross (an N-shaped dependency), which no nesting of "
                    "series and parallel compositions expresses";
    return result;
  }

 private:
  struct Link {
    int u;
    int v;
    int fragment;
    bool alive;
  };

  void add_edge(int u, int v, int fragment) {
    links_.push_back(Link{u, v, fragment, true});
    int id = static_cast<int>(links_.size()) - 1;
    out_[u].push_back(id);
    in_[v].push_back(id);
  }

  // Drops dead links from an adjacency list and returns it.
  std::vector<int>& live(std::vector<int>& list) {
    std::erase_if(list, [&](int id) { return !links_[id].alive; });
    return list;
  }

  // Merges links of v that share their other end (outgoing: same head; incoming: same tail).
  void merge_parallel(int v, std::vector<std::vector<int>>& adjacency, std::vector<int>& work, bool outgoing) {
    std::map<int, int> first_by_end;
    bool merged = false;
    for (int id : live(adjacency[v])) {
      int other = outgoing ? links_[id].v : links_[id].u;
      auto [it, fresh] = first_by_end.emplace(other, id);
      if (fresh) continue;
      Link& keep = links_[it->second];
      keep.fragment = parallel(keep.fragment, links_[id].fragment);
      links_[id].alive = false;
      work.push_back(other);
      merged = true;
    }
    if (merged) live(adjacency[v]);
  }

  int leaf(int op) {
    tree_.push_back(SPNode{SPNode::Kind::leaf, op, {}});
    return static_cast<int>(tree_.size()) - 1;
  }

  int combine(SPNode::Kind kind, const std::vector<int>& parts) {
    std::vector<int> children;
    for (int p : parts) {
      if (p == kEmpty) continue;
      if (tree_[p].kind == kind) {
        children.insert(children.end(), tree_[p].children.begin(), tree_[p].children.end());
      } else {
        children.push_back(p);
      }
    }
    if (children.empty()) return kEmpty;
    if (children.size() == 1) return children[0];
    tree_.push_back(SPNode{kind, -1, std::move(children)});
    return static_cast<int>(tree_.size()) - 1;
  }

  int series(const std::vector<int>& parts) { return combine(SPNode::Kind::series, parts); }
  int parallel(int a, int b) { return combine(SPNode::Kind::parallel, {a, b}); }

  // Copies the part of the working tree that the root reaches (flattening left orphans behind).
  SPTree compact(int root) {
    SPTree tree;
    auto copy = [&](auto& self, int i) -> int {
      SPNode node = tree_[i];
      for (int& c : node.children) c = self(self, c);
      tree.nodes.push_back(std::move(node));
      return static_cast<int>(tree.nodes.size()) - 1;
    };
    tree.root = copy(copy, root);
    return tree;
  }

  const OpGraph& graph_;
  int source_ = 0;
  int sink_ = 0;
  std::vector<Link> links_;
  std::vector<std::vector<int>> out_;
  std::vector<std::vector<int>> in_;
  std::vector<bool> removed_;
  std::vector<SPNode> tree_;
};

}  // namespace

SPDecomposition decompose_series_parallel(const OpGraph& graph) {
  if (graph.num_nodes() == 0) throw GraphError("cannot decompose an empty graph");
  return Reducer(graph).run();
}

}  // namespace graphpipe::graph
