#include "plan/plan_io.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/json_fields.h"
#include "plan/stage_modules.h"
#include "plan/stage_parameters.h"

namespace graphpipe::plan {

namespace jf = json_fields;

nlohmann::json to_json(const Plan& plan, const graph::OpGraph& g) {
  nlohmann::json stages = nlohmann::json::array();
  for (const Stage& st : plan.stages) {
    nlohmann::json names = nlohmann::json::array();
    for (graph::NodeId v : st.nodes) names.push_back(g.node(v).name);
    stages.push_back({{"id", st.id},
                      {"nodes", names},
                      {"devices", st.devices},
                      {"forward_seconds", st.forward_seconds},
                      {"backward_seconds", st.backward_seconds},
                      {"backward_input_seconds", st.backward_input_seconds},
                      {"backward_weight_seconds", st.backward_weight_seconds},
                      {"transfer_seconds", st.transfer_seconds},
                      {"param_bytes", st.param_bytes},
                      {"static_bytes", st.static_bytes},
                      {"activation_bytes", st.activation_bytes},
                      {"in_flight", st.in_flight},
                      {"memory_bytes", st.memory_bytes},
                      {"all_reduce_seconds", st.all_reduce_seconds},
                      {"recompute", st.recompute},
                      {"modules", st.modules}});
  }
  nlohmann::json edges = nlohmann::json::array();
  for (const StageEdge& se : plan.edges) {
    edges.push_back(
        {{"src", se.src}, {"dst", se.dst}, {"edges", se.edges}, {"bytes", se.bytes}, {"tensors", se.tensors}});
  }
  nlohmann::json doc = {{"format", "graphpipe.plan"},
                        {"schema_version", kPlanSchemaVersion},
                        {"partitioner", plan.partitioner},
                        {"graph_fingerprint", plan.graph_fingerprint},
                        {"num_graph_nodes", plan.num_graph_nodes},
                        {"batch_size", plan.batch_size},
                        {"micro_batch_size", plan.micro_batch_size},
                        {"num_micro_batches", plan.num_micro_batches},
                        {"num_devices", plan.num_devices},
                        {"device_nodes", plan.device_nodes},
                        {"depth", plan.depth},
                        {"bottleneck_seconds_per_sample", plan.bottleneck_seconds_per_sample},
                        {"predicted_iteration_seconds", plan.predicted_iteration_seconds},
                        {"memory_limit_bytes", plan.memory_limit_bytes},
                        {"optimizer", plan.optimizer},
                        {"chain", plan.chain},
                        {"schedule", plan.schedule},
                        {"compute_dtype", graph::to_string(plan.precision)},
                        {"compute_flops_per_second", plan.compute_flops_per_second},
                        {"sync", cost::to_json(plan.sync)},
                        {"stages", stages},
                        {"edges", edges}};
  if (plan.fold) doc["fold"] = std::string(fold_key(*plan.fold));  // absent: not folded
  return doc;
}

namespace {

// The plan's scalar fields; a plan for another graph is rejected first (the cheapest and most
// telling check).
Plan plan_header_from_json(const nlohmann::json& doc, const graph::OpGraph& g) {
  jf::check_header(doc, "graphpipe.plan", kPlanSchemaVersion);
  Plan plan;
  plan.partitioner = jf::get<std::string>(doc, "partitioner", "$");
  plan.graph_fingerprint = jf::get<std::string>(doc, "graph_fingerprint", "$");
  plan.num_graph_nodes = jf::get<std::int64_t>(doc, "num_graph_nodes", "$");
  if (plan.graph_fingerprint != g.fingerprint()) {
    throw FormatError("$.graph_fingerprint: the plan was made for another graph (fingerprint " +
                      plan.graph_fingerprint + ", this graph's is " + g.fingerprint() + ")");
  }
  if (plan.num_graph_nodes != static_cast<std::int64_t>(g.num_nodes())) {
    throw FormatError("$.num_graph_nodes: the plan is for " + std::to_string(plan.num_graph_nodes) +
                      " operators, this graph has " + std::to_string(g.num_nodes()));
  }
  plan.batch_size = jf::get<std::int64_t>(doc, "batch_size", "$");
  plan.micro_batch_size = jf::get<std::int64_t>(doc, "micro_batch_size", "$");
  plan.num_micro_batches = jf::get<std::int64_t>(doc, "num_micro_batches", "$");
  plan.num_devices = jf::get<int>(doc, "num_devices", "$");
  // Optional: plans written before they recorded their devices' nodes leave them unknown.
  if (doc.contains("device_nodes")) {
    const auto& nodes = jf::array(doc["device_nodes"], "$.device_nodes");
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      if (!nodes[k].is_number_integer()) {
        throw FormatError("$.device_nodes[" + std::to_string(k) + "]: expected an integer, found " +
                          nodes[k].type_name());
      }
      plan.device_nodes.push_back(nodes[k].get<int>());
    }
  }
  plan.depth = jf::get<int>(doc, "depth", "$");
  plan.bottleneck_seconds_per_sample = jf::non_negative<double>(doc, "bottleneck_seconds_per_sample", "$");
  plan.predicted_iteration_seconds = jf::non_negative<double>(doc, "predicted_iteration_seconds", "$");
  plan.memory_limit_bytes = jf::non_negative<double>(doc, "memory_limit_bytes", "$");
  plan.optimizer = jf::get<std::string>(doc, "optimizer", "$");
  plan.chain = jf::get<bool>(doc, "chain", "$");
  // Optional: plans written before they recorded their schedule were made for 1F1B.
  if (doc.contains("schedule")) plan.schedule = jf::get<std::string>(doc, "schedule", "$");
  // Optional: "v" or "looping" where the planner folded the plan (Plan::fold), absent otherwise.
  if (doc.contains("fold")) {
    try {
      plan.fold = parse_fold(jf::get<std::string>(doc, "fold", "$"));
    } catch (const PlanningError& e) {
      throw FormatError(std::string("$.fold: ") + e.what());
    }
  }
  // Optional: plans written before they recorded their precision were priced in float32.
  if (doc.contains("compute_dtype")) {
    try {
      plan.precision = graph::parse_precision(jf::get<std::string>(doc, "compute_dtype", "$"));
    } catch (const GraphError& e) {
      throw FormatError(std::string("$.compute_dtype: ") + e.what());
    }
  }
  if (doc.contains("compute_flops_per_second")) {
    plan.compute_flops_per_second = jf::non_negative<double>(doc, "compute_flops_per_second", "$");
  }
  // Optional: plans written before sync methods existed were made for the all-reduce.
  if (doc.contains("sync")) {
    try {
      plan.sync = cost::sync_method_from_json(doc["sync"], "$.sync");
    } catch (const PlanningError& e) {
      throw FormatError(std::string("$.sync: ") + e.what());
    }
  }
  return plan;
}

// A JSON list of strings (where: its JSON path).
std::vector<std::string> strings_from_json(const nlohmann::json& list, const std::string& where) {
  std::vector<std::string> out;
  const auto& items = jf::array(list, where);
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (!items[k].is_string()) {
      throw FormatError(where + "[" + std::to_string(k) + "]: expected a string, found " + items[k].type_name());
    }
    out.push_back(items[k].get<std::string>());
  }
  return out;
}

