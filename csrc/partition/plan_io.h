// Checking a Plan against the graph it is applied to, and its JSON form (schema
// "graphpipe.plan", version kPlanSchemaVersion).
//
//   {"format": "graphpipe.plan", "schema_version": 1, "partitioner": "graphpipe",
//    "graph_fingerprint": "...", "num_graph_nodes": 120, "batch_size": 64,
//    "micro_batch_size": 8, "num_micro_batches": 8, "num_devices": 4, "depth": 3,
//    "bottleneck_seconds_per_sample": ..., "predicted_iteration_seconds": ...,
//    "memory_limit_bytes": ..., "optimizer": "adam", "chain": false,
//    "stages": [{"id": 0, "nodes": ["x", "fc1", ...], "devices": [0], "forward_seconds": ...,
//                "backward_seconds", "transfer_seconds", "param_bytes", "static_bytes",
//                "activation_bytes", "in_flight", "memory_bytes"}],
//    "edges": [{"src": 0, "dst": 1, "edges": [operator edge ids], "bytes": ...}]}
//
// Operators are named (not numbered) so that a reader can follow the file; operator edges are
// numbered, which the fingerprint makes safe (it covers the edge list).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "graph/op_graph.h"
#include "partition/plan.h"

namespace graphpipe::partition {

inline constexpr int kPlanSchemaVersion = 1;

// Checks every invariant listed in plan.h against `graph`, plus the fingerprint, the operator
// count and the depth. Throws PlanningError naming the first problem found (the stage, the
// operator, the numbers). O(V + E + S log S).
void validate_plan(const Plan& plan, const graph::OpGraph& graph);

nlohmann::json to_json(const Plan& plan, const graph::OpGraph& graph);
// Reads and validates; any problem (malformed field, unknown operator, a plan for another graph,
// a tampered stage list) is a FormatError naming it.
Plan plan_from_json(const nlohmann::json& document, const graph::OpGraph& graph);

std::string dumps(const Plan& plan, const graph::OpGraph& graph, int indent = -1);
Plan loads_plan(const std::string& text, const graph::OpGraph& graph);
void save(const Plan& plan, const graph::OpGraph& graph, const std::string& path);
Plan load_plan(const std::string& path, const graph::OpGraph& graph);

}  // namespace graphpipe::partition
