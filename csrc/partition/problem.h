// Problem: one partitioning question at one micro-batch size, with every per-operator and
// per-edge figure of the cost model computed once, so that partitioners and the evaluator read
// arrays instead of calling the cost model in their inner loops.
//
// Quantities are per micro-batch of `micro_batch_size` samples. A stage's time is
//   sum of compute[v] over its operators + sum of edge_seconds[e] over operator edges with
//   exactly one end in the stage
// (each tensor crossing a stage boundary is one transfer, charged at both ends: the sender
// waits for it in forward, the receiver in backward); its memory is
//   sum static_bytes[v] + (sum act_bytes[v] + sum edge_bytes[e] of edges entering it) x in-flight
// (received activations are stashed for the backward like the stage's own outputs).
// Building a Problem is O(V + E + V log P) for profiles of length P.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cost/cost_model.h"
#include "cost/gradient_buckets.h"
#include "cost/in_flight.h"
#include "cost/sync_load.h"
#include "cost/sync_method.h"
#include "graph/op_graph.h"
#include "partition/replicas.h"

namespace graphpipe::partition {

struct Problem {
  const graph::OpGraph* graph = nullptr;
  const cost::CostModel* model = nullptr;
  std::int64_t batch_size = 0;
  std::int64_t micro_batch_size = 0;
  std::int64_t num_micro_batches = 0;
  int max_stages = 1;            // at most one stage per device
  double memory_limit = 0.0;     // bytes per device
  cost::InFlightRule in_flight;  // in-flight micro-batches per stage (cost/in_flight.h)
  // Stages run as a chain (the sequential baseline: every stage feeds the next, skip tensors
  // are forwarded through the stages in between), so depth = stages and stage i of S holds
  // min(S - i, M) micro-batches whatever the operator edges say.
  bool chain = false;
  // Planned for the zero-bubble schedule (Options::zero_bubble).
  bool zero_bubble = false;
  // Replicated stages (Options::replicate; docs/design.md, "Replicated stages in the planner"):
  // when set, a stage may run as several data-parallel replicas, the devices of all stages
  // together at most device_budget. Null: one device per stage, as before replication existed.
  std::shared_ptr<const ReplicaTable> replicas;
  int device_budget = 1;  // devices a plan may use in all (max_stages without replication)
  // > 0: replicated stages are placed on the first placement_ranks ranks only (placement.h).
  int placement_ranks = 0;
  // How replicated stages synchronise, and what each operator's owned parameters ask of it
  // (cost/sync_load.h; make_problem sets the default all-reduce, set_sync another method). The
  // planner prices a stage's sync as one bucket holding all of its operators' gradients
  // (docs/design.md §4.9).
  cost::SyncMethod sync;
  double bucket_bytes = cost::kDefaultBucketBytes;  // the gradient buckets' cap (Options::bucket_bytes)
  std::vector<cost::SyncLoad> sync_load;            // per operator
  cost::SyncLoad sync_total;                        // the whole graph's
  double total_param_bytes = 0.0;                   // the whole graph's param_bytes

  std::vector<graph::NodeId> order;                // topological order of the operators
  std::vector<int> position;                       // position[v] = index of v in order
  std::vector<double> forward, backward, compute;  // compute = forward + backward
  // The backward's halves timed apart (CostModel::backward_input/weight_seconds); a stage's I
  // and W follow from them by backward_halves.h.
  std::vector<double> backward_input, backward_weight;
  std::vector<double> static_bytes;  // weights + grads + optimizer state + buffers
  std::vector<double> optimizer;     // the operator's share of the optimizer step, per iteration
  std::vector<double> param_bytes;   // parameters (what a replicated stage's all-reduce sums)
  std::vector<double> act_bytes;     // output activations, one micro-batch
  std::vector<double> edge_seconds;  // one transfer of the edge's tensor
  std::vector<double> edge_bytes;    // bytes of the edge's tensor, one micro-batch

  std::size_t num_nodes() const { return order.size(); }
  bool replicated() const { return replicas != nullptr; }
  double total_compute() const;
};

Problem make_problem(const cost::CostModel& model, std::int64_t batch_size, std::int64_t micro_batch_size,
                     int max_stages, double memory_limit, cost::InFlightRule in_flight);

// Sets problem.sync and the operators' sync loads. PowerSGD prices by parameter shapes: an
// operator with parameter bytes but no shapes is a PlanningError naming it.
void set_sync(Problem& problem, const cost::SyncMethod& method);

// Per step seconds of the sync of a stage on `ranks` whose operators' loads sum to `load`
// (cost::price_sync of one bucket; 0 for one rank).
double stage_sync_seconds(const Problem& problem, const std::vector<int>& ranks, const cost::SyncLoad& load);

// Micro-batch sizes a partitioner may choose: the powers of two that divide the mini-batch
// (1, 2, 4, ...), as in the paper. A fixed size gives just itself (checked to divide it).
std::vector<std::int64_t> micro_batch_candidates(std::int64_t batch_size, std::int64_t fixed = 0);

}  // namespace graphpipe::partition