// A stage's operators (by name) and devices.
void stage_placement_from_json(const nlohmann::json& js, const std::string& where, const graph::OpGraph& g, Stage& st) {
  const auto& names = jf::array(jf::field(js, "nodes", where), where + ".nodes");
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::string at = where + ".nodes[" + std::to_string(k) + "]";
    if (!names[k].is_string()) throw FormatError(at + ": expected a string, found " + names[k].type_name());
    auto id = g.find(names[k].get<std::string>());
    if (!id) throw FormatError(at + ": the graph has no operator named '" + names[k].get<std::string>() + "'");
    st.nodes.push_back(*id);
  }
  const auto& devices = jf::array(jf::field(js, "devices", where), where + ".devices");
  for (std::size_t k = 0; k < devices.size(); ++k) {
    if (!devices[k].is_number_integer()) {
      throw FormatError(where + ".devices[" + std::to_string(k) + "]: expected an integer");
    }
    st.devices.push_back(devices[k].get<int>());
  }
}

Stage stage_from_json(const nlohmann::json& value, const std::string& where, const graph::OpGraph& g) {
  const auto& js = jf::object(value, where);
  Stage st;
  st.id = jf::get<int>(js, "id", where);
  stage_placement_from_json(js, where, g, st);
  st.forward_seconds = jf::non_negative<double>(js, "forward_seconds", where);
  st.backward_seconds = jf::non_negative<double>(js, "backward_seconds", where);
  st.transfer_seconds = jf::non_negative<double>(js, "transfer_seconds", where);
  st.param_bytes = jf::non_negative<double>(js, "param_bytes", where);
  st.static_bytes = jf::non_negative<double>(js, "static_bytes", where);
  st.activation_bytes = jf::non_negative<double>(js, "activation_bytes", where);
  st.in_flight = jf::get<int>(js, "in_flight", where);
  st.memory_bytes = jf::non_negative<double>(js, "memory_bytes", where);
  // Optional: plans written before replicated stages existed have one device per stage.
  if (js.contains("all_reduce_seconds"))
    st.all_reduce_seconds = jf::non_negative<double>(js, "all_reduce_seconds", where);
  if (js.contains("recompute")) st.recompute = jf::get<bool>(js, "recompute", where);
  // Optional too: plans written before the split backward was priced (then halves).
  if (js.contains("backward_input_seconds")) {
    st.backward_input_seconds = jf::non_negative<double>(js, "backward_input_seconds", where);
  }
  if (js.contains("backward_weight_seconds")) {
    st.backward_weight_seconds = jf::non_negative<double>(js, "backward_weight_seconds", where);
  }
  // Optional: plans written before stages named their modules get them from the graph.
  st.modules = js.contains("modules") ? strings_from_json(js["modules"], where + ".modules") : top_modules(g, st.nodes);
  return st;
}

