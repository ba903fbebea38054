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
#pragma once

#include <utility>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

struct StageFigures {
  double forward = 0.0, backward = 0.0, transfer = 0.0;
  double optimizer = 0.0;         // the stage's optimizer step, once per iteration
  double static_bytes = 0.0;
  double activation_bytes = 0.0;  // one micro-batch, received tensors included
  int in_flight = 1;
  double memory = 0.0;
  double time() const { return forward + backward + transfer; }
};

struct Evaluation {
  bool acyclic = false;
  std::vector<int> cycle;              // labels of a stage cycle (input labels) when not acyclic
  int num_stages = 0;
  std::vector<int> stage_of;           // node -> stage, renumbered topologically (when acyclic)
  std::vector<StageFigures> stages;    // by renumbered stage
  std::vector<std::pair<int, int>> stage_edges;  // distinct (src, dst), sorted
  int depth = 0;
  double bottleneck = 0.0;             // slowest stage time per micro-batch
  // How far the optimizer steps reach past the pipeline's end: a stage steps after its last
  // backward, which comes before the backwards still to run on the stages upstream of it (the
  // longest such path); max over stages of (its step - that upstream backward work), >= 0.
  double optimizer_tail = 0.0;
  double max_overflow = 0.0;           // largest memory - limit over stages (<= 0 when it fits)
  int worst_memory_stage = -1;         // the stage with that overflow
  bool fits() const { return max_overflow <= 0.0; }
  // (num_micro_batches + depth - 1) x bottleneck + optimizer_tail
  double iteration_seconds(const Problem& problem) const;
};

// Throws PlanningError when labels are out of range or a label is unused.
Evaluation evaluate(const Problem& problem, const std::vector<int>& assignment);

// How every choice between plans that fit ranks them (the graphpipe portfolio's winner, the
// driver's micro-batch size): whether a plan of predicted step `step` and slowest stage
// `bottleneck` beats the best so far. It does when its step is shorter by more than a relative
// 1e-12, or equal within that and its slowest stage is lower; the margin keeps rounding in sums
// of the same figures from deciding. When neither holds the best so far stays, so a full tie
// goes to the candidate seen first.
bool predicted_faster(double step, double bottleneck, double best_step, double best_bottleneck);

}  // namespace graphpipe::partition
