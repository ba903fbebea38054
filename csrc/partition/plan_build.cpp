#include "partition/plan_build.h"

#include <algorithm>

#include "common/error.h"
#include "plan/plan_io.h"
#include "plan/stage_modules.h"
#include "plan/stage_parameters.h"

namespace graphpipe::partition {

using plan::bytes_carried;
using plan::fill_stage_parameters;
using plan::implied_stage_edges;
using plan::Plan;
using plan::Stage;
using plan::StageEdge;
using plan::tensors_carried;
using plan::top_modules;
using plan::validate_plan;

namespace {

std::string label_operators(const graph::OpGraph& g, const std::vector<int>& assignment, int label) {
  std::string names;
  int shown = 0;
  for (std::size_t v = 0; v < assignment.size(); ++v) {
    if (assignment[v] != label) continue;
    if (shown == 3) {
      names += ", ...";
      break;
    }
    names += (shown++ ? ", " : "") + g.node(static_cast<graph::NodeId>(v)).name;
  }
  return "{" + names + "}";
}

}  // namespace

plan::Plan build_plan(const Problem& p, const std::vector<int>& assignment, const std::string& partitioner,
                      const std::vector<int>& replicas, const std::vector<std::vector<int>>& devices) {
  const graph::OpGraph& g = *p.graph;
  if (!replicas.empty() || !devices.empty()) {
    // A cyclic assignment is reported below by its operators; only the replica figures need it acyclic.
    if (!evaluate(p, assignment).acyclic) return build_plan(p, assignment, partitioner);
  }
  Evaluation ev = evaluate(p, assignment, replicas, devices);
  if (!ev.acyclic) {
    std::string text;
    for (int label : ev.cycle) text += label_operators(g, assignment, label) + " -> ";
    text += label_operators(g, assignment, ev.cycle.front());
    throw PlanningError(partitioner + " produced stages whose dependencies form a cycle: " + text);
  }
  // The user's stage_devices (`devices`) may place several stages on a rank (plan/rank_sharing.h).
  if (devices.empty() && ev.num_stages > p.model->devices().count) {
    throw PlanningError(partitioner + " produced " + std::to_string(ev.num_stages) + " stages for " +
                        std::to_string(p.model->devices().count) + " devices");
  }
  Plan plan;
  plan.partitioner = partitioner;
  plan.graph_fingerprint = g.fingerprint();
  plan.num_graph_nodes = static_cast<std::int64_t>(g.num_nodes());
  plan.batch_size = p.batch_size;
  plan.micro_batch_size = p.micro_batch_size;
  plan.num_micro_batches = p.num_micro_batches;
  record_devices(plan, p.model->devices());
  plan.precision = g.compute_precision;
  plan.compute_flops_per_second = p.model->flops_per_second();
  plan.memory_limit_bytes = p.memory_limit;
  plan.optimizer = cost::to_string(p.model->optimizer());
  plan.chain = p.chain;
  plan.schedule = p.zero_bubble ? "zb_graph" : "1f1b";
  plan.sync = p.sync;
  plan.stages.resize(ev.num_stages);
  for (int s = 0; s < ev.num_stages; ++s) {
    Stage& st = plan.stages[s];
    const StageFigures& f = ev.stages[s];
    st.id = s;
    st.devices = f.devices;
    st.all_reduce_seconds = f.all_reduce;
    st.recompute = f.recompute;
    st.forward_seconds = f.forward;
    st.backward_seconds = f.backward;
    st.backward_input_seconds = f.backward_input;
    st.backward_weight_seconds = f.backward_weight;
    st.transfer_seconds = f.transfer;
    st.static_bytes = f.static_bytes;
    st.activation_bytes = f.activation_bytes;
    st.in_flight = f.in_flight;
    st.memory_bytes = f.memory;
  }
  for (graph::NodeId v : p.order) plan.stages[ev.stage_of[v]].nodes.push_back(v);
  for (Stage& st : plan.stages) {
    double params = 0.0;
    for (graph::NodeId v : st.nodes) params += static_cast<double>(g.node(v).param_bytes);
    st.param_bytes = params;
    st.modules = top_modules(g, st.nodes);
  }
  // A tensor consumed by several operators downstream crosses a stage edge once: bytes count
  // each producer once per stage edge (its largest outgoing edge).
  for (const auto& [key, ids] : implied_stage_edges(g, ev.stage_of, p.chain)) {
    StageEdge se;
    se.src = key.first;
    se.dst = key.second;
    se.edges = ids;
    se.bytes = bytes_carried(g, ids, p.micro_batch_size);
    se.tensors = tensors_carried(g, ids);
    plan.edges.push_back(std::move(se));
  }
  plan.depth = ev.depth;
  plan.bottleneck_seconds_per_sample = ev.bottleneck / static_cast<double>(p.micro_batch_size);
  plan.predicted_iteration_seconds = ev.iteration_seconds(p);
  validate_plan(plan, g);
  fill_stage_parameters(plan, g);
  return plan;
}

void record_devices(plan::Plan& plan, const cost::Devices& devices) {
  plan.num_devices = devices.count;
  plan.device_nodes.assign(static_cast<std::size_t>(devices.count), 0);
  for (int d = 0; d < devices.count; ++d) plan.device_nodes[static_cast<std::size_t>(d)] = devices.node_of(d);
}

}  // namespace graphpipe::partition
