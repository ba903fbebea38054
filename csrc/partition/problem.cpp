#include "partition/problem.h"

#include <numeric>

#include "common/error.h"
#include "cost/sync_cost.h"
#include "cost/sync_kind.h"

namespace graphpipe::partition {

double Problem::total_compute() const { return std::accumulate(compute.begin(), compute.end(), 0.0); }

Problem make_problem(const cost::CostModel& model, std::int64_t batch_size, std::int64_t micro_batch_size,
                     int max_stages, double memory_limit, cost::InFlightRule in_flight) {
  if (micro_batch_size < 1 || batch_size % micro_batch_size != 0) {
    throw PlanningError("micro-batch size " + std::to_string(micro_batch_size) + " does not divide the mini-batch of " +
                        std::to_string(batch_size));
  }
  const graph::OpGraph& g = model.graph();
  Problem p;
  p.graph = &g;
  p.model = &model;
  p.batch_size = batch_size;
  p.micro_batch_size = micro_batch_size;
  p.num_micro_batches = batch_size / micro_batch_size;
  p.max_stages = max_stages;
  p.device_budget = max_stages;
  p.memory_limit = memory_limit;
  p.in_flight = in_flight ? std::move(in_flight) : cost::InFlightRule(cost::in_flight_1f1b);
  p.order = g.topological_order();
  const std::size_t n = g.num_nodes();
  p.position.assign(n, 0);
  for (std::size_t i = 0; i < n; ++i) p.position[p.order[i]] = static_cast<int>(i);
  p.forward.resize(n);
  p.backward.resize(n);
  p.compute.resize(n);
  p.backward_input.resize(n);
  p.backward_weight.resize(n);
  p.static_bytes.resize(n);
  p.optimizer.resize(n);
  p.param_bytes.resize(n);
  p.act_bytes.resize(n);
  for (std::size_t v = 0; v < n; ++v) {
    auto id = static_cast<graph::NodeId>(v);
    p.forward[v] = model.forward_seconds(id, micro_batch_size);
    p.backward[v] = model.backward_seconds(id, micro_batch_size);
    p.compute[v] = p.forward[v] + p.backward[v];
    p.backward_input[v] = model.backward_input_seconds(id, micro_batch_size);
    p.backward_weight[v] = model.backward_weight_seconds(id, micro_batch_size);
    p.static_bytes[v] = model.static_bytes(id);
    p.optimizer[v] = model.optimizer_seconds(id);
    p.param_bytes[v] = static_cast<double>(g.node(id).param_bytes);
    p.act_bytes[v] = model.activation_bytes(id, micro_batch_size);
  }
  p.edge_seconds.resize(g.num_edges());
  p.edge_bytes.resize(g.num_edges());
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const auto id = static_cast<graph::EdgeId>(e);
    // A model input is on every rank (OpGraph::edge_moves_data): nothing to send or hold.
    const bool moves = g.edge_moves_data(id);
    p.edge_bytes[e] = moves ? g.edge(id).bytes * static_cast<double>(micro_batch_size) : 0.0;
    p.edge_seconds[e] = moves ? model.transfer_seconds(p.edge_bytes[e]) : 0.0;
  }
  set_sync(p, cost::SyncMethod{});  // the all-reduce until the caller says otherwise
  return p;
}

void set_sync(Problem& p, const cost::SyncMethod& method) {
  method.validate();
  p.sync = method;
  const graph::OpGraph& g = *p.graph;
  const cost::Devices& devices = p.model->devices();
  p.sync_load.assign(g.num_nodes(), {});
  p.sync_total = {};
  p.total_param_bytes = 0.0;
  for (std::size_t v = 0; v < g.num_nodes(); ++v) {
    const graph::Node& n = g.node(static_cast<graph::NodeId>(v));
    p.total_param_bytes += static_cast<double>(n.param_bytes);
    if (n.param_bytes > 0 && n.param_shapes.empty()) {
      if (cost::sync_kind_model(method.kind).needs_shapes()) {
        throw PlanningError(method.describe() + " is priced by the shapes of the parameters, and operator " +
                            graph::describe(g, static_cast<graph::NodeId>(v)) +
                            " has parameter bytes without shapes (a graph traced before shapes were recorded): trace "
                            "the model again with graphpipe.trace");
      }
      p.sync_load[v] = cost::flat_load(static_cast<double>(n.param_bytes));
    } else {
      for (const graph::ParamShape& t : n.param_shapes) p.sync_load[v] += cost::tensor_load(method, t, devices);
    }
    p.sync_total += p.sync_load[v];
  }
}

double stage_sync_seconds(const Problem& p, const std::vector<int>& ranks, const cost::SyncLoad& load) {
  if (ranks.size() < 2) return 0.0;
  const cost::GroupPricer pricer(p.model->devices(), ranks, p.sync.hierarchical);
  return cost::single_bucket_seconds(p.sync, load, pricer);
}

std::vector<std::int64_t> micro_batch_candidates(std::int64_t batch_size, std::int64_t fixed) {
  if (batch_size < 1) {
    throw PlanningError("the mini-batch size must be at least 1, found " + std::to_string(batch_size));
  }
  if (fixed != 0) {
    if (fixed < 1 || batch_size % fixed != 0) {
      throw PlanningError("micro-batch size " + std::to_string(fixed) + " does not divide the mini-batch of " +
                          std::to_string(batch_size));
    }
    return {fixed};
  }
  std::vector<std::int64_t> sizes;
  for (std::int64_t b = 1; b <= batch_size; b *= 2) {
    if (batch_size % b == 0) sizes.push_back(b);
  }
  return sizes;
}

}  // namespace graphpipe::partition
