// A Plan as a readable table: a header line (partitioner, stages, devices and the nodes they sit
// on, depth, micro-batches, bottleneck, predicted step), one row per stage (devices, their nodes
// (Plan::device_nodes; "?" for a plan that did not record them), operators with the first and last
// names and the top-level modules they belong to, forward / backward / transfer per micro-batch,
// parameters, activations, in-flight, peak memory against the limit, successor stages), then the
// stage edges with their bytes.
#pragma once

#include <string>

#include "graph/op_graph.h"
#include "plan/plan.h"

namespace graphpipe::plan {

std::string to_string(const Plan& plan, const graph::OpGraph& graph);
// The same without operator names (for a plan printed without its graph): the stages' top-level
// modules (Stage::modules, stored in the plan) still name what each stage runs.
std::string to_string(const Plan& plan);

}  // namespace graphpipe::plan
