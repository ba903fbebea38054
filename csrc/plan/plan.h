// Plan: the output of every partitioner, the input of the scheduler, simulator and runtime.
//
// A plan cuts an OpGraph into stages. Each stage is a convex set of operators placed on a set of
// devices: its data-parallel replicas (docs/design.md, "Replicated stages"). Every micro-batch
// is split along the batch dimension into one shard per replica, as torch.tensor_split splits
// it (the first b % d shards get ceil(b / d) rows, the rest floor(b / d)); every replica runs
// the stage's schedule on its shard, and the replicas sum their gradients once per iteration
// before the optimizer step. The stage graph (stages joined by the operator edges that cross them) is a DAG, not
// necessarily a chain: independent branches become parallel stages. The mini-batch is split into
// num_micro_batches micro-batches of micro_batch_size samples.
//
// Invariants (checked by validate_plan, see plan/plan_io.h):
//   - every operator is in exactly one stage; stages are non-empty and convex;
//   - stage ids are 0..S-1 and stages are listed in a topological order of the stage graph;
//   - stage edges join distinct stages, follow that order, and cover every crossing operator edge;
//   - device sets are non-empty and within the device count; two stages share a device only
//     where each of them runs on it alone (plan/rank_sharing.h: several stages per rank, which
//     the schedules run one compute at a time);
//   - device_nodes is empty or names a node >= 0 for each of the num_devices devices;
//   - micro_batch_size >= the devices of every stage (each replica gets at least one row);
//   - micro_batch_size * num_micro_batches == batch_size.
// Predicted figures are per micro-batch of micro_batch_size samples unless named otherwise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cost/sync_method.h"
#include "graph/op_graph.h"
#include "plan/fold.h"

