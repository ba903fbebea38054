#include "cost/cost_model.h"

#include <algorithm>

#include "common/error.h"
#include "common/names.h"

namespace graphpipe::cost {

double optimizer_state_factor(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::sgd:
      return 0.0;
    case Optimizer::momentum:
      return 1.0;
    case Optimizer::adam:
      return 2.0;
  }
  return 2.0;
}

std::vector<std::string> optimizer_names() {
  return {to_string(Optimizer::sgd), to_string(Optimizer::momentum), to_string(Optimizer::adam)};
}

Optimizer parse_optimizer(const std::string& name) {
  if (name == "adamw") return Optimizer::adam;
  for (Optimizer o : {Optimizer::sgd, Optimizer::momentum, Optimizer::adam}) {
    if (name == to_string(o)) return o;
  }
  throw PlanningError("unknown optimizer '" + name + "': choose " + list_names(optimizer_names()));
}

std::string to_string(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::sgd:
      return "sgd";
    case Optimizer::momentum:
      return "momentum";
    case Optimizer::adam:
      return "adam";
  }
  return "adam";
}

CostModel::CostModel(const graph::OpGraph& graph, Devices devices, Optimizer optimizer)
    : graph_(&graph), devices_(std::move(devices)), optimizer_(optimizer) {
  devices_.validate();
  link_bandwidth_ = devices_.slowest_link_bandwidth();
  link_latency_ = devices_.slowest_link_latency();
  flops_per_second_ = devices_.flops_for(graph.compute_precision);
}

bool CostModel::is_profiled(graph::NodeId node) const { return !graph_->node(node).profile.empty(); }

double CostModel::analytic_work(graph::NodeId id, std::int64_t b) const {
  const graph::Node& n = graph_->node(id);
  double in_bytes = 0.0;
  for (graph::EdgeId e : graph_->in_edges(id)) in_bytes += graph_->edge(e).bytes;
  double bytes = static_cast<double>(n.param_bytes) + (in_bytes + n.output_bytes) * b;
  return std::max(n.forward_flops * b / flops_per_second_, bytes / devices_.memory_bandwidth);
}

double CostModel::input_share(graph::NodeId id) const {
  const graph::Node& n = graph_->node(id);
  return n.param_bytes > 0 || !n.params.empty() || !n.shared_params.empty() ? 0.5 : 1.0;
}

double CostModel::profiled(graph::NodeId id, std::int64_t b, Part part) const {
  const auto& profile = graph_->node(id).profile;
  const double share = part == Part::backward_input ? input_share(id) : 1.0 - input_share(id);
  auto at = [&](std::size_t i) {
    const auto& s = profile[i];
    if (part == Part::forward) return s.forward_seconds;
    const double whole = s.backward_seconds > 0.0 ? s.backward_seconds : 2.0 * s.forward_seconds;
    if (part == Part::backward) return whole;
    if (s.backward_input_seconds + s.backward_weight_seconds <= 0.0) return share * whole;  // not split
    return part == Part::backward_input ? s.backward_input_seconds : s.backward_weight_seconds;
  };
  const double x = static_cast<double>(b);
  double t;
  if (profile.size() == 1 || x <= static_cast<double>(profile.front().batch_size)) {
    double b0 = static_cast<double>(profile.front().batch_size);
    double per_sample_floor = at(0) * x / b0;
    if (profile.size() == 1) {
      t = per_sample_floor;  // one measurement: the per-sample time is all we know
    } else {
      double b1 = static_cast<double>(profile[1].batch_size);
      double line = at(0) + (at(1) - at(0)) * (x - b0) / (b1 - b0);
      t = std::max(line, per_sample_floor);
    }
  } else if (x >= static_cast<double>(profile.back().batch_size)) {
    t = at(profile.size() - 1) * x / static_cast<double>(profile.back().batch_size);
  } else {
    auto it = std::upper_bound(profile.begin(), profile.end(), b,
                               [](std::int64_t v, const graph::ProfileSample& s) { return v < s.batch_size; });
    std::size_t hi = static_cast<std::size_t>(it - profile.begin());
    std::size_t lo = hi - 1;
    double x0 = static_cast<double>(profile[lo].batch_size);
    double x1 = static_cast<double>(profile[hi].batch_size);
    t = at(lo) + (at(hi) - at(lo)) * (x - x0) / (x1 - x0);
  }
  return t / devices_.relative_speed;
}

