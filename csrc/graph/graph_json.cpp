#include "graph/graph_json.h"

#include "common/json_fields.h"

namespace graphpipe::graph {

namespace jf = json_fields;
using nlohmann::json;

namespace {
constexpr const char* kFormat = "graphpipe.opgraph";
}

json to_json(const OpGraph& graph) {
  json nodes = json::array();
  for (const Node& n : graph.nodes()) {
    json profile = json::array();
    for (const ProfileSample& p : n.profile) {
      profile.push_back({{"batch_size", p.batch_size},
                         {"forward_seconds", p.forward_seconds},
                         {"backward_seconds", p.backward_seconds},
                         {"backward_input_seconds", p.backward_input_seconds},
                         {"backward_weight_seconds", p.backward_weight_seconds}});
    }
    json shapes = json::array();
    for (const ParamShape& p : n.param_shapes) {
      shapes.push_back({{"name", p.name},
                        {"shape", p.shape},
                        {"dtype", p.dtype},
                        {"element_size", p.element_size},
                        {"requires_grad", p.requires_grad}});
    }
    nodes.push_back({{"name", n.name},
                     {"op", n.op},
                     {"target", n.target},
                     {"module", n.module},
                     {"forward_flops", n.forward_flops},
                     {"param_bytes", n.param_bytes},
                     {"params", n.params},
                     {"shared_params", n.shared_params},
                     {"param_shapes", shapes},
                     {"buffer_bytes", n.buffer_bytes},
                     {"output_bytes", n.output_bytes},
                     {"is_input", n.is_input},
                     {"is_output", n.is_output},
                     {"profile", profile}});
  }
  json edges = json::array();
  for (const Edge& e : graph.edges()) {
    edges.push_back({{"src", e.src}, {"dst", e.dst}, {"bytes", e.bytes}});
  }
  return {{"format", kFormat},
          {"schema_version", kSchemaVersion},
          {"model", graph.model_name},
          {"trace_batch_size", graph.trace_batch_size},
          {"compute_dtype", to_string(graph.compute_precision)},
          {"nodes", nodes},
          {"edges", edges}};
}

namespace {

std::vector<std::string> string_list(const json& parent, const std::string& key, const std::string& where) {
  const json& list = jf::array(jf::field(parent, key, where), where + "." + key);
  std::vector<std::string> result;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) {
      throw FormatError(where + "." + key + "[" + std::to_string(i) + "]: expected a string");
    }
    result.push_back(list[i].get<std::string>());
  }
  return result;
}

