#include "runtime/split_backward.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/node.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace graphpipe::runtime {

namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using NodePtr = c10::intrusive_ptr<Node>;

// The graph below some roots, children before parents (an iterative depth-first post-order: a
// deep stage's graph would overflow a recursive one), with every node's children by position in
// that order (one hash lookup per node, when it is first met; the passes after the walk read
// positions only). Holding the nodes keeps them alive while the split runs.
struct Walk {
  std::vector<NodePtr> nodes;
  // Where a node lies in `nodes` (roots' lookups).
  int at(Node* n) const { return position[met_at.at(n)]; }
  std::unordered_map<Node*, int> met_at;  // the order in which the walk met the nodes
  std::vector<int> position;              // met order -> position in `nodes`
  // Node i's edges, as positions in `nodes` (-1: an edge to no node), edges i's of
  // child_begin[i] .. child_begin[i + 1] of `children`, in next_edges() order.
  std::vector<int> child_begin;
  std::vector<int> children;
  int child(std::size_t i, std::size_t k) const { return children[child_begin[i] + k]; }
};

Walk walk(const edge_list& roots) {
  Walk g;
  // Nodes are numbered when first met (pre-order); `order` keeps the post-order, renumbered at
  // the end.
  std::vector<NodePtr> met;
  std::vector<int> order;
  std::vector<std::vector<int>> kids;
  g.met_at.reserve(512);
  std::vector<std::pair<int, std::size_t>> stack;
  auto enter = [&](const NodePtr& n) -> int {
    if (!n) return -1;
    auto [it, fresh] = g.met_at.try_emplace(n.get(), static_cast<int>(met.size()));
    if (!fresh) return it->second;
    met.push_back(n);
    kids.emplace_back();
    kids.back().reserve(n->num_outputs());
    stack.emplace_back(it->second, 0);
    return it->second;
  };
  for (const auto& root : roots) {
    enter(root.function);
    while (!stack.empty()) {
      const int id = stack.back().first;
      const std::size_t k = stack.back().second;
      Node* n = met[id].get();
      if (k < n->num_outputs()) {
        ++stack.back().second;
        const int c = enter(n->next_edge(k).function);  // may reallocate `stack`: nothing of it is held
        kids[id].push_back(c);
      } else {
        order.push_back(id);
        stack.pop_back();
      }
    }
  }
  std::vector<int>& position = g.position;
  position.resize(met.size());
  for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  g.nodes.reserve(order.size());
  g.child_begin.reserve(order.size() + 1);
  for (int id : order) {
    g.child_begin.push_back(static_cast<int>(g.children.size()));
    for (int c : kids[id]) g.children.push_back(c < 0 ? -1 : position[c]);
    g.nodes.push_back(std::move(met[id]));
  }
  g.child_begin.push_back(static_cast<int>(g.children.size()));
  return g;
}

// Records the gradients arriving at a join during I.
class Capture final : public torch::autograd::FunctionPreHook {
 public:
  explicit Capture(std::vector<at::Tensor>* slot) : slot_(slot) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    *slot_ = grads;
    return grads;
  }

 private:
  std::vector<at::Tensor>* slot_;
};

// Removes the capture hooks when I ends, also when it throws: the nodes outlive the split.
class CaptureGuard {
 public:
  CaptureGuard() = default;
  CaptureGuard(const CaptureGuard&) = delete;
  CaptureGuard& operator=(const CaptureGuard&) = delete;
  ~CaptureGuard() {
    for (auto& [node, hook] : hooks_) {
      auto& list = node->pre_hooks();
      list.erase(std::remove_if(list.begin(), list.end(), [&](const auto& h) { return h.get() == hook; }), list.end());
    }
  }
  void add(const NodePtr& node, std::vector<at::Tensor>* slot) {
    auto hook = std::make_unique<Capture>(slot);
    hooks_.emplace_back(node, hook.get());
    node->add_pre_hook(std::move(hook));
  }

 private:
  std::vector<std::pair<NodePtr, torch::autograd::FunctionPreHook*>> hooks_;
};

// backward_input's reading of the walked graph, per node (g.nodes order).
struct Marks {
  std::vector<char> on_path;   // on the input path: autograd runs it in I, or it is an input's
  std::vector<char> runs;      // autograd runs it in I
  std::vector<char> to_param;  // leads to a parameter
  std::vector<char> join;      // runs in I and has an edge off the path to a parameter
  std::vector<int> consumers;  // edges into it from the walked graph
};

