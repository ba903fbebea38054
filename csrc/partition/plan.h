// Plan: the output of every partitioner, the input of the scheduler, simulator and runtime.
//
// A plan cuts an OpGraph into stages. Each stage is a convex set of operators placed on a set of
// devices (one device per stage for now; the set leaves room for data parallelism inside a
// stage). The stage graph (stages joined by the operator edges that cross them) is a DAG, not
// necessarily a chain: independent branches become parallel stages. The mini-batch is split into
// num_micro_batches micro-batches of micro_batch_size samples.
//
// Invariants (checked by validate_plan, see partition/plan_io.h):
//   - every operator is in exactly one stage; stages are non-empty and convex;
//   - stage ids are 0..S-1 and stages are listed in a topological order of the stage graph;
//   - stage edges join distinct stages, follow that order, and cover every crossing operator edge;
//   - device sets are disjoint, non-empty and within the device count;
//   - micro_batch_size * num_micro_batches == batch_size.
// Predicted figures are per micro-batch of micro_batch_size samples unless named otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::partition {

struct Stage {
  int id = 0;
  std::vector<graph::NodeId> nodes;  // in topological order of the OpGraph
  std::vector<int> devices;          // ranks that run this stage (one for now)
  double forward_seconds = 0.0;      // predicted, one micro-batch
  double backward_seconds = 0.0;     // predicted, one micro-batch
  // Predicted transfer time of one micro-batch charged to this stage: one transfer (latency +
  // bytes / bandwidth) per operator edge entering or leaving the stage. Not part of
  // forward/backward_seconds, which are compute only; the stage's time is the sum of the three.
  double transfer_seconds = 0.0;
  double param_bytes = 0.0;          // parameters held by the stage
  double activation_bytes = 0.0;     // activations stashed for one micro-batch
  int in_flight = 1;                 // micro-batches whose activations are held at peak
  double memory_bytes = 0.0;         // predicted peak: weights, grads, optimizer, activations
  double static_bytes = 0.0;         // of which weights, grads, optimizer state and buffers
};

struct StageEdge {
  int src = 0;                          // producing stage
  int dst = 0;                          // consuming stage
  std::vector<graph::EdgeId> edges;     // operator edges carried, in OpGraph edge order
  double bytes = 0.0;                   // bytes per micro-batch (forward; backward sends the same)
  int tensors = 1;                      // tensors per micro-batch, one per producing operator: the
                                        // runtime sends each on its own, so each pays the latency
};

struct Plan {
  std::string partitioner;              // "metis", "graphpipe", "sequential", "manual"
  std::string graph_fingerprint;        // OpGraph::fingerprint() of the graph it was made for
  std::int64_t num_graph_nodes = 0;
  std::int64_t batch_size = 0;          // mini-batch size (samples per training step)
  std::int64_t micro_batch_size = 0;
  std::int64_t num_micro_batches = 0;
  int num_devices = 0;
  std::vector<Stage> stages;
  std::vector<StageEdge> edges;
  // slowest stage's (forward + backward + transfer) / micro_batch_size
  double bottleneck_seconds_per_sample = 0.0;
  int depth = 0;                        // stages on the longest path of the stage graph
  // (num_micro_batches + depth - 1) x the slowest stage's time per micro-batch, plus the part of
  // the optimizer steps that outlasts the pipeline (evaluate.h): the 1F1B estimate of one
  // training step that the partitioners use to choose the micro-batch size and the plan.
  double predicted_iteration_seconds = 0.0;
  double memory_limit_bytes = 0.0;      // the per-device limit the plan was made under
  std::string optimizer;                // "sgd", "momentum" or "adam": sets the memory figures
  // The stages run as a chain in list order (the sequential baseline): stage i waits for stage
  // i - 1 even where no operator edge joins them (skip tensors are forwarded), so depth is the
  // stage count and in-flight counts are chain positions. `edges` still lists only the stage
  // pairs that operator edges join.
  bool chain = false;
};

}  // namespace graphpipe::partition
