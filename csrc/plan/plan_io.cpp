#include "plan/plan_io.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "common/error.h"
#include "common/json_fields.h"
#include "plan/stage_modules.h"
#include "plan/stage_parameters.h"

namespace graphpipe::plan {

namespace jf = json_fields;

namespace {

std::string stage_name(int s) { return "stage " + std::to_string(s); }

}  // namespace

int tensors_carried(const graph::OpGraph& g, const std::vector<graph::EdgeId>& edges) {
  std::set<graph::NodeId> producers;
  for (graph::EdgeId e : edges) producers.insert(g.edge(e).src);
  return std::max<int>(1, static_cast<int>(producers.size()));
}

std::map<std::pair<int, int>, std::vector<graph::EdgeId>> implied_stage_edges(
    const graph::OpGraph& g, const std::vector<int>& stage_of, bool chain) {
  std::map<std::pair<int, int>, std::vector<graph::EdgeId>> result;
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    int a = stage_of[edge.src], b = stage_of[edge.dst];
    if (a == b) continue;
    if (a > b) {
      throw PlanningError("operator edge " + graph::describe(g, edge.src) + " -> " +
                          graph::describe(g, edge.dst) + " goes from stage " + std::to_string(a) +
                          " back to stage " + std::to_string(b) +
                          ": the stages are not convex, not acyclic, or not listed in topological order");
    }
    if (!chain) {
      result[{a, b}].push_back(static_cast<graph::EdgeId>(e));
    } else {
      for (int k = a; k < b; ++k) result[{k, k + 1}].push_back(static_cast<graph::EdgeId>(e));
    }
  }
  return result;
}