Marks mark(const Walk& g, const std::unordered_set<Node*>& input_nodes, const std::unordered_set<Node*>& param_nodes) {
  const std::size_t n = g.nodes.size();
  Marks m{std::vector<char>(n, 0), std::vector<char>(n, 0), std::vector<char>(n, 0), std::vector<char>(n, 0),
          std::vector<int>(n, 0)};
  for (std::size_t i = 0; i < n; ++i) {  // children first
    Node* node = g.nodes[i].get();
    bool leads_in = false, leads_to_param = param_nodes.count(node) > 0, leaves_path = false;
    for (std::size_t k = 0; k < node->num_outputs(); ++k) {
      const int c = g.child(i, k);
      if (c < 0) continue;
      ++m.consumers[c];
      leads_in = leads_in || m.on_path[c];
      leads_to_param = leads_to_param || m.to_param[c];
      leaves_path = leaves_path || (!m.on_path[c] && m.to_param[c]);
    }
    m.runs[i] = leads_in;
    m.on_path[i] = leads_in || input_nodes.count(node) > 0;
    m.to_param[i] = leads_to_param;
    m.join[i] = leads_in && leaves_path;
  }
  return m;
}

// Whether I should compute a join's parameter gradients itself, with its input gradient: a
// normalisation's backward (layer, batch, group norm) computes the input, weight and bias
// gradients in one fused pass over its saved activations; split, W would make that pass a second
// time for the weight and bias alone, which made I + W of a Transformer stage cost 10-15% more
// than its B. The weight and bias gradients of a norm are reductions as cheap as one elementwise
// pass, so moving them into I costs I little. Only when every parameter-side edge goes straight
// to a parameter's accumulator that nothing else in the graph feeds and that has no tensor hooks:
// I captures the gradient at the accumulator (running its tensor hooks), and W feeds it to the
// accumulator, which would run them again.
bool fuse_join(std::size_t i, const Walk& g, const Marks& m, const std::unordered_set<Node*>& param_nodes) {
  const Node& node = *g.nodes[i];
  if (node.name().find("NormBackward") == std::string::npos) return false;
  for (std::size_t k = 0; k < node.num_outputs(); ++k) {
    const int c = g.child(i, k);
    if (c < 0) continue;
    const Edge& e = node.next_edge(k);
    if (m.on_path[c] || !m.to_param[c]) continue;
    if (!param_nodes.count(e.function.get()) || m.consumers[c] != 1 || !e.function->tensor_pre_hooks().empty() ||
        !e.function->retains_grad_hooks().empty()) {
      return false;
    }
  }
  return true;
}

}  // namespace

void PendingWeights::run() {
  if (roots_.empty()) return;
  edge_list roots = std::move(roots_);
  std::vector<at::Tensor> grads = std::move(grads_);
  edge_list params = std::move(params_);
  roots_.clear();
  grads_.clear();
  params_.clear();
  // accumulate_grad with outputs: backward(inputs=params), so a parameter's accumulator (and the
  // hooks on it, gradient_buckets.h's) runs as in a plain backward.
  torch::autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                        /*accumulate_grad=*/true, params);
}

