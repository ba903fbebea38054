// validate_plan, implied_stage_edges and tensors_carried (plan_io.h): a plan checked against the
// graph it is applied to.
#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "common/error.h"
#include "plan/plan_io.h"
#include "plan/rank_sharing.h"

namespace graphpipe::plan {

namespace {

std::string stage_name(int s) { return "stage " + std::to_string(s); }

using ImpliedEdges = std::map<std::pair<int, int>, std::vector<graph::EdgeId>>;

// The graph it was made for (fingerprint, operator count), the batch split, devices and stages.
void check_plan_header(const Plan& plan, const graph::OpGraph& g) {
  const std::string fingerprint = g.fingerprint();
  if (plan.graph_fingerprint != fingerprint) {
    throw PlanningError("the plan was made for another graph: its fingerprint is " + plan.graph_fingerprint +
                        ", this graph's is " + fingerprint + (g.model_name.empty() ? "" : " (" + g.model_name + ")"));
  }
  const std::int64_t n = static_cast<std::int64_t>(g.num_nodes());
  if (plan.num_graph_nodes != n) {
    throw PlanningError("the plan is for a graph of " + std::to_string(plan.num_graph_nodes) +
                        " operators, this graph has " + std::to_string(n));
  }
  if (plan.batch_size < 1 || plan.micro_batch_size < 1 || plan.num_micro_batches < 1 ||
      plan.micro_batch_size * plan.num_micro_batches != plan.batch_size) {
    throw PlanningError("micro-batches do not make up the mini-batch: " + std::to_string(plan.num_micro_batches) +
                        " x " + std::to_string(plan.micro_batch_size) + " != " + std::to_string(plan.batch_size));
  }
  if (plan.num_devices < 1) {
    throw PlanningError("the plan has " + std::to_string(plan.num_devices) + " devices");
  }
  if (!plan.device_nodes.empty() && plan.device_nodes.size() != static_cast<std::size_t>(plan.num_devices)) {
    throw PlanningError("the plan names the nodes of " + std::to_string(plan.device_nodes.size()) +
                        " devices but has " + std::to_string(plan.num_devices));
  }
  for (std::size_t d = 0; d < plan.device_nodes.size(); ++d) {
    if (plan.device_nodes[d] < 0) {
      throw PlanningError("device " + std::to_string(d) + " is on node " + std::to_string(plan.device_nodes[d]) +
                          ": nodes are numbered from 0");
    }
  }
  // More stages than devices is a plan whose ranks hold several stages (rank_sharing.h), which
  // check_stages checks stage by stage.
  if (plan.stages.empty()) throw PlanningError("the plan has no stage");
}

// Stage s's operators: in range, in no other stage (recorded in stage_of), in topological order.
void check_stage_operators(const Stage& st, int s, const graph::OpGraph& g, const std::vector<int>& position,
                           std::vector<int>& stage_of) {
  const std::int64_t n = static_cast<std::int64_t>(g.num_nodes());
  if (st.nodes.empty()) throw PlanningError(stage_name(s) + " has no operator");
  int previous = -1;
  for (graph::NodeId v : st.nodes) {
    if (v < 0 || v >= n) {
      throw PlanningError(stage_name(s) + " lists operator id " + std::to_string(v) + ", outside 0.." +
                          std::to_string(n - 1));
    }
    if (stage_of[v] != -1) {
      throw PlanningError("operator " + graph::describe(g, v) + " is in both " + stage_name(stage_of[v]) + " and " +
                          stage_name(s));
    }
    stage_of[v] = s;
    if (position[v] < previous) {
      throw PlanningError(stage_name(s) + " does not list its operators in topological order (at " +
                          graph::describe(g, v) + ")");
    }
    previous = position[v];
  }
}

// Stage s's devices (in range; which stages may share one is checked for all of them at once,
// rank_sharing.h), its replicas' rows and its figures.
void check_stage_devices(const Plan& plan, const Stage& st, int s) {
  if (st.devices.empty()) throw PlanningError(stage_name(s) + " has no device");
  for (int d : st.devices) {
    if (d < 0 || d >= plan.num_devices) {
      throw PlanningError(stage_name(s) + " is placed on device " + std::to_string(d) + ", outside 0.." +
                          std::to_string(plan.num_devices - 1));
    }
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

// Every stage in list order with id = index; every operator in exactly one stage. Returns each
// operator's stage.
std::vector<int> check_stages(const Plan& plan, const graph::OpGraph& g) {
  const std::int64_t n = static_cast<std::int64_t>(g.num_nodes());
  const auto order = g.topological_order();
  std::vector<int> position(n);
  for (std::size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  std::vector<int> stage_of(n, -1);
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const Stage& st = plan.stages[s];
    if (st.id != s) {
      throw PlanningError("stage at index " + std::to_string(s) + " has id " + std::to_string(st.id) +
                          ": stage ids must be 0..S-1 in list order");
    }
    check_stage_operators(st, s, g, position, stage_of);
    check_stage_devices(plan, st, s);
  }
  for (graph::NodeId v = 0; v < n; ++v) {
    if (stage_of[v] == -1) throw PlanningError("operator " + graph::describe(g, v) + " is in no stage");
  }
  std::vector<std::vector<int>> ranks;
  for (const Stage& st : plan.stages) ranks.push_back(st.devices);
  if (auto problem = rank_sharing_problem(ranks)) throw PlanningError(*problem);
  return stage_of;
}

// `edges` without those out of model inputs (graph::OpGraph::edge_moves_data), in order.
std::vector<graph::EdgeId> data_edges(const graph::OpGraph& g, const std::vector<graph::EdgeId>& edges) {
  std::vector<graph::EdgeId> moving;
  std::copy_if(edges.begin(), edges.end(), std::back_inserter(moving),
               [&](graph::EdgeId e) { return g.edge_moves_data(e); });
  return moving;
}

// The longest path, in stages, of the stage graph `edges` (src < dst) over `num_stages`
// stages; an edge naming no stage is skipped (validation names it).
int longest_path(int num_stages, std::vector<std::pair<int, int>> edges) {
  if (num_stages == 0) return 0;
  std::sort(edges.begin(), edges.end(), std::greater<>());
  std::vector<int> longest(num_stages, 1);
  for (const auto& [src, dst] : edges) {
    if (src < 0 || dst < 0 || src >= num_stages || dst >= num_stages) continue;
    longest[src] = std::max(longest[src], longest[dst] + 1);
  }
  return *std::max_element(longest.begin(), longest.end());
}

// The listed stage edges are exactly those the crossing operator edges imply, with their
// operator edges and tensor counts.
void check_stage_edges(const Plan& plan, const graph::OpGraph& g, const ImpliedEdges& expected) {
  std::set<std::pair<int, int>> seen;
  for (const StageEdge& se : plan.edges) {
    auto it = expected.find({se.src, se.dst});
    std::string name = "stage edge " + std::to_string(se.src) + " -> " + std::to_string(se.dst);
    // A plan saved before model inputs stopped making stage edges lists them: say so by name.
    const std::vector<graph::EdgeId> moving = data_edges(g, se.edges);
    if (moving.size() != se.edges.size() && (it == expected.end() ? moving.empty() : moving == it->second)) {
      throw PlanningError(name + " lists operator edges out of model inputs, which every rank has and no stage " +
                          "sends (a plan made before graphpipe stopped listing them): plan the model again");
    }
    if (it == expected.end()) throw PlanningError(name + " carries no operator edge");
    if (!seen.insert({se.src, se.dst}).second) throw PlanningError(name + " is listed twice");
    if (se.edges != it->second) {
      throw PlanningError(name + " lists " + std::to_string(se.edges.size()) +
                          " operator edges, the crossing edges between those stages are " +
                          std::to_string(it->second.size()) + " others");
    }
    if (se.tensors != tensors_carried(g, se.edges)) {
      throw PlanningError(name + " says it sends " + std::to_string(se.tensors) +
                          " tensors, its operator edges come from " + std::to_string(tensors_carried(g, se.edges)) +
                          " producers");
    }
  }
  if (plan.edges.size() != expected.size()) {
    throw PlanningError("the plan lists " + std::to_string(plan.edges.size()) +
                        " stage edges, the operator edges crossing its stages make " + std::to_string(expected.size()));
  }
}

void check_depth(const Plan& plan, const ImpliedEdges& expected) {
  const int num_stages = static_cast<int>(plan.stages.size());
  std::vector<std::pair<int, int>> edges;
  for (const auto& [key, ids] : expected) edges.push_back(key);
  const int depth = plan.chain ? num_stages : longest_path(num_stages, std::move(edges));
  if (plan.depth != depth) {
    throw PlanningError("the plan says depth " + std::to_string(plan.depth) +
                        (plan.chain ? ", a chain of its stages has " : ", its stage graph's longest path has ") +
                        std::to_string(depth) + " stages");
  }
}

}  // namespace

int tensors_carried(const graph::OpGraph& g, const std::vector<graph::EdgeId>& edges) {
  std::set<graph::NodeId> producers;
  for (graph::EdgeId e : edges) producers.insert(g.edge(e).src);
  return std::max<int>(1, static_cast<int>(producers.size()));
}

ImpliedEdges implied_stage_edges(const graph::OpGraph& g, const std::vector<int>& stage_of, bool chain) {
  ImpliedEdges result;
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    int a = stage_of[edge.src], b = stage_of[edge.dst];
    if (a == b) continue;
    if (a > b) {
      throw PlanningError("operator edge " + graph::describe(g, edge.src) + " -> " + graph::describe(g, edge.dst) +
                          " goes from stage " + std::to_string(a) + " back to stage " + std::to_string(b) +
                          ": the stages are not convex, not acyclic, or not listed in topological order");
    }
    // Order is checked on every edge (the stage list stays a topological order of the operators),
    // but an edge out of a model input is no stage edge (OpGraph::edge_moves_data).
    if (!g.edge_moves_data(static_cast<graph::EdgeId>(e))) continue;
    if (!chain) {
      result[{a, b}].push_back(static_cast<graph::EdgeId>(e));
    } else {
      for (int k = a; k < b; ++k) result[{k, k + 1}].push_back(static_cast<graph::EdgeId>(e));
    }
  }
  return result;
}

double bytes_carried(const graph::OpGraph& g, const std::vector<graph::EdgeId>& edges, std::int64_t micro_batch_size) {
  std::map<graph::NodeId, double> per_producer;
  for (graph::EdgeId e : edges) {
    double& bytes = per_producer[g.edge(e).src];
    bytes = std::max(bytes, g.edge(e).bytes * static_cast<double>(micro_batch_size));
  }
  double total = 0.0;
  for (const auto& [producer, bytes] : per_producer) total += bytes;
  return total;
}

void drop_model_input_edges(Plan& plan, const graph::OpGraph& g) {
  std::vector<StageEdge> kept;
  for (StageEdge& se : plan.edges) {
    std::vector<graph::EdgeId> moving = data_edges(g, se.edges);
    if (moving.empty()) continue;
    if (moving.size() != se.edges.size()) {
      se.edges = std::move(moving);
      se.bytes = bytes_carried(g, se.edges, plan.micro_batch_size);
      se.tensors = tensors_carried(g, se.edges);
    }
    kept.push_back(std::move(se));
  }
  plan.edges = std::move(kept);
  if (plan.chain) return;  // a chain's depth is its stage count whatever its edges
  std::vector<std::pair<int, int>> edges;
  for (const StageEdge& se : plan.edges) edges.emplace_back(se.src, se.dst);
  plan.depth = longest_path(static_cast<int>(plan.stages.size()), std::move(edges));
}

void validate_plan(const Plan& plan, const graph::OpGraph& g) {
  check_plan_header(plan, g);
  const std::vector<int> stage_of = check_stages(plan, g);
  // Crossing operator edges must go forward in stage order: that makes the stage graph acyclic
  // (hence every stage convex) and the stage list a topological order of it.
  const ImpliedEdges expected = implied_stage_edges(g, stage_of, plan.chain);
  check_stage_edges(plan, g, expected);
  check_depth(plan, expected);
}

}  // namespace graphpipe::plan
