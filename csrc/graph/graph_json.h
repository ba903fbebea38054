// JSON form of an OpGraph (schema "graphpipe.opgraph", version kSchemaVersion).
//
//   {"format": "graphpipe.opgraph", "schema_version": 1, "model": "...",
//    "trace_batch_size": 8, "compute_dtype": "float32",
//    "nodes": [{"name", "op", "target", "module", "forward_flops", "param_bytes", "params",
//               "shared_params", "param_shapes", "buffer_bytes", "output_bytes", "is_input", "is_output",
//               "profile": [{"batch_size", "forward_seconds", "backward_seconds",
//                            "backward_input_seconds", "backward_weight_seconds"}]}],
//    "edges": [{"src": node index, "dst": node index, "bytes": per sample}]}
// ("backward_input_seconds" and "backward_weight_seconds" are optional when reading: 0, not
// profiled, as in graphs profiled before the split backward was measured.)
//
// "param_shapes" ([{"name", "shape", "dtype", "element_size", "requires_grad"}], one per owned
// parameter) is optional when reading: files written before it existed load without shapes.
// "compute_dtype" (graph/precision.h) is optional too: files written before it existed computed in
// float32.
//
// Loading validates everything: the format tag and version, every field's presence and type,
// ranges (no negative bytes, edge ends in range), and the graph invariants of op_graph.h. A bad
// file raises FormatError with the JSON path of the offending field ("nodes[3].name: ..."); a
// well-formed file describing a bad graph raises FormatError wrapping the GraphError.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "graph/op_graph.h"

namespace graphpipe::graph {

inline constexpr int kSchemaVersion = 1;

nlohmann::json to_json(const OpGraph& graph);
OpGraph from_json(const nlohmann::json& document);

std::string dumps(const OpGraph& graph, int indent = -1);
OpGraph loads(const std::string& text);
void save(const OpGraph& graph, const std::string& path);
OpGraph load(const std::string& path);

}  // namespace graphpipe::graph