double CostModel::forward_seconds(graph::NodeId node, std::int64_t micro_batch) const {
  if (is_profiled(node)) return profiled(node, micro_batch, Part::forward);
  if (graph_->node(node).op == "input") return 0.0;
  return devices_.op_overhead_seconds + analytic_work(node, micro_batch);
}

double CostModel::backward_seconds(graph::NodeId node, std::int64_t micro_batch) const {
  if (is_profiled(node)) return profiled(node, micro_batch, Part::backward);
  if (graph_->node(node).op == "input") return 0.0;
  return devices_.op_overhead_seconds + 2.0 * analytic_work(node, micro_batch);
}

double CostModel::backward_input_seconds(graph::NodeId node, std::int64_t micro_batch) const {
  if (is_profiled(node)) return profiled(node, micro_batch, Part::backward_input);
  return input_share(node) * backward_seconds(node, micro_batch);
}

double CostModel::backward_weight_seconds(graph::NodeId node, std::int64_t micro_batch) const {
  if (is_profiled(node)) return profiled(node, micro_batch, Part::backward_weight);
  return (1.0 - input_share(node)) * backward_seconds(node, micro_batch);
}

double CostModel::compute_seconds(graph::NodeId node, std::int64_t micro_batch) const {
  return forward_seconds(node, micro_batch) + backward_seconds(node, micro_batch);
}

double CostModel::transfer_seconds(double bytes) const {
  if (devices_.count < 2 || bytes <= 0.0) return 0.0;
  return link_latency_ + bytes / link_bandwidth_;
}

double CostModel::transfer_seconds(int src, int dst, double bytes) const {
  return devices_.transfer_seconds(src, dst, bytes);
}

double optimizer_step_seconds(double param_bytes, std::size_t param_tensors, const Devices& devices,
                              Optimizer optimizer, double traffic_factor) {
  const double traffic = devices.memory_bandwidth > 0.0 ? traffic_factor * param_bytes / devices.memory_bandwidth : 0.0;
  const auto price = devices.optimizer_tensor_seconds.find(to_string(optimizer));
  const double per_tensor = price == devices.optimizer_tensor_seconds.end() ? 0.0 : price->second;
  return traffic + static_cast<double>(param_tensors) * per_tensor;
}

std::size_t param_tensor_count(const graph::Node& node) {
  if (!node.param_shapes.empty()) {
    return static_cast<std::size_t>(std::count_if(node.param_shapes.begin(), node.param_shapes.end(),
                                                  [](const graph::ParamShape& p) { return p.requires_grad; }));
  }
  if (!node.params.empty()) return node.params.size();
  return node.param_bytes > 0 ? 1 : 0;
}

double CostModel::optimizer_seconds(graph::NodeId node) const {
  const graph::Node& n = graph_->node(node);
  return optimizer_step_seconds(static_cast<double>(n.param_bytes), param_tensor_count(n), devices_, optimizer_);
}

double CostModel::static_bytes(graph::NodeId node) const {
  const graph::Node& n = graph_->node(node);
  return static_cast<double>(n.param_bytes) * (2.0 + optimizer_state_factor(optimizer_)) +
         static_cast<double>(n.buffer_bytes);
}

double CostModel::activation_bytes(graph::NodeId node, std::int64_t micro_batch) const {
  return graph_->node(node).output_bytes * static_cast<double>(micro_batch);
}

}  // namespace graphpipe::cost
