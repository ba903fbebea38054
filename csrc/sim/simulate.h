// simulate: predicts how one training iteration of a Plan runs under a given Schedule.
//
// The model is the DAG of docs/design.md §6 (Shi et al.): its nodes are tasks, namely a forward
// and a backward per stage per micro-batch, a transfer per stage edge per micro-batch in each
// direction (activation forward, gradient back), and an optimizer step per stage; its edges are
// data dependencies, each rank's program order (the Schedule's, so the prediction is of what the
// runtime will do, not of an idealised pipeline), and the FIFO order of transfers on each
// ordered pair of ranks. Every task starts when its last predecessor ends; the iteration time is
// the longest path, and the critical path is that path, task by task.
//
// Durations: forward/backward from Stage::forward_seconds / backward_seconds (one micro-batch),
// a split backward's halves from schedule::backward_split;
// a transfer takes Devices::transfer_seconds(src rank, dst rank, StageEdge::bytes), plus one more
// link latency for each tensor after the first (the runtime sends every tensor on its own), and occupies
// its ordered link (one transfer at a time per src -> dst pair, in schedule order); the optimizer
// step takes optimizer_traffic_factor * param_bytes / memory_bandwidth (it is memory bound; 0
// when the devices give no memory bandwidth).
//
// Two communication models:
//   overlap = false  The runtime's blocking semantics (check.h): a rank posts each batch of
//                    consecutive sends/receives and waits for all of them; a transfer starts once
//                    both its send and its receive are posted (rendezvous). Communication and
//                    computation of a rank never overlap.
//   overlap = true   Communication has its own channel: a send starts as soon as its data is
//                    computed and its link is free, receives are posted ahead of time, and a
//                    compute waits only for the arrival of the data it consumes.
//
// Figures: iteration time (from 0 to the last task's end), throughput (samples of the
// mini-batch per second), per rank the time computing (busy), communicating while not computing
// (comm), and neither, i.e. waiting for other ranks (bubble), each also as a share of the
// iteration; per stage the peak number of micro-batches in flight on the simulated timeline (a
// micro-batch is held from the start of its forward to the end of its backward, or of its W) and that peak
// times Stage::activation_bytes.
//
// Replicated stages (a stage on several ranks, schedule.h): the leads' programs are replayed and
// each replica's figures are its lead's. Forward and backward times are the plan's, which are per
// replica (its shard of the micro-batch); a re-sharded edge moves each pair of replicas' shared
// rows at once (schedule/shards.h); the all_reduce task sums the stage's gradients in buckets
// that start during the last backward, as the runtime does (add_all_reduce in simulate.cpp);
// where the devices' collectives share the compute's cores (Devices::collective_overlap_loss),
// the rank goes on later by what the collectives beside its backward cost it
// (cost::overlap_loss_seconds).
//
// Sync methods (cost/sync_method.h, SimOptions::sync, by default the plan's): the buckets are the
// runtime's (cost/gradient_buckets.h, from Stage::parameters; without parameter shapes,
// bucket_sizes' flat buckets of param_bytes), each priced by cost/sync_cost.h. Bucket k's
// gradients are final once the last backward has produced its share of the bytes (the backward
// produces them at an even pace, in bucket order). Top-k and PowerSGD first compress the bucket
// (a `compress` task on the rank, after the previous bucket's compression), then run its
// collectives after the previous bucket's; the all_reduce task spans the first collective's
// start to the last one's end. Compression is assumed to overlap the rest of the backward, as
// the collectives do (optimistic where the backward keeps the device busy). Local SGD exchanges
// nothing during the step (the all_reduce task is empty); on a step that averages, an `average`
// task after the optimizer step all-reduces the parameters. One iteration is simulated:
// SimOptions::sync_step chooses a step that averages (the default) or a local one, and
// amortized_iteration_seconds weighs the two over the period (one averaging step in `period`),
// from a second replay of the other kind. samples_per_second is per amortised iteration.
//
// The schedule must be valid and deadlock-free (it is checked first; ScheduleError otherwise) and
// match the plan (same stages and edges). Cost: O(T log T) for T tasks, about 15-20 ms
// for 32 stages x 256 micro-batches (deadlock check included) on one core.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cost/cost_model.h"
#include "cost/cross_replica.h"
#include "cost/devices.h"
#include "cost/gradient_buckets.h"
#include "cost/sync_method.h"
#include "plan/plan.h"
#include "schedule/schedule.h"

