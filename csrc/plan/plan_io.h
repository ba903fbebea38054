// Checking a Plan against the graph it is applied to, and its JSON form (schema
// "graphpipe.plan", version kPlanSchemaVersion).
//
//   {"format": "graphpipe.plan", "schema_version": 1, "partitioner": "graphpipe",
//    "graph_fingerprint": "...", "num_graph_nodes": 120, "batch_size": 64,
//    "micro_batch_size": 8, "num_micro_batches": 8, "num_devices": 4,
//    "device_nodes": [0, 0, 1, 1] (Plan::device_nodes; optional when reading: unknown), "depth": 3,
//    "bottleneck_seconds_per_sample": ..., "predicted_iteration_seconds": ...,
//    "memory_limit_bytes": ..., "optimizer": "adam", "chain": false,
//    "compute_dtype": "bfloat16", "compute_flops_per_second": ... (Plan::precision and its rate;
//    optional when reading: float32, 0),
//    "sync": {"kind": "all_reduce", ...} (cost/sync_method.h; optional when reading: all_reduce),
//    "fold": "v" or "looping" (Plan::fold; written only for a plan the planner folded),
//    "stages": [{"id": 0, "nodes": ["x", "fc1", ...], "devices": [0], "forward_seconds": ...,
//                "backward_seconds", "backward_input_seconds", "backward_weight_seconds",
//                "transfer_seconds", "param_bytes", "static_bytes", "activation_bytes", "in_flight",
//                "memory_bytes", "all_reduce_seconds", "recompute"}],
//    ("all_reduce_seconds" is optional when reading: 0, as in plans from before replicated stages;
//    "recompute" too: false; "backward_input_seconds" and "backward_weight_seconds" too: 0, not
//    known, as in plans from before the split backward was priced)
//    "edges": [{"src": 0, "dst": 1, "edges": [operator edge ids], "bytes": ...}]}
//
// Stage::parameters is not written: reading derives it from the graph (stage_parameters.h).
//
// Operators are named (not numbered) so that a reader can follow the file; operator edges are
// numbered, which the fingerprint makes safe (it covers the edge list).
// Files: plan_validate.cpp (validate_plan and the stage edges a plan implies), plan_io.cpp (JSON).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/op_graph.h"
#include "plan/plan.h"

namespace graphpipe::plan {

inline constexpr int kPlanSchemaVersion = 1;

// Checks every invariant listed in plan.h against `graph`, plus the fingerprint, the operator
// count and the depth. Throws PlanningError naming the first problem found (the stage, the
// operator, the numbers). O(V + E + S log S).
void validate_plan(const Plan& plan, const graph::OpGraph& graph);

// The stage edges that a stage assignment implies, keyed by (src, dst), each with the operator
// edges it carries in OpGraph edge order. For a graph plan, every operator edge that crosses
// from stage a to stage b rides on the edge (a, b). For a chain (Plan::chain), the stages talk
// only to their neighbours: an operator edge from a to b > a + 1 is relayed, riding on every
// edge (k, k + 1) for a <= k < b, as chain pipelines forward skip tensors. An operator edge out
// of a model input rides on none (graph::OpGraph::edge_moves_data). Throws PlanningError
// naming an operator edge that goes from a later stage back to an earlier one.
std::map<std::pair<int, int>, std::vector<graph::EdgeId>> implied_stage_edges(const graph::OpGraph& graph,
                                                                              const std::vector<int>& stage_of,
                                                                              bool chain);

// How many tensors a stage edge carrying `edges` sends per micro-batch: one per producing
// operator (a value read by several operators downstream crosses once). StageEdge::tensors.
int tensors_carried(const graph::OpGraph& graph, const std::vector<graph::EdgeId>& edges);

// How many bytes a stage edge carrying `edges` sends per micro-batch of `micro_batch_size`
// samples: each producing operator once, at its largest outgoing edge. StageEdge::bytes.
double bytes_carried(const graph::OpGraph& graph, const std::vector<graph::EdgeId>& edges,
                     std::int64_t micro_batch_size);

// A plan saved before model inputs stopped making stage edges (OpGraph::edge_moves_data),
// brought to the rule: each stage edge keeps the operator edges that move data (its tensors and
// bytes recounted as plan building counts them), an edge left with none goes, and the depth is
// that of the edges kept. Stage figures are left as saved, so that the plan can be simulated
// again under the rule (benchmarks/resimulate.py).
void drop_model_input_edges(Plan& plan, const graph::OpGraph& graph);

nlohmann::json to_json(const Plan& plan, const graph::OpGraph& graph);
// Reads and validates; any problem (malformed field, unknown operator, a plan for another graph,
// a tampered stage list) is a FormatError naming it. `drop_input_edges`: a plan saved before the
// model-input rule is brought to it first (drop_model_input_edges) instead of refused.
Plan plan_from_json(const nlohmann::json& document, const graph::OpGraph& graph, bool drop_input_edges = false);

std::string dumps(const Plan& plan, const graph::OpGraph& graph, int indent = -1);
Plan loads_plan(const std::string& text, const graph::OpGraph& graph, bool drop_input_edges = false);
void save(const Plan& plan, const graph::OpGraph& graph, const std::string& path);
Plan load_plan(const std::string& path, const graph::OpGraph& graph);

}  // namespace graphpipe::plan
