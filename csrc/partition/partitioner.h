// partition(): the front door of csrc/partition. Given an OpGraph, the devices and Options
// (options.h), it asks one partitioner for a plan at every candidate micro-batch size and returns
// the best Plan. How the partitioners fit together and where they come from: docs/design.md §4.
//
// Partitioners, looked up by name in the registry (registry.h), all judged by the same cost
// model, memory limit and micro-batch freedom:
//   "graphpipe"   the portfolio of series-parallel DP, cuts of topological orders, refinement
//                 and exact down-set plans, with its fallback (graphpipe_portfolio.h)
//   "metis"       METIS k-way, repaired to an acyclic stage graph and refined (metis/metis.h)
//   "sequential"  the chain baseline: contiguous cuts of one topological order
//                 (sequential_partitioner.h)
//   "manual"      the user's mapping of modules to stages (manual_partitioner.h)
//
// Replication (Options::replicate): every partitioner may give a stage several devices, its
// data-parallel replicas; how each chooses them is in docs/design.md, "Replicated stages in the
// planner", and the candidates carry their replica counts to the evaluation and the Plan.
//
// Micro-batch size: the given one, or the one derived from num_micro_batches, or else every power
// of two dividing the mini-batch (problem.h). For each, the partitioner's candidate is evaluated
// (evaluate.h), and of those that fit in memory the plan with the least predicted step,
// (num_micro_batches + depth - 1) x slowest stage plus the part of the optimizer steps that
// outlasts the pipeline, wins (ties: the lower slowest stage, then the smaller micro-batch;
// predicted_faster in evaluate.h). The micro-batch size is chosen here, once for all
// partitioners, because it trades the bubble against per-micro-batch overheads and memory in the
// same way whatever made the stages. A size whose step_lower_bound (step_bound.h) is above the
// step of a fitting plan already found is not planned: the sizes are taken in ascending order of
// bound and offered in ascending order of size, so the choice is what planning every size would
// give. Where the partitioner allows it (Partitioner::plans_sizes_at_once), as many workers as
// the machine has cores take the sizes, each the next one as soon as it is free.
//
// Errors (PlanningError unless said), in the order they are checked: an empty graph; a cyclic
// graph (GraphError naming the cycle); zero devices; more devices than operators without
// replication (a stage needs at least one operator); an unknown
// partitioner (naming the registered ones); a negative max_stages or a non-positive tolerance;
// a bad batch / micro-batch combination or memory limit; a model whose static memory cannot fit
// (one operator, or all of them on all devices); the partitioner's own input errors (a bad
// manual mapping); a plan whose stages feed each other in a cycle; a model that does not fit at
// any micro-batch size, with the stage, its need, the limit and the excess.
//
// partition_candidates(): the same driver, but every candidate of every micro-batch size that
// fits in memory, with its closed-form figures and a bound no schedule beats, for a caller that
// ranks them by other means (planner/planner.h simulates them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cost/cost_model.h"
#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "partition/partitioner_interface.h"
#include "plan/plan.h"

