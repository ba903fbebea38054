// Evaluation of a node -> stage assignment on a Problem: the stage graph, whether it is
// acyclic, and every stage's predicted time and memory. It is the single place where stage
// figures are computed; plan building, refinement checks and the exhaustive reference in the
// tests all go through it, so partitioners are judged by one ruler.
//
// An assignment maps every operator to a label 0..K-1, every label used. When the quotient
// (stage) graph is acyclic, each stage is convex (a path leaving and re-entering a stage would
// be a cycle of the stage graph), and the stages are renumbered in a topological order of the
// stage graph (ties: the stage whose first operator comes first in the operator order), so
// that `stage_of` matches Plan's numbering. O(V + E + K log K).
//
// Replicated stages (docs/design.md, "Replicated stages in the planner"): a stage of d replicas
// is judged as one replica, which computes a shard of ceil(b / d) rows (ReplicaTable) and stashes
// that shard's activations. The stages get ranks by place_stages (placement.h) unless given;
// every operator edge between stages is then priced by the links between those ranks as the
// simulator prices a stage edge (cost/reshard.h: intra- or inter-node links, re-sharded pairs of
// replicas at once, the busiest rank's sum), charged at both ends, so that a plan's figures
// depend on the devices it uses and not on how many more the description has. (The simulator
// sends a tensor read by several operators of one stage once; here each edge pays, as the DPs
// count it.) Each
// replicated stage's sync is priced by the problem's sync
// method on its ranks (cost/sync_cost.h, as one bucket of all its operators' gradients; with the
// default all-reduce, cost::best_all_reduce of its parameter bytes); it runs after the stage's
// last backward, next to its optimizer step, so it joins the optimizer tail below, in buckets
// that start during that backward as the runtime runs them (only what outlasts it counts). With one device per stage
// every figure is what it was before replication existed, and stage s is on device s.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

struct StageFigures {
  double forward = 0.0, backward = 0.0, transfer = 0.0;
  // The backward split as a zero-bubble schedule runs it (backward_halves.h): I and W. A
  // recomputed stage's forward is added to the half that runs it first.
  double backward_input = 0.0, backward_weight = 0.0;
  double optimizer = 0.0;  // the stage's optimizer step, once per iteration
  double static_bytes = 0.0;
  double activation_bytes = 0.0;  // one micro-batch, received tensors included
  int in_flight = 1;
  double memory = 0.0;
  int replicas = 1;          // devices of the stage
  std::vector<int> devices;  // its ranks, ascending
  double all_reduce = 0.0;   // the sync over those ranks, per iteration (Problem::sync)
  double input_bytes = 0.0;  // one micro-batch's received tensors (what recomputation keeps)
  // Activation recomputation, chosen when the stage does not fit otherwise (and then fits
  // better): only the received tensors of the micro-batches in flight are kept, the forward
  // runs again in the backward (added to `backward`), and the recomputed micro-batch's
  // activations are held once.
  bool recompute = false;
  // The runtime's dispatch of the stage's forward and backward instructions per micro-batch
  // (stage_dispatch_seconds; the simulator adds the same per task).
  double dispatch = 0.0;
  double time() const { return forward + backward + transfer + dispatch; }
};

// StageFigures::dispatch of every stage: one forward and one backward instruction per
// micro-batch.
inline double stage_dispatch_seconds(const cost::Devices& devices) {
  return 2.0 * devices.instruction_overhead_seconds;
}

struct Evaluation {
  bool acyclic = false;
  std::vector<int> cycle;  // labels of a stage cycle (input labels) when not acyclic
  int num_stages = 0;
  std::vector<int> stage_of;                     // node -> stage, renumbered topologically (when acyclic)
  std::vector<StageFigures> stages;              // by renumbered stage
  std::vector<std::pair<int, int>> stage_edges;  // distinct (src, dst), sorted
  int depth = 0;
  double bottleneck = 0.0;  // slowest stage time per micro-batch
  // Under a split backward: the slowest stage's forward + I + W + transfer, and its share of the
  // zero-bubble fill, max(0, forward + transfer + I - W).
  double split_bottleneck = 0.0;
  double split_fill = 0.0;
  // How far the optimizer steps reach past the pipeline's end: a stage sums its gradients over
  // its replicas and steps after its last backward, which comes before the backwards still to
  // run on the stages upstream of it (the longest such path); max over stages of (its
  // all-reduce + its step - that upstream backward work), >= 0.
  double optimizer_tail = 0.0;
  double max_overflow = 0.0;    // largest memory - limit over stages (<= 0 when it fits)
  int worst_memory_stage = -1;  // the stage with that overflow
  bool fits() const { return max_overflow <= 0.0; }
  // (num_micro_batches + depth - 1) x bottleneck + optimizer_tail + the step's fixed cost
  // (cost::Devices::step_overhead_seconds and rank_skew_seconds); under the zero-bubble
  // schedule (Problem::zero_bubble) the fill and drain are ZB-H1's, whose weight-gradient halves
  // fill the bubbles: num_micro_batches x split_bottleneck + (depth - 1) x split_fill +
  // optimizer_tail (M (F + I + W) + (p - 1)(F + I - W) on a chain; with I = W = B / 2 the
  // 1F1B bottleneck's M (F + B) + (p - 1) F).
  double iteration_seconds(const Problem& problem) const;
  // The step's wait for its slowest rank (cost::Devices::rank_skew_seconds) of the busiest rank's
  // forwards and backwards with their dispatch, M per stage it holds; part of iteration_seconds'
  // fixed cost.
  double rank_skew_seconds(const Problem& problem) const;
};

// The 1F1B step of `micro_batches` micro-batches through `depth` stages whose slowest takes
// `bottleneck`: (micro_batches + depth - 1) x bottleneck. The one closed form; the evaluation's
// iteration_seconds and the graphpipe DP's depth trade-off (graphpipe_dp.h) both use it.
inline double pipeline_step(std::int64_t micro_batches, int depth, double bottleneck) {
  return static_cast<double>(micro_batches + depth - 1) * bottleneck;
}

// Throws PlanningError when labels are out of range or a label is unused.
// `replicas` (by input label; empty: one each) sets each stage's device count; more than one
// needs problem.replicated() and at most its ReplicaTable's max_replicas(). `devices` (by input
// label; empty: placed by place_stages) gives the ranks explicitly (manual plans); each list's
// size must then be the stage's replica count.
Evaluation evaluate(const Problem& problem, const std::vector<int>& assignment, const std::vector<int>& replicas = {},
                    const std::vector<std::vector<int>>& devices = {});

// How every choice between plans that fit ranks them (the graphpipe portfolio's winner, the
// driver's micro-batch size): whether a plan of predicted step `step` and slowest stage
// `bottleneck` beats the best so far. It does when its step is shorter by more than a relative
// 1e-12, or equal within that and its slowest stage is lower; the margin keeps rounding in sums
// of the same figures from deciding. When neither holds the best so far stays, so a full tie
// goes to the candidate seen first.
bool predicted_faster(double step, double bottleneck, double best_step, double best_bottleneck);

}  // namespace graphpipe::partition