namespace {

// I's autograd call: the gradients of the roots with respect to `wanted` (inputs and the fused
// joins' parameters), graph kept when W still needs it.
std::vector<at::Tensor> input_half(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                                   const std::vector<at::Tensor>& wanted, bool keep) {
  if (roots.empty() || wanted.empty()) return std::vector<at::Tensor>(wanted.size());
  return torch::autograd::grad(roots, wanted, grads, keep, /*create_graph=*/false, /*allow_unused=*/true);
}

// Where W starts (edges into the graph I kept, or straight into accumulators) and with what.
struct WeightStart {
  edge_list roots;
  std::vector<at::Tensor> grads;
};

// W starts at a join, fed what arrived there during I. The join's input-path outputs were I's:
// they are cut, so that W computes only the parameter-side ones. (set_next_edge would assert on a
// node that has a parent; an edge made invalid only lowers what the node's topological number
// could be, which autograd reads as a bound.)
void start_at_join(const Walk& g, const Marks& m, std::size_t i, std::vector<at::Tensor>& arrived, WeightStart& start) {
  const NodePtr& node = g.nodes[i];
  auto& edges = node->next_edges();
  for (std::size_t k = 0; k < edges.size(); ++k) {
    const int c = g.child(i, k);
    if (c >= 0 && m.on_path[c]) edges[k] = Edge();
  }
  for (std::size_t k = 0; k < arrived.size(); ++k) {
    if (!arrived[k].defined()) continue;
    start.roots.emplace_back(node, static_cast<uint32_t>(k));
    start.grads.push_back(std::move(arrived[k]));
  }
}

// I over a graph whose inputs are leaves (backward_input's main case, described in the header):
// writes the inputs' gradients to `leaf_grads` and returns where W starts. `params[k]` is the
// parameter of `param_edges[k]`.
WeightStart split(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                  const edge_list& root_edges, const std::vector<at::Tensor>& leaves,
                  const std::vector<at::Tensor>& params, const edge_list& param_edges,
                  std::vector<at::Tensor>& leaf_grads) {
  Walk g = walk(root_edges);
  std::unordered_set<Node*> input_nodes, param_nodes;
  std::unordered_map<Node*, const at::Tensor*> param_of;
  for (const auto& t : leaves) input_nodes.insert(torch::autograd::impl::gradient_edge(t).function.get());
  for (std::size_t k = 0; k < param_edges.size(); ++k) {
    param_nodes.insert(param_edges[k].function.get());
    param_of.emplace(param_edges[k].function.get(), &params[k]);
  }
  const Marks m = mark(g, input_nodes, param_nodes);
  const std::size_t n = g.nodes.size();
  // The joins W starts from; the fused joins' parameters, whose gradients I computes.
  std::vector<std::size_t> joins;
  std::vector<char> fused(n, 0);
  std::vector<at::Tensor> wanted = leaves;
  edge_list accumulators;
  for (std::size_t i = 0; i < n; ++i) {
    if (!m.join[i]) continue;
    if (!fuse_join(i, g, m, param_nodes)) {
      joins.push_back(i);
      continue;
    }
    fused[i] = 1;
    for (const auto& e : g.nodes[i]->next_edges()) {
      if (!e.function || !param_nodes.count(e.function.get())) continue;
      wanted.push_back(*param_of.at(e.function.get()));
      accumulators.push_back(e);
    }
  }
  std::vector<std::size_t> off_path_roots;
  for (std::size_t k = 0; k < roots.size(); ++k) {
    Node* node = root_edges[k].function.get();
    if (!node) continue;
    const int i = g.at(node);
    if (!m.on_path[i] && m.to_param[i]) off_path_roots.push_back(k);
  }
  // W needs the graph only to run the joins and the roots off the input path again.
  const bool keep = !joins.empty() || !off_path_roots.empty();
  std::vector<std::vector<at::Tensor>> arrived(joins.size());
  std::vector<at::Tensor> got;
  {
    CaptureGuard guard;
    for (std::size_t j = 0; j < joins.size(); ++j) guard.add(g.nodes[joins[j]], &arrived[j]);
    got = input_half(roots, grads, wanted, keep);
  }
  leaf_grads.assign(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(leaves.size()));
  WeightStart start;
  for (std::size_t k = 0; k < accumulators.size(); ++k) {
    at::Tensor& grad = got[leaves.size() + k];
    if (!grad.defined()) continue;
    start.roots.push_back(accumulators[k]);
    start.grads.push_back(std::move(grad));
  }
  for (std::size_t j = 0; j < joins.size(); ++j) start_at_join(g, m, joins[j], arrived[j], start);
  for (std::size_t k : off_path_roots) {
    start.roots.push_back(root_edges[k]);
    start.grads.push_back(grads[k]);
  }
  // The input path's other nodes never run again: free their saved activations now rather than
  // when the last reference to them goes (a join's saved tensor can hold one).
  for (std::size_t i = 0; i < n; ++i) {
    if (m.runs[i] && (!m.join[i] || fused[i])) g.nodes[i]->release_variables();
  }
  return start;
}

}  // namespace

PendingWeights backward_input(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
                              std::vector<at::Tensor>* input_grads) {
  TORCH_CHECK(roots.size() == grads.size(), "backward_input: ", roots.size(), " roots but ", grads.size(),
              " gradients");
  if (input_grads) input_grads->assign(inputs.size(), at::Tensor());
  PendingWeights pending;
  std::vector<at::Tensor> trainable;
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    trainable.push_back(p);
    pending.params_.push_back(torch::autograd::impl::gradient_edge(p));
  }
  std::vector<std::size_t> wanted;  // inputs that need a gradient
  std::vector<at::Tensor> leaves;
  bool all_leaves = true;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined() || !inputs[k].requires_grad()) continue;
    wanted.push_back(k);
    leaves.push_back(inputs[k]);
    all_leaves = all_leaves && inputs[k].is_leaf();
  }
  auto give = [&](const std::vector<at::Tensor>& got) {
    if (!input_grads) return;
    for (std::size_t k = 0; k < wanted.size(); ++k) (*input_grads)[wanted[k]] = got[k];
  };
  edge_list root_edges;
  root_edges.reserve(roots.size());
  for (const auto& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
  if (pending.params_.empty()) {  // no W: I is the whole backward
    give(input_half(roots, grads, leaves, false));
    return pending;
  }
  if (leaves.empty() || !all_leaves) {
    // No input path (or inputs that are not leaves, whose graph below this function cannot
    // tell apart): W is the plain backward of the roots to the parameters, I only the inputs'.
    give(input_half(roots, grads, leaves, true));
    pending.roots_ = std::move(root_edges);
    pending.grads_ = grads;
    return pending;
  }
  std::vector<at::Tensor> leaf_grads;
  WeightStart start = split(roots, grads, root_edges, leaves, trainable, pending.params_, leaf_grads);
  give(leaf_grads);
  pending.roots_ = std::move(start.roots);
  pending.grads_ = std::move(start.grads);
  return pending;
}

}  // namespace graphpipe::runtime