StageEdge stage_edge_from_json(const nlohmann::json& js, const std::string& where, const graph::OpGraph& g) {
  StageEdge se;
  se.src = jf::get<int>(js, "src", where);
  se.dst = jf::get<int>(js, "dst", where);
  se.bytes = jf::non_negative<double>(js, "bytes", where);
  // Optional (plans written before it existed): then derived from the operator edges below.
  se.tensors = 0;
  if (js.contains("tensors")) {
    se.tensors = jf::get<int>(js, "tensors", where);
    if (se.tensors < 1) throw FormatError(where + ".tensors: must be at least 1, got " + std::to_string(se.tensors));
  }
  const auto& ids = jf::array(jf::field(js, "edges", where), where + ".edges");
  for (const auto& id : ids) {
    if (!id.is_number_integer()) throw FormatError(where + ".edges: expected integers");
    se.edges.push_back(id.get<graph::EdgeId>());
  }
  if (se.tensors == 0) {
    const bool known = std::all_of(se.edges.begin(), se.edges.end(), [&](graph::EdgeId e) {
      return e >= 0 && static_cast<std::size_t>(e) < g.num_edges();
    });
    se.tensors = known ? tensors_carried(g, se.edges) : 1;  // unknown edges fail validation
  }
  return se;
}

}  // namespace

Plan plan_from_json(const nlohmann::json& doc, const graph::OpGraph& g, bool drop_input_edges) {
  Plan plan = plan_header_from_json(doc, g);
  const auto& stages = jf::array(jf::field(doc, "stages", "$"), "$.stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    plan.stages.push_back(stage_from_json(stages[i], "$.stages[" + std::to_string(i) + "]", g));
  }
  const auto& edges = jf::array(jf::field(doc, "edges", "$"), "$.edges");
  for (std::size_t i = 0; i < edges.size(); ++i) {
    plan.edges.push_back(stage_edge_from_json(edges[i], "$.edges[" + std::to_string(i) + "]", g));
  }
  if (drop_input_edges) drop_model_input_edges(plan, g);
  try {
    validate_plan(plan, g);
  } catch (const PlanningError& e) {
    throw FormatError(std::string("the plan does not fit this graph: ") + e.what());
  }
  fill_stage_parameters(plan, g);
  return plan;
}

std::string dumps(const Plan& plan, const graph::OpGraph& g, int indent) { return to_json(plan, g).dump(indent); }

Plan loads_plan(const std::string& text, const graph::OpGraph& g, bool drop_input_edges) {
  return plan_from_json(jf::parse(text, "plan"), g, drop_input_edges);
}

void save(const Plan& plan, const graph::OpGraph& g, const std::string& path) {
  jf::write_file(path, dumps(plan, g, 2));
}

Plan load_plan(const std::string& path, const graph::OpGraph& g) {
  return plan_from_json(jf::parse(jf::read_file(path), "'" + path + "'"), g);
}

}  // namespace graphpipe::plan