void validate_plan(const Plan& plan, const graph::OpGraph& g) {
  const std::string fingerprint = g.fingerprint();
  if (plan.graph_fingerprint != fingerprint) {
    throw PlanningError("the plan was made for another graph: its fingerprint is " +
                        plan.graph_fingerprint + ", this graph's is " + fingerprint +
                        (g.model_name.empty() ? "" : " (" + g.model_name + ")"));
  }
  const std::int64_t n = static_cast<std::int64_t>(g.num_nodes());
  if (plan.num_graph_nodes != n) {
    throw PlanningError("the plan is for a graph of " + std::to_string(plan.num_graph_nodes) +
                        " operators, this graph has " + std::to_string(n));
  }
  if (plan.batch_size < 1 || plan.micro_batch_size < 1 || plan.num_micro_batches < 1 ||
      plan.micro_batch_size * plan.num_micro_batches != plan.batch_size) {
    throw PlanningError("micro-batches do not make up the mini-batch: " +
                        std::to_string(plan.num_micro_batches) + " x " +
                        std::to_string(plan.micro_batch_size) + " != " + std::to_string(plan.batch_size));
  }
  if (plan.num_devices < 1) {
    throw PlanningError("the plan has " + std::to_string(plan.num_devices) + " devices");
  }
  const int num_stages = static_cast<int>(plan.stages.size());
  if (num_stages < 1) throw PlanningError("the plan has no stage");
  if (num_stages > plan.num_devices) {
    throw PlanningError("the plan has " + std::to_string(num_stages) + " stages for " +
                        std::to_string(plan.num_devices) + " devices");
  }
  auto order = g.topological_order();
  std::vector<int> position(n);
  for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  std::vector<int> stage_of(n, -1);
  std::vector<bool> device_used(plan.num_devices, false);
  for (int s = 0; s < num_stages; ++s) {
    const Stage& st = plan.stages[s];
    if (st.id != s) {
      throw PlanningError("stage at index " + std::to_string(s) + " has id " + std::to_string(st.id) +
                          ": stage ids must be 0..S-1 in list order");
    }
    if (st.nodes.empty()) throw PlanningError(stage_name(s) + " has no operator");
    int previous = -1;
    for (graph::NodeId v : st.nodes) {
      if (v < 0 || v >= n) {
        throw PlanningError(stage_name(s) + " lists operator id " + std::to_string(v) +
                            ", outside 0.." + std::to_string(n - 1));
      }
      if (stage_of[v] != -1) {
        throw PlanningError("operator " + graph::describe(g, v) + " is in both " +
                            stage_name(stage_of[v]) + " and " + stage_name(s));
      }
      stage_of[v] = s;
      if (position[v] < previous) {
        throw PlanningError(stage_name(s) + " does not list its operators in topological order (at " +
                            graph::describe(g, v) + ")");
      }
      previous = position[v];
    }
    if (st.devices.empty()) throw PlanningError(stage_name(s) + " has no device");
    for (int d : st.devices) {
      if (d < 0 || d >= plan.num_devices) {
        throw PlanningError(stage_name(s) + " is placed on device " + std::to_string(d) +
                            ", outside 0.." + std::to_string(plan.num_devices - 1));
      }
      if (device_used[d]) {
        throw PlanningError("device " + std::to_string(d) + " is given to two stages (the second is " +
                            stage_name(s) + ")");
      }
      device_used[d] = true;
    }
    // Each replica takes a shard of every micro-batch along the batch dimension: with fewer rows
    // than replicas some replica would get an empty shard (plan.h).
    if (plan.micro_batch_size < static_cast<std::int64_t>(st.devices.size())) {
      throw PlanningError(stage_name(s) + " has " + std::to_string(st.devices.size()) +
                          " replicas but a micro-batch has only " + std::to_string(plan.micro_batch_size) +
                          " rows: every replica needs at least one (use micro_batch_size >= " +
                          std::to_string(st.devices.size()) + " or fewer devices for the stage)");
    }
    if (!(st.all_reduce_seconds >= 0.0)) {
      throw PlanningError(stage_name(s) + " has all_reduce_seconds " + std::to_string(st.all_reduce_seconds));
    }
    if (st.in_flight < 1) throw PlanningError(stage_name(s) + " has in_flight " + std::to_string(st.in_flight));
  }
  for (graph::NodeId v = 0; v < n; ++v) {
    if (stage_of[v] == -1) throw PlanningError("operator " + graph::describe(g, v) + " is in no stage");
  }
  // Crossing operator edges must go forward in stage order: that makes the stage graph acyclic
  // (hence every stage convex) and the stage list a topological order of it.
  const auto expected = implied_stage_edges(g, stage_of, plan.chain);
  if (plan.edges.size() != expected.size()) {
    throw PlanningError("the plan lists " + std::to_string(plan.edges.size()) +
                        " stage edges, the operator edges crossing its stages make " +
                        std::to_string(expected.size()));
  }
  std::set<std::pair<int, int>> seen;
  for (const StageEdge& se : plan.edges) {
    auto it = expected.find({se.src, se.dst});
    std::string name = "stage edge " + std::to_string(se.src) + " -> " + std::to_string(se.dst);
    if (it == expected.end()) throw PlanningError(name + " carries no operator edge");
    if (!seen.insert({se.src, se.dst}).second) throw PlanningError(name + " is listed twice");
    if (se.edges != it->second) {
      throw PlanningError(name + " lists " + std::to_string(se.edges.size()) +
                          " operator edges, the crossing edges between those stages are " +
                          std::to_string(it->second.size()) + " others");
    }
    if (se.tensors != tensors_carried(g, se.edges)) {
      throw PlanningError(name + " says it sends " + std::to_string(se.tensors) + " tensors, its operator edges come from " +
                          std::to_string(tensors_carried(g, se.edges)) + " producers");
    }
  }
  std::vector<int> longest(num_stages, 1);
  for (auto it = expected.rbegin(); it != expected.rend(); ++it) {
    longest[it->first.first] = std::max(longest[it->first.first], longest[it->first.second] + 1);
  }
  int depth = plan.chain ? num_stages : *std::max_element(longest.begin(), longest.end());
  if (plan.depth != depth) {
    throw PlanningError("the plan says depth " + std::to_string(plan.depth) +
                        (plan.chain ? ", a chain of its stages has " : ", its stage graph's longest path has ") +
                        std::to_string(depth) + " stages");
  }
}

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
    edges.push_back({{"src", se.src}, {"dst", se.dst}, {"edges", se.edges}, {"bytes", se.bytes}, {"tensors", se.tensors}});
  }
  return {{"format", "graphpipe.plan"},
          {"schema_version", kPlanSchemaVersion},
          {"partitioner", plan.partitioner},
          {"graph_fingerprint", plan.graph_fingerprint},
          {"num_graph_nodes", plan.num_graph_nodes},
          {"batch_size", plan.batch_size},
          {"micro_batch_size", plan.micro_batch_size},
          {"num_micro_batches", plan.num_micro_batches},
          {"num_devices", plan.num_devices},
          {"depth", plan.depth},
          {"bottleneck_seconds_per_sample", plan.bottleneck_seconds_per_sample},
          {"predicted_iteration_seconds", plan.predicted_iteration_seconds},
          {"memory_limit_bytes", plan.memory_limit_bytes},
          {"optimizer", plan.optimizer},
          {"chain", plan.chain},
          {"sync", cost::to_json(plan.sync)},
          {"stages", stages},
          {"edges", edges}};
}