namespace graphpipe::partition {

plan::Plan partition(const graph::OpGraph& graph, const cost::Devices& devices, const Options& options);

// One candidate that fits, as partition_candidates found it.
struct RankedCandidate {
  std::int64_t micro_batch_size = 0;
  CandidatePlan layout;
  double predicted_step = 0.0;  // the closed form (Evaluation::iteration_seconds)
  double bottleneck = 0.0;
  // No schedule of the kind it was planned for runs the plan faster: every rank runs each of the
  // M micro-batches' forward and backward (and their dispatch), so M x the slowest stage's
  // compute + dispatch per micro-batch, plus the step's fixed cost, is a lower bound of its
  // simulated step. The backward counted is the whole one, or planned for the zero-bubble
  // schedule (Options::zero_bubble), the lesser of the whole one and its two halves.
  double compute_bound = 0.0;
  // A tighter bound where every backward runs whole (1F1B, fill-drain; not a split backward,
  // whose weight halves may run last): a stage's first forward waits for one micro-batch's
  // forwards along the longest path of stages into it, and after its last backward that
  // micro-batch's backwards run on every stage along the longest path back to a source; so the
  // max over stages of (that path's forwards + M x the stage's compute + dispatch + the path's
  // backwards), plus the step's fixed cost. At least compute_bound.
  double pipeline_bound = 0.0;
  // Its place among its micro-batch size's candidates as listed: with micro_batch_size, a name
  // for it that stays when the set lists more sizes (CandidateSet::list_below).
  std::size_t listed = 0;
};

// Every distinct candidate of the partitioner (Partitioner::candidates, with
// Options::every_candidate as given) at every candidate micro-batch size, after the same checks
// as partition() (same errors). Candidates that do not fit in memory or whose stages feed each
// other in a cycle are left out; the rest are ordered as partition() prefers them (predicted
// step, then slowest stage, then smaller micro-batch, then the partitioner's order), so
// candidates()[0] is partition()'s plan when the list is not empty. The graph and devices must
// outlive the set. With a finite `listed_below` (the planner passes the best step it has
// simulated), a micro-batch size is not planned where no candidate of it could be ordered below
// that: its floor, compute_lower_bound and, where backwards run whole, pipeline_lower_bound
// (step_bound.h; candidate_floor's, size by size), is above it.
//
// Sizes listed in turns: with `first_sizes` k > 0, only the k sizes of least floor (ties: the
// larger size) are listed at first, the others kept pending; list_below(step) then lists the
// pending ones whose floor is not above a step the caller has found among those listed, and
// leaves out for good those above it, which could not be ordered below it. The candidates are
// always those of the sizes listed, in partition()'s order, so listing in turns changes which
// sizes are listed, never the order among those that are.
class CandidateSet {
 public:
  CandidateSet(const graph::OpGraph& graph, const cost::Devices& devices, const Options& options,
               double listed_below = std::numeric_limits<double>::infinity(), std::size_t first_sizes = 0);
  ~CandidateSet();
  CandidateSet(const CandidateSet&) = delete;
  CandidateSet& operator=(const CandidateSet&) = delete;

  // Whether a pending size's floor is not above `step` (list_below would list it).
  bool pending_below(double step) const;
  // Lists the pending sizes whose floor is not above `step`; the others are left out for good.
  void list_below(double step);

  const std::vector<RankedCandidate>& candidates() const { return candidates_; }
  // The Plan of candidates()[i], built as partition() builds its plan.
  plan::Plan build(std::size_t i) const;
  // candidates()[i]'s layout with each of its labels (CandidatePlan::assignment's) on the given
  // ranks.
  plan::Plan build(std::size_t i, const std::vector<std::vector<int>>& label_ranks) const;
  // The placements one step from `plan` (candidates()[i] as built, or grown before), ranks by
  // label as build() takes them: each stage in turn at its next replica count (the
  // ReplicaTable's next level, the least count that shrinks its shard), its new ranks from those
  // no stage holds (placement.h, grow_stage), the other stages where they are, within the device
  // budget. Empty where replicas are not allowed (a plain pool) or the user named the stages'
  // devices.
  std::vector<std::vector<std::vector<int>>> replica_growths(std::size_t i, const plan::Plan& plan) const;

 private:
  const graph::OpGraph& graph_;
  const cost::Devices& devices_;
  Options options_;
  // Lists `sizes` (each size's candidates planned by a pool of workers) and orders every listed
  // candidate again.
  void list(const std::vector<std::int64_t>& sizes);

  std::unique_ptr<cost::CostModel> model_;
  std::unique_ptr<PartitionRequest> request_;
  std::unique_ptr<Partitioner> partitioner_;
  std::map<std::int64_t, Problem> problems_;
  // (floor, size) of the sizes not listed yet, least floor first.
  std::vector<std::pair<double, std::int64_t>> pending_;
  std::map<std::int64_t, std::vector<RankedCandidate>> by_size_;  // the listed sizes' candidates
  std::vector<RankedCandidate> candidates_;
};

// A lower bound on the bound the planner orders every candidate CandidateSet(graph, devices,
// options) would list by, and so on each one's simulated step under the schedule it is planned
// for (Options::zero_bubble: a split backward; else whole backwards), grown replicas within the
// devices included, found without listing any: the least over the micro-batch sizes of
// compute_lower_bound (M x the slowest stage's floor + the step's fixed cost, each operator
// counted as its forward and weight-gradient half under a split backward, else its whole
// compute) and, where backwards run whole, pipeline_lower_bound (step_bound.h). For the planner,
// which lists a pool of candidates only where this is below the best step it has simulated. The
// same checks and errors as CandidateSet.
double candidate_floor(const graph::OpGraph& graph, const cost::Devices& devices, const Options& options);

// The names accepted in Options::partitioner: the registry's (registry.h), in its order.
std::vector<std::string> partitioner_names();

}  // namespace graphpipe::partition
