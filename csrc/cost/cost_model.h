// CostModel: predicted time and memory of operators on a Devices description, the one source of
// numbers for every partitioner (so that partitioners are compared on the same scale).
//
// Time of one operator for a micro-batch of b samples (seconds):
//   - measured: when the node has a profile (graph::Node::profile, times for whole batches),
//     linear interpolation in b between profiled sizes; above the largest size the per-sample
//     time of the largest is kept (t = t_max * b / b_max); below the smallest, the line through
//     the two smallest sizes, but never cheaper per sample than the smallest size. The result
//     is divided by Devices::relative_speed. A profile without backward times (0) gets
//     backward = 2 x forward, the usual ratio for dense layers.
//   - analytic otherwise: forward = op_overhead + max(flops*b / FLOP/s, bytes(b) / memory BW)
//     with bytes(b) = param_bytes + (inputs + output)*b, backward = op_overhead + 2 x that work.
//     FLOP/s is the devices' rate for the graph's compute precision (Devices::flops_for: a GPU's
//     tensor-core rate for a model traced under bfloat16 or float16 autocast); the activation
//     bytes are the trace's, already 2 per element then. A measured profile stays as measured
//     (graphpipe/profile.py times the operators under the autocast the graph was traced in).
//     The fixed overhead is why small micro-batches cost more per sample. Graph inputs (op
//     "input") cost nothing.
// The backward's two halves as a zero-bubble runtime runs them (docs/design.md §5.1): I, the
// gradients of the operator's inputs alone, and W, those of its parameters alone. Measured ones
// (ProfileSample::backward_input/weight_seconds) are interpolated like the backward. Otherwise
// (no profile, or one from before the split was measured) the backward is split by rule: an
// operator with parameters (its own or shared) spends about as long on its weights' gradient as
// on its input's (two products of the same size), I = W = backward / 2; one without has no W,
// I = backward. How a stage's I and W follow from its operators' is partition/backward_halves.h.
// Transfer of a tensor between stages: latency + bytes / bandwidth over the slowest link of the
// description (placement-independent, so a partitioner need not know which rank a stage gets).
// Memory of a stage:
//   static  = params x (1 + 1 gradient + optimizer factor) + buffers, factor sgd 0, momentum 1,
//             adam 2;
//   peak    = static + activations of one micro-batch x in-flight micro-batches (in_flight.h).
// Optimizer step, once per iteration (optimizer_step_seconds): memory bound,
// kOptimizerTrafficFactor x parameter bytes over the device's memory bandwidth (read the
// parameter, its gradient and state, write back), plus the optimizer's price per parameter tensor
// (Devices::optimizer_tensor_seconds: the per-tensor loop of torch's CPU optimizers; 0 unless
// measured).
// All queries are O(1) except profile interpolation, O(log P) in the profile length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cost/devices.h"
#include "graph/op_graph.h"

namespace graphpipe::cost {

enum class Optimizer { sgd, momentum, adam };

// Bytes of memory traffic per parameter byte of an optimizer step (the simulator's default too).
inline constexpr double kOptimizerTrafficFactor = 4.0;

// One step of `optimizer` over `param_tensors` tensors of `param_bytes` bytes in all:
// traffic_factor x param_bytes / memory_bandwidth (0 without a bandwidth) plus
// param_tensors x devices.optimizer_tensor_seconds[optimizer] (0 where that optimizer was not
// measured). The one price of an optimizer step: the planner's per-operator figure
// (CostModel::optimizer_seconds) and the simulator's per stage.
double optimizer_step_seconds(double param_bytes, std::size_t param_tensors, const Devices& devices,
                              Optimizer optimizer, double traffic_factor = kOptimizerTrafficFactor);

// The parameter tensors a node owns that an optimizer steps: its trained parameters (by their
// shapes), else its named ones, else one flat tensor for a node traced with bytes but no names.
std::size_t param_tensor_count(const graph::Node& node);

// Per-parameter copies of optimizer state: sgd 0, momentum 1, adam 2.
double optimizer_state_factor(Optimizer optimizer);
// "sgd", "momentum", "adam" (also "adamw"); throws PlanningError naming the choices.
// "sgd", "momentum", "adam" ("adamw" is read as adam: the same state).
std::vector<std::string> optimizer_names();
Optimizer parse_optimizer(const std::string& name);
std::string to_string(Optimizer optimizer);

class CostModel {
 public:
  // Validates the devices (PlanningError). The graph must outlive the model.
  CostModel(const graph::OpGraph& graph, Devices devices, Optimizer optimizer = Optimizer::adam);

  const graph::OpGraph& graph() const { return *graph_; }
  const Devices& devices() const { return devices_; }
  Optimizer optimizer() const { return optimizer_; }
  // The analytic compute rate: the devices' rate for the graph's compute precision.
  double flops_per_second() const { return flops_per_second_; }

  double forward_seconds(graph::NodeId node, std::int64_t micro_batch) const;
  double backward_seconds(graph::NodeId node, std::int64_t micro_batch) const;
  // The backward's halves, I (input gradients) and W (weight gradients), timed apart; their sum
  // need not equal backward_seconds (two autograd passes, each with its own overheads).
  double backward_input_seconds(graph::NodeId node, std::int64_t micro_batch) const;
  double backward_weight_seconds(graph::NodeId node, std::int64_t micro_batch) const;
  // Forward plus backward.
  double compute_seconds(graph::NodeId node, std::int64_t micro_batch) const;
  // True when the node's time comes from its measured profile.
  bool is_profiled(graph::NodeId node) const;

  // One tensor of `bytes` between two stages over the slowest link; 0 on one device.
  double transfer_seconds(double bytes) const;
  // Between two given ranks (Devices::transfer_seconds).
  double transfer_seconds(int src, int dst, double bytes) const;

  // Weights, gradients, optimizer state and buffers the node's stage holds for it.
  double static_bytes(graph::NodeId node) const;
  // The node's share of the optimizer step (seconds, once per iteration).
  double optimizer_seconds(graph::NodeId node) const;
  // Activation bytes the node stashes for one micro-batch (its output).
  double activation_bytes(graph::NodeId node, std::int64_t micro_batch) const;
  // static + activations_per_micro_batch x in_flight.
  static double stage_memory(double static_bytes, double activation_bytes_per_micro_batch, int in_flight) {
    return static_bytes + activation_bytes_per_micro_batch * in_flight;
  }

 private:
  enum class Part { forward, backward, backward_input, backward_weight };
  double analytic_work(graph::NodeId node, std::int64_t micro_batch) const;
  double profiled(graph::NodeId node, std::int64_t micro_batch, Part part) const;
  // The input-gradient share of a backward the profile does not split (the rule above).
  double input_share(graph::NodeId node) const;

  const graph::OpGraph* graph_;
  Devices devices_;
  Optimizer optimizer_;
  double link_bandwidth_;
  double link_latency_;
  double flops_per_second_;
};

}  // namespace graphpipe::cost
