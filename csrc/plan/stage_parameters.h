// stage_parameters: the parameters each stage's module holds, in the order the runtime lists
// them, so that the cost model lays out the same gradient buckets as the runtime
// (cost/gradient_buckets.h; the buckets' contents set top-k's and PowerSGD's traffic).
//
// The runtime builds a stage's module as an fx.GraphModule over the traced model
// (graphpipe/runtime/stages.py); torch copies each called submodule (and each parameter read
// directly) into it under its qualified name, creating the parents on first use, in the order
// the stage's operators come. module.parameters() then walks that module tree depth first: a
// module's own parameters before its children's, children in the order they were created. Here
// the same tree is built from the qualified names of the parameters of the stage's operators
// (owned ones and tied ones owned elsewhere, deduplicated by name), inserted in operator order.
// Assumptions (docs/design.md): a tied parameter sits where its canonical (first) name puts it,
// and a parameter read directly is placed at the operator that reads it.
//
// A stage whose operators include one with parameter bytes but without parameter shapes (a graph
// traced before shapes were recorded), or that uses a tied parameter whose owner has none, gets
// an empty list: the pricing then falls back to its param_bytes (cost/sync_cost.h). O(P + total
// name length) per plan.
#pragma once

#include "graph/op_graph.h"
#include "plan/plan.h"

namespace graphpipe::plan {

// Fills Stage::parameters of every stage of `plan` (made for `graph`).
void fill_stage_parameters(Plan& plan, const graph::OpGraph& graph);

}  // namespace graphpipe::plan
