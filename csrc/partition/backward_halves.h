// The two halves of a stage's split backward, as the runtime runs them for a zero-bubble
// schedule (runtime/executor.h; docs/design.md §5.1), priced from its operators' halves.
//
// I is torch::autograd::grad of the stage's roots with respect to the activations it received:
// autograd runs only the operators on a path from a received tensor to a root, each computing
// the gradients of its inputs (an operator's I). Operators fed only by model inputs, which a
// stage reads itself and which need no gradient, are not run: a stage that receives nothing
// has no I at all (the runtime skips it).
// W starts where I left off (runtime/split_backward.h): I records the gradients arriving at the
// operators where a parameter's path joins the input path, and W runs autograd from there to the
// parameters. An operator I ran costs its weights' gradient in W (an operator's W), plus its I
// again when one of its in-stage operands comes from a weighted operator I did not run (the
// join recomputes that operand's gradient; priced whole, an overestimate for a cheap operand).
// An operator I did not run (fed only by model inputs and parameters) runs wholly in W, as in a
// plain backward: its weights' gradient, and its inputs' when one of them depends on a
// parameter of the stage. So I + W is about the unsplit backward, as measured on CPU
// (docs/results.md).
//
// Per operator: I and W as the cost model gives them (cost/cost_model.h); an operator with W > 0
// is one with weights. A tensor is "received" when its edge crosses into the stage from an
// operator of another stage; edges from graph inputs (op "input") are read locally. Every
// received tensor is taken to need a gradient (the graph does not record dtypes; an integer
// tensor's consumer has a measured I of 0 anyway when profiled). O(V + E).
#pragma once

#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::partition {

struct BackwardHalves {
  double input = 0.0;   // I, one micro-batch
  double weight = 0.0;  // W, one micro-batch
  // Whether I runs any operator: a recomputed stage's forward runs again inside the first half
  // that uses the stage's activations, I when it walks any, W otherwise.
  bool input_walks = false;
};

// `stage_of[v]`: the stage of operator v, 0..num_stages-1; `order`: a topological order of the
// graph; `input[v]`, `weight[v]`: operator v's I and W at its stage's rows. Throws
// PlanningError when the sizes do not match the graph.
std::vector<BackwardHalves> backward_halves(const graph::OpGraph& graph, const std::vector<graph::NodeId>& order,
                                            const std::vector<int>& stage_of, int num_stages,
                                            const std::vector<double>& input, const std::vector<double>& weight);

}  // namespace graphpipe::partition