Node node_from_json(const json& value, const std::string& where) {
  jf::object(value, where);
  Node n;
  n.name = jf::get<std::string>(value, "name", where);
  n.op = jf::get<std::string>(value, "op", where);
  n.target = jf::get<std::string>(value, "target", where);
  n.module = jf::get<std::string>(value, "module", where);
  n.forward_flops = jf::non_negative<double>(value, "forward_flops", where);
  n.param_bytes = jf::non_negative<std::int64_t>(value, "param_bytes", where);
  n.params = string_list(value, "params", where);
  n.shared_params = string_list(value, "shared_params", where);
  // Optional: graphs written before parameter shapes were recorded have none.
  if (value.contains("param_shapes")) {
    const json& shapes = jf::array(value["param_shapes"], where + ".param_shapes");
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const std::string at = where + ".param_shapes[" + std::to_string(i) + "]";
      ParamShape p;
      p.name = jf::get<std::string>(shapes[i], "name", at);
      const json& dims = jf::array(jf::field(shapes[i], "shape", at), at + ".shape");
      for (std::size_t k = 0; k < dims.size(); ++k) {
        if (!dims[k].is_number_integer() || dims[k].get<std::int64_t>() < 0) {
          throw FormatError(at + ".shape[" + std::to_string(k) + "]: expected a non-negative integer");
        }
        p.shape.push_back(dims[k].get<std::int64_t>());
      }
      p.dtype = jf::get<std::string>(shapes[i], "dtype", at);
      p.element_size = jf::get<int>(shapes[i], "element_size", at);
      if (p.element_size < 1) throw FormatError(at + ".element_size: must be at least 1");
      p.requires_grad = jf::get<bool>(shapes[i], "requires_grad", at);
      n.param_shapes.push_back(std::move(p));
    }
  }
  n.buffer_bytes = jf::non_negative<std::int64_t>(value, "buffer_bytes", where);
  n.output_bytes = jf::non_negative<double>(value, "output_bytes", where);
  n.is_input = jf::get<bool>(value, "is_input", where);
  n.is_output = jf::get<bool>(value, "is_output", where);
  const json& profile = jf::array(jf::field(value, "profile", where), where + ".profile");
  std::int64_t previous = 0;
  for (std::size_t i = 0; i < profile.size(); ++i) {
    const std::string at = where + ".profile[" + std::to_string(i) + "]";
    ProfileSample p;
    p.batch_size = jf::get<std::int64_t>(profile[i], "batch_size", at);
    if (p.batch_size <= previous) {
      throw FormatError(at + ".batch_size: batch sizes must be positive and increasing");
    }
    previous = p.batch_size;
    p.forward_seconds = jf::non_negative<double>(profile[i], "forward_seconds", at);
    p.backward_seconds = jf::non_negative<double>(profile[i], "backward_seconds", at);
    // Optional: graphs profiled before the split backward was measured have neither.
    if (profile[i].contains("backward_input_seconds")) {
      p.backward_input_seconds = jf::non_negative<double>(profile[i], "backward_input_seconds", at);
    }
    if (profile[i].contains("backward_weight_seconds")) {
      p.backward_weight_seconds = jf::non_negative<double>(profile[i], "backward_weight_seconds", at);
    }
    n.profile.push_back(p);
  }
  return n;
}

}  // namespace

OpGraph from_json(const json& document) {
  jf::check_header(document, kFormat, kSchemaVersion);
  OpGraph graph;
  graph.model_name = jf::get<std::string>(document, "model", "$");
  graph.trace_batch_size = jf::get<std::int64_t>(document, "trace_batch_size", "$");
  if (graph.trace_batch_size < 1) throw FormatError("$.trace_batch_size: must be at least 1");
  // Optional: graphs written before the precision was recorded computed in float32.
  if (document.contains("compute_dtype")) {
    try {
      graph.compute_precision = parse_precision(jf::get<std::string>(document, "compute_dtype", "$"));
    } catch (const GraphError& e) {
      throw FormatError(std::string("$.compute_dtype: ") + e.what());
    }
  }
  const json& nodes = jf::array(jf::field(document, "nodes", "$"), "$.nodes");
  const json& edges = jf::array(jf::field(document, "edges", "$"), "$.edges");
  try {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      graph.add_node(node_from_json(nodes[i], "$.nodes[" + std::to_string(i) + "]"));
    }
    for (std::size_t i = 0; i < edges.size(); ++i) {
      const std::string at = "$.edges[" + std::to_string(i) + "]";
      jf::object(edges[i], at);
      auto src = jf::get<std::int64_t>(edges[i], "src", at);
      auto dst = jf::get<std::int64_t>(edges[i], "dst", at);
      const auto n = static_cast<std::int64_t>(graph.num_nodes());
      if (src < 0 || src >= n || dst < 0 || dst >= n) {
        throw FormatError(at + ": edge end out of range (the file has " + std::to_string(n) + " nodes)");
      }
      graph.add_edge(static_cast<NodeId>(src), static_cast<NodeId>(dst),
                     jf::non_negative<double>(edges[i], "bytes", at));
    }
    graph.validate();
  } catch (const GraphError& e) {
    throw FormatError(std::string("inconsistent graph file: ") + e.what());
  }
  return graph;
}

std::string dumps(const OpGraph& graph, int indent) { return to_json(graph).dump(indent); }

OpGraph loads(const std::string& text) { return from_json(jf::parse(text, "the graph text")); }

void save(const OpGraph& graph, const std::string& path) { jf::write_file(path, dumps(graph, 1)); }

OpGraph load(const std::string& path) { return from_json(jf::parse(jf::read_file(path), "'" + path + "'")); }

}  // namespace graphpipe::graph
