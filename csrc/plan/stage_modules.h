// stage_modules: the top-level modules a stage's operators belong to, so that a plan printed
// without its graph still says which part of the model each stage runs (an operator-level
// capture's names, aten ops, say little; its modules name a two-tower model's towers).
//
// The rule: the first component of each operator's owning module path ("vision_model" for
// "vision_model.encoder.layers.0"), in order of first appearance along the stage's operators;
// operators of the root module ("") add nothing. build_plan fills Stage::modules with it, the
// plan's JSON stores the list, and a plan written before the field existed gets it from its graph
// on load. O(total module name length) per stage.
#pragma once

#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::plan {

std::vector<std::string> top_modules(const graph::OpGraph& graph, const std::vector<graph::NodeId>& nodes);

}  // namespace graphpipe::plan