namespace graphpipe::plan {

struct Stage {
  int id = 0;
  std::vector<graph::NodeId> nodes;  // in topological order of the OpGraph
  std::vector<int> devices;          // ranks of the stage's replicas (d = devices.size() >= 1)
  // Figures marked "per replica" are one replica's, for the largest shard (ceil(b / d) rows).
  double forward_seconds = 0.0;   // predicted, one micro-batch, per replica
  double backward_seconds = 0.0;  // predicted, one micro-batch, per replica
  // The backward split as a zero-bubble schedule runs it (partition/backward_halves.h): I, the
  // input gradients, and W, the weight gradients, per micro-batch and replica. Their sum exceeds
  // backward_seconds where W walks again activation gradients that I computed. Both 0: not
  // known (plans from before they existed); schedule::backward_split then halves the backward.
  double backward_input_seconds = 0.0;
  double backward_weight_seconds = 0.0;
  // Predicted transfer time of one micro-batch charged to this stage, per replica: one transfer
  // (latency + share / bandwidth) per operator edge entering or leaving the stage, where the
  // share is the edge's bytes / max(d_src, d_dst) (the runtime re-shards rows between the
  // replicas of the two stages directly). Not part of forward/backward_seconds, which are
  // compute only; the stage's time is the sum of the three.
  double transfer_seconds = 0.0;
  double param_bytes = 0.0;       // parameters held by the stage (each replica holds all)
  double activation_bytes = 0.0;  // activations stashed for one micro-batch, per replica
  int in_flight = 1;              // micro-batches whose activations are held at peak
  double memory_bytes = 0.0;      // predicted peak of one replica: weights, grads, optimizer, activations
  double static_bytes = 0.0;      // of which weights, grads, optimizer state and buffers (full stage)
  // Predicted time per step of keeping the replicas in agreement by the plan's sync method
  // (Plan::sync; cost/sync_cost.h): with the default all-reduce, summing the stage's gradients
  // (cost::best_all_reduce on `devices`); local SGD's averaging amortised over its period; top-k
  // and PowerSGD's compression compute and collectives. 0 for one device. The step estimate
  // charges it after the stage's last backward, next to its optimizer step.
  double all_reduce_seconds = 0.0;
  // The parameters the stage's module holds, in the runtime's order (plan/stage_parameters.h),
  // which lays out its gradient buckets. Derived from the graph (never stored in the plan's JSON);
  // empty when the graph has no parameter shapes.
  std::vector<graph::ParamShape> parameters;
  // The top-level modules the stage's operators belong to, in order of first appearance
  // (plan/stage_modules.h): what the stage runs, named in the plan's table even without its
  // graph. Empty when all its operators belong to the root module. Stored in the plan's JSON.
  std::vector<std::string> modules;
  // Activation recomputation (chosen by the planner when the stage does not fit otherwise): the
  // stage keeps only its received tensors per micro-batch in flight and runs its forward again
  // during its backward, which backward_seconds includes (and backward_input_seconds, or
  // backward_weight_seconds for a stage whose I walks no operator); memory_bytes counts it so.
  bool recompute = false;
};

struct StageEdge {
  int src = 0;                       // producing stage
  int dst = 0;                       // consuming stage
  std::vector<graph::EdgeId> edges;  // operator edges carried, in OpGraph edge order
  double bytes = 0.0;                // bytes per micro-batch (forward; backward sends the same)
  int tensors = 1;                   // tensors per micro-batch, one per producing operator: the
                                     // runtime sends each on its own, so each pays the latency
};

struct Plan {
  std::string partitioner;  // "metis", "graphpipe", "sequential", "manual"
  // How the planner folded a plan for more devices onto these (planner/folded_search.h), where it
  // did; the partitioner label says it in words. Empty for any other plan, a manual placement
  // that shares devices included: readers (compare.py's V row) ask this, not the label.
  std::optional<Fold> fold;
  std::string graph_fingerprint;  // OpGraph::fingerprint() of the graph it was made for
  std::int64_t num_graph_nodes = 0;
  std::int64_t batch_size = 0;  // mini-batch size (samples per training step)
  std::int64_t micro_batch_size = 0;
  std::int64_t num_micro_batches = 0;
  int num_devices = 0;
  // The node (machine) of each device, device_nodes[d] for d < num_devices, as the device
  // description placed it when the plan was made (cost::Devices::node_of): what the plan's table
  // and repr name beside each stage's devices, so a reader sees which stages and replicas share a
  // machine's fast links. Empty: not recorded (plans written before it was); nodes are then unknown.
  std::vector<int> device_nodes;
  std::vector<Stage> stages;
  std::vector<StageEdge> edges;
  // slowest stage's (forward + backward + transfer) / micro_batch_size
  double bottleneck_seconds_per_sample = 0.0;
  int depth = 0;  // stages on the longest path of the stage graph
  // (num_micro_batches + depth - 1) x the slowest stage's time per micro-batch, plus the part of
  // the all-reduces and optimizer steps that outlasts the pipeline (evaluate.h): the 1F1B estimate of one
  // training step that the partitioners use to choose the micro-batch size and the plan.
  double predicted_iteration_seconds = 0.0;
  double memory_limit_bytes = 0.0;  // the per-device limit the plan was made under
  std::string optimizer;            // "sgd", "momentum" or "adam": sets the memory figures
  // How replicated stages synchronise (cost/sync_method.h): what all_reduce_seconds prices and
  // what the simulator runs by default.
  cost::SyncMethod sync;
  // The schedule the plan was made for, a policy name of schedule/generate.h ("1f1b",
  // "zb_graph", ...): the one its predicted step simulated, and what graphpipe.simulate and
  // graphpipe.wrap run by default. The planner picks it where asked to (PlannerOptions::policies).
  std::string schedule = "1f1b";
  // The precision the graph computes in (OpGraph::compute_precision, graph/precision.h), which
  // set the activation and transfer bytes, and the analytic compute rate it was priced at
  // (cost::CostModel::flops_per_second: the devices' 16-bit rate for bfloat16 or float16 where
  // they give one; 0: not recorded, plans written before it was). Measured operator times are
  // as profiled, whatever the rate. Shown in the plan's table.
  graph::Precision precision = graph::Precision::float32;
  double compute_flops_per_second = 0.0;
  // The stages run as a chain in list order (the sequential baseline): stage i waits for stage
  // i - 1 even where no operator edge joins them (skip tensors are forwarded), so depth is the
  // stage count and in-flight counts are chain positions. `edges` still lists only the stage
  // pairs that operator edges join.
  bool chain = false;

  // The distinct nodes of a stage's devices, ascending; empty when device_nodes is.
  std::vector<int> stage_nodes(const Stage& stage) const {
    std::vector<int> out;
    if (device_nodes.empty()) return out;
    for (int d : stage.devices) {
      if (d >= 0 && static_cast<std::size_t>(d) < device_nodes.size()) out.push_back(device_nodes[d]);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  // How many distinct nodes the devices sit on; 0 when device_nodes is empty.
  int num_device_nodes() const {
    std::vector<int> all = device_nodes;
    std::sort(all.begin(), all.end());
    return static_cast<int>(std::unique(all.begin(), all.end()) - all.begin());
  }
};

}  // namespace graphpipe::plan
