// A backward split into its input half (I) and its weight half (W), W reusing what I computed.
//
// The way torch's pipelining splits a stage's backward (torch/distributed/pipelining/
// _backward.py: stage_backward_input / stage_backward_weight), written with libtorch's autograd
// graph (torch::autograd::Node, next_edges, pre-hooks, Engine::execute from chosen edges):
//
//   I  walks the graph of the roots once and marks the nodes autograd runs to reach the inputs
//      (the "input path") and the nodes that lead to a parameter. An input-path node with an edge
//      to a node off the input path that leads to a parameter is a "join" (a matmul whose weight
//      gradient flows off to the weight's accumulator, an add whose other operand came from a
//      bias...). A pre-hook on every join records the gradients arriving at it while
//      torch::autograd::grad runs the roots back to the inputs (graph kept). Afterwards every
//      join's edges back into the input path are cut (the gradients they would carry were computed
//      by I), the saved tensors of the input-path nodes that W never runs are released, and the
//      roots are dropped: what stays is the joins, their recorded gradients and the graph between
//      them and the parameters.
//   W  runs autograd from the joins' inputs, fed the recorded gradients, to the parameters
//      (accumulating into .grad, so gradient hooks fire as in a plain backward): each join
//      computes only its parameter-side outputs, and no activation gradient of the input path is
//      computed again. Roots off the input path (an output computed from parameters alone) are
//      W's roots as they stand.
//
// Why it equals the unsplit backward: a gradient path from a root to a parameter leaves the input
// path (if it was ever on it) at exactly one join, whose recorded gradient is the whole gradient
// arriving there; below it lies only the off-path graph, which W runs once with every
// contribution (a node off the path is fed only by joins, by other off-path nodes or by an
// off-path root). Shared weights used at several joins, one above another, are summed the same
// way: each join contributes its own edge.
//
// One kind of join is not split: a normalisation (layer, batch, group norm), whose backward
// computes the input, weight and bias gradients in one fused pass over its saved activations.
// Split, W would make that pass again for the weight and bias alone; instead I asks autograd for
// their gradients too (they are reductions, as cheap as an elementwise pass) and W feeds them to
// the parameters' accumulators. Only where those accumulators are fed by nothing else and carry
// no tensor hook (I runs such a hook where it captures the gradient, W would run it again).
//
// A stage whose inputs need no gradient (the first stage, say) has no input path: I does nothing
// and W is the plain backward of the roots to the parameters. Without parameters, I is the whole
// backward and W has nothing to do.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/edge.h>

#include <vector>

namespace graphpipe::runtime {

// What I leaves for W: the edges W starts from, their gradients, and the parameters' edges.
// Holding it keeps the graph between the joins and the parameters alive; dropping it frees it.
class PendingWeights {
 public:
  bool empty() const { return roots_.empty(); }
  // How many nodes W starts from (tests, benchmarks).
  std::size_t num_roots() const { return roots_.size(); }
  // Runs W: the parameters' gradients accumulate into their .grad; frees the graph. Running it
  // twice, or on an empty one, does nothing.
  void run();

 private:
  friend PendingWeights backward_input(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                                       const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                                       std::vector<at::Tensor>*);
  std::vector<torch::autograd::Edge> roots_;
  std::vector<at::Tensor> grads_;
  std::vector<torch::autograd::Edge> params_;
};

// I: the gradients of `roots` (seeded with `grads`, one per root) with respect to `inputs`,
// written to `input_grads` (one per input, undefined where no gradient reaches it), and the W that
// finishes the weight gradients of `params` (leaves that require grad; others are ignored).
// `inputs` that do not require grad are skipped. With no parameters the graph is freed at once.
PendingWeights backward_input(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                              const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params,
                              std::vector<at::Tensor>* input_grads);

}  // namespace graphpipe::runtime