Plan plan_from_json(const nlohmann::json& doc, const graph::OpGraph& g) {
  jf::check_header(doc, "graphpipe.plan", kPlanSchemaVersion);
  Plan plan;
  plan.partitioner = jf::get<std::string>(doc, "partitioner", "$");
  plan.graph_fingerprint = jf::get<std::string>(doc, "graph_fingerprint", "$");
  plan.num_graph_nodes = jf::get<std::int64_t>(doc, "num_graph_nodes", "$");
  // The two cheapest and most telling checks first: a plan for another model.
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
  plan.depth = jf::get<int>(doc, "depth", "$");
  plan.bottleneck_seconds_per_sample = jf::non_negative<double>(doc, "bottleneck_seconds_per_sample", "$");
  plan.predicted_iteration_seconds = jf::non_negative<double>(doc, "predicted_iteration_seconds", "$");
  plan.memory_limit_bytes = jf::non_negative<double>(doc, "memory_limit_bytes", "$");
  plan.optimizer = jf::get<std::string>(doc, "optimizer", "$");
  plan.chain = jf::get<bool>(doc, "chain", "$");
  // Optional: plans written before sync methods existed were made for the all-reduce.
  if (doc.contains("sync")) {
    try {
      plan.sync = cost::sync_method_from_json(doc["sync"], "$.sync");
    } catch (const PlanningError& e) {
      throw FormatError(std::string("$.sync: ") + e.what());
    }
  }
  const auto& stages = jf::array(jf::field(doc, "stages", "$"), "$.stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::string where = "$.stages[" + std::to_string(i) + "]";
    const auto& js = jf::object(stages[i], where);
    Stage st;
    st.id = jf::get<int>(js, "id", where);
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
    st.forward_seconds = jf::non_negative<double>(js, "forward_seconds", where);
    st.backward_seconds = jf::non_negative<double>(js, "backward_seconds", where);
    st.transfer_seconds = jf::non_negative<double>(js, "transfer_seconds", where);
    st.param_bytes = jf::non_negative<double>(js, "param_bytes", where);
    st.static_bytes = jf::non_negative<double>(js, "static_bytes", where);
    st.activation_bytes = jf::non_negative<double>(js, "activation_bytes", where);
    st.in_flight = jf::get<int>(js, "in_flight", where);
    st.memory_bytes = jf::non_negative<double>(js, "memory_bytes", where);
    // Optional: plans written before replicated stages existed have one device per stage.
    if (js.contains("all_reduce_seconds")) st.all_reduce_seconds = jf::non_negative<double>(js, "all_reduce_seconds", where);
    if (js.contains("recompute")) st.recompute = jf::get<bool>(js, "recompute", where);
    // Optional too: plans written before the split backward was priced (then halves).
    if (js.contains("backward_input_seconds")) {
      st.backward_input_seconds = jf::non_negative<double>(js, "backward_input_seconds", where);
    }
    if (js.contains("backward_weight_seconds")) {
      st.backward_weight_seconds = jf::non_negative<double>(js, "backward_weight_seconds", where);
    }
    // Optional: plans written before stages named their modules get them from the graph.
    if (js.contains("modules")) {
      const auto& modules = jf::array(js["modules"], where + ".modules");
      for (std::size_t k = 0; k < modules.size(); ++k) {
        if (!modules[k].is_string()) {
          throw FormatError(where + ".modules[" + std::to_string(k) + "]: expected a string, found " +
                            modules[k].type_name());
        }
        st.modules.push_back(modules[k].get<std::string>());
      }
    } else {
      st.modules = top_modules(g, st.nodes);
    }
    plan.stages.push_back(std::move(st));
  }
  const auto& edges = jf::array(jf::field(doc, "edges", "$"), "$.edges");
  for (std::size_t i = 0; i < edges.size(); ++i) {
    const std::string where = "$.edges[" + std::to_string(i) + "]";
    StageEdge se;
    se.src = jf::get<int>(edges[i], "src", where);
    se.dst = jf::get<int>(edges[i], "dst", where);
    se.bytes = jf::non_negative<double>(edges[i], "bytes", where);
    // Optional (plans written before it existed): then derived from the operator edges below.
    se.tensors = 0;
    if (edges[i].contains("tensors")) {
      se.tensors = jf::get<int>(edges[i], "tensors", where);
      if (se.tensors < 1) throw FormatError(where + ".tensors: must be at least 1, got " + std::to_string(se.tensors));
    }
    const auto& ids = jf::array(jf::field(edges[i], "edges", where), where + ".edges");
    for (const auto& id : ids) {
      if (!id.is_number_integer()) throw FormatError(where + ".edges: expected integers");
      se.edges.push_back(id.get<graph::EdgeId>());
    }
    if (se.tensors == 0) {
      const bool known = std::all_of(se.edges.begin(), se.edges.end(),
                                     [&](graph::EdgeId e) { return e >= 0 && static_cast<std::size_t>(e) < g.num_edges(); });
      se.tensors = known ? tensors_carried(g, se.edges) : 1;  // unknown edges fail validation below
    }
    plan.edges.push_back(std::move(se));
  }
  try {
    validate_plan(plan, g);
  } catch (const PlanningError& e) {
    throw FormatError(std::string("the plan does not fit this graph: ") + e.what());
  }
  fill_stage_parameters(plan, g);
  return plan;
}

std::string dumps(const Plan& plan, const graph::OpGraph& g, int indent) {
  return to_json(plan, g).dump(indent);
}

Plan loads_plan(const std::string& text, const graph::OpGraph& g) {
  return plan_from_json(jf::parse(text, "plan"), g);
}

void save(const Plan& plan, const graph::OpGraph& g, const std::string& path) {
  jf::write_file(path, dumps(plan, g, 2));
}

Plan load_plan(const std::string& path, const graph::OpGraph& g) {
  return plan_from_json(jf::parse(jf::read_file(path), "'" + path + "'"), g);
}

}  // namespace graphpipe::plan