namespace graphpipe::sim {

enum class TaskKind {
  forward,
  backward,
  activation,
  gradient,
  optimizer,
  all_reduce,
  backward_input,
  backward_weight,
  compress,
  average,
  cross_replica
};

std::string_view task_kind_name(TaskKind kind);  // "forward", "backward", "activation", ...

struct Task {
  TaskKind kind = TaskKind::forward;
  int rank = 0;          // where it runs; for a transfer, the sending rank
  int peer = -1;         // for a transfer, the receiving rank
  int stage = 0;         // for a transfer, the sending stage
  int micro_batch = -1;  // -1 for the optimizer step; a compress task's gradient bucket
  int edge = -1;         // for a transfer, the index into Plan::edges
  double start = 0.0;
  double end = 0.0;
  int cause = -1;  // the task whose end fixed this start (-1: it starts at time 0)
};

// "F3 s1" (forward of micro-batch 3 at stage 1), "B3 s1", "A3 e0" (activation of micro-batch 3
// over edge 0), "G3 e0" (its gradient), "OPT s1", "AR s1" (the replicas' gradient sum), "I3 s1"
// and "W3 s1" (a split backward's input- and weight-gradient halves), "C2 s1" (compressing
// gradient bucket 2 of stage 1: top-k, PowerSGD), "AVG s1" (local SGD's parameter averaging)
// and "XR r1" (rank 1's average across fault-tolerant replicas, cross_replica_tail.h).
std::string task_name(const Task& task);

struct RankStats {
  int rank = 0;
  int stage = -1;  // -1 for a rank without a stage
  double busy_seconds = 0.0;
  double comm_seconds = 0.0;
  double bubble_seconds = 0.0;
  double busy_share = 0.0;
  double comm_share = 0.0;
  double bubble_share = 0.0;
  double idle_share = 0.0;  // comm_share + bubble_share
};

struct StageStats {
  int stage = 0;
  int rank = 0;
  int peak_in_flight = 0;
  double peak_activation_bytes = 0.0;
};

struct SimOptions {
  bool overlap = true;
  double optimizer_traffic_factor = cost::kOptimizerTrafficFactor;  // bytes moved per parameter byte
  // The optimizer the step runs, priced per parameter tensor (Devices::optimizer_tensor_seconds);
  // empty: the plan's (Plan::optimizer, which also sized its memory; Adam for a plan without
  // one). Given where a run steps another optimizer than its plan was sized for (compare.py plans
  // Adam's memory and steps SGD).
  std::optional<cost::Optimizer> optimizer;
  // Bucket size of a replicated stage's gradient all-reduce (cost/gradient_buckets.h).
  double bucket_bytes = cost::kDefaultBucketBytes;
  // How replicated stages synchronise; empty: the plan's method (Plan::sync).
  std::optional<cost::SyncMethod> sync;
  // Local SGD: simulate a step that averages the parameters (true) or a local step (false).
  bool sync_step = true;
  // Fault-tolerant replicas of the whole pipeline (cost/cross_replica.h): with replicas > 1,
  // the step ends as sim/cross_replica_tail.h says (every rank's average across the replicas,
  // the replicas' agreement, then the optimizer steps). Local SGD is refused (PlanningError):
  // its averaging steps are not the fault-tolerant step's.
  cost::CrossReplica cross_replica;
};

struct SimResult {
  bool overlap = true;
  double iteration_seconds = 0.0;  // of the simulated step
  // The mean iteration over a local-SGD period: (period - 1) local steps and one that averages;
  // iteration_seconds for every other method.
  double amortized_iteration_seconds = 0.0;
  cost::SyncMethod sync;            // the method simulated
  std::int64_t samples = 0;         // per iteration
  double samples_per_second = 0.0;  // samples / amortized_iteration_seconds
  std::vector<Task> tasks;          // computes in each rank's program order, transfers as matched
  std::vector<RankStats> ranks;
  std::vector<StageStats> stages;
  std::vector<int> critical_path;  // task indices, first to last

  // Headline figures, one line per rank and stage, and the critical path.
  std::string summary() const;
};

SimResult simulate(const plan::Plan& plan, const schedule::Schedule& schedule, const cost::Devices& devices,
                   const SimOptions& options = {});

}  // namespace graphpipe::sim
