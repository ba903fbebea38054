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
// deep stage's graph would overflow a recursive one). Holding the nodes keeps them alive while
// the split runs.
struct Walk {
  std::vector<NodePtr> nodes;
  std::unordered_map<Node*, int> index;
};

Walk walk(const edge_list& roots) {
  Walk g;
  std::vector<std::pair<NodePtr, std::size_t>> stack;
  auto enter = [&](const NodePtr& n) {
    if (!n || g.index.count(n.get())) return;
    g.index.emplace(n.get(), -1);
    stack.emplace_back(n, 0);
  };
  for (const auto& root : roots) {
    enter(root.function);
    while (!stack.empty()) {
      Node* n = stack.back().first.get();
      const std::size_t k = stack.back().second;
      if (k < n->num_outputs()) {
        ++stack.back().second;
        enter(n->next_edge(k).function);  // may reallocate `stack`: nothing of it is held
      } else {
        g.index[n] = static_cast<int>(g.nodes.size());
        g.nodes.push_back(std::move(stack.back().first));
        stack.pop_back();
      }
    }
  }
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
      list.erase(std::remove_if(list.begin(), list.end(), [&](const auto& h) { return h.get() == hook; }),
                 list.end());
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

PendingWeights backward_input(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
                              std::vector<at::Tensor>* input_grads) {
  TORCH_CHECK(roots.size() == grads.size(), "backward_input: ", roots.size(), " roots but ", grads.size(),
              " gradients");
  if (input_grads) input_grads->assign(inputs.size(), at::Tensor());
  PendingWeights pending;
  for (const auto& p : params) {
    if (p.requires_grad()) pending.params_.push_back(torch::autograd::impl::gradient_edge(p));
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
  edge_list root_edges;
  root_edges.reserve(roots.size());
  for (const auto& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
  auto run_input_half = [&](bool keep) {
    if (roots.empty() || leaves.empty()) return;
    auto got = torch::autograd::grad(roots, leaves, grads, keep, /*create_graph=*/false, /*allow_unused=*/true);
    if (input_grads) {
      for (std::size_t k = 0; k < wanted.size(); ++k) (*input_grads)[wanted[k]] = got[k];
    }
  };
  if (pending.params_.empty()) {  // no W: I is the whole backward
    run_input_half(false);
    return pending;
  }
  if (leaves.empty() || !all_leaves) {
    // No input path (or inputs that are not leaves, whose graph below this function cannot
    // tell apart): W is the plain backward of the roots to the parameters, I only the inputs'.
    run_input_half(true);
    pending.roots_ = std::move(root_edges);
    pending.grads_ = grads;
    return pending;
  }

  Walk g = walk(root_edges);
  const std::size_t n = g.nodes.size();
  std::vector<char> on_path(n, 0), runs(n, 0), to_param(n, 0), join(n, 0);
  std::unordered_set<Node*> input_nodes, param_nodes;
  for (const auto& t : leaves) input_nodes.insert(torch::autograd::impl::gradient_edge(t).function.get());
  for (const auto& e : pending.params_) param_nodes.insert(e.function.get());
  for (std::size_t i = 0; i < n; ++i) {  // children first
    Node* node = g.nodes[i].get();
    bool leads_in = false, leads_to_param = param_nodes.count(node) > 0, leaves_path = false;
    for (const auto& e : node->next_edges()) {
      if (!e.function) continue;
      const int c = g.index.at(e.function.get());
      leads_in = leads_in || on_path[c];
      leads_to_param = leads_to_param || to_param[c];
      leaves_path = leaves_path || (!on_path[c] && to_param[c]);
    }
    runs[i] = leads_in;  // autograd runs it in I
    on_path[i] = leads_in || input_nodes.count(node) > 0;
    to_param[i] = leads_to_param;
    join[i] = leads_in && leaves_path;
  }

  std::vector<std::size_t> joins;
  for (std::size_t i = 0; i < n; ++i) {
    if (join[i]) joins.push_back(i);
  }
  std::vector<std::size_t> off_path_roots;
  for (std::size_t k = 0; k < roots.size(); ++k) {
    Node* node = root_edges[k].function.get();
    if (!node) continue;
    const int i = g.index.at(node);
    if (!on_path[i] && to_param[i]) off_path_roots.push_back(k);
  }
  const bool weights = !joins.empty() || !off_path_roots.empty();
  std::vector<std::vector<at::Tensor>> arrived(joins.size());
  {
    CaptureGuard guard;
    if (weights) {
      for (std::size_t j = 0; j < joins.size(); ++j) guard.add(g.nodes[joins[j]], &arrived[j]);
    }
    run_input_half(weights);
  }
  if (!weights) return pending;  // no parameter is reached: nothing for W

  for (std::size_t j = 0; j < joins.size(); ++j) {
    const NodePtr& node = g.nodes[joins[j]];
    // The join's input-path outputs were I's: cut them, so that W computes only the
    // parameter-side ones. (set_next_edge would assert on a node that has a parent; an edge made
    // invalid only lowers what the node's topological number could be, which autograd reads as
    // a bound.)
    for (auto& e : node->next_edges()) {
      if (e.function && on_path[g.index.at(e.function.get())]) e = Edge();
    }
    for (std::size_t k = 0; k < arrived[j].size(); ++k) {
      if (!arrived[j][k].defined()) continue;
      pending.roots_.emplace_back(node, static_cast<uint32_t>(k));
      pending.grads_.push_back(std::move(arrived[j][k]));
    }
  }
  for (std::size_t k : off_path_roots) {
    pending.roots_.push_back(root_edges[k]);
    pending.grads_.push_back(grads[k]);
  }
  // The input path's other nodes never run again: free their saved activations now rather than
  // when the last reference to them goes (a join's saved tensor can hold one).
  for (std::size_t i = 0; i < n; ++i) {
    if (runs[i] && !join[i]) g.nodes[i]->release_variables();
  }
  return pending;
}

}  // namespace graphpipe::runtime
