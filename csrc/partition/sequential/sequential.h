// The sequential (PipeDream-style) partitioner, the baseline every benchmark compares against:
// one topological order of the operators cut into contiguous segments, so the stages form a
// chain. A dynamic program over (segment start, stages left) minimises the slowest stage's time
// under the memory limit, where the i-th stage from the end of a chain holds min(i, M)
// micro-batches in flight (1F1B); among equally fast chains the shortest wins. A segment that
// fits only with activation recomputation is taken recomputed and timed with its forward once
// more (recompute.h, the rule the evaluation applies), so the DP's slowest stage is the one the
// evaluation predicts wherever the order has no skip tensors to relay.
//
// Exact over cut positions for up to U "units" of the order, U = sqrt(4e7 / stages) (about 790
// for 64 stages); longer orders are first cut into U chunks of about equal compute, so cuts fall
// only at chunk boundaries. Cost O(U^2 x stages + U x (V + E)) at most; two prunes that leave
// the plan as it is cut that: a stage count is dropped for a first segment once the segment's
// compute reaches that count's best chain, and no segment is grown past the slowest stage of a
// chain of equal-compute segments (a stage's time is at least its compute, and the plan is at
// most that slow), so a first segment is grown over about U / stages units, not U / 2.
// Returns a node -> stage label assignment (labels along the chain), or an empty vector when no
// chain fits in memory.
//
// With replication (Problem::replicated(); docs/design.md, "Replicated stages in the planner")
// the chain's stages may each take several devices, as PipeDream's planner lets them:
// sequential_replicated binary-searches the slowest stage's time T (replica_allocation.h says
// how a replicated stage is timed), and for each T a DP over (segment start, stages left) finds
// the fewest devices that cover the order with stages of time <= T that fit in memory, each
// segment taking its least replica count that does. T is feasible when that is at most the
// device budget. Of the least feasible T's chains (one per stage count), the one with the least
// predicted step (evaluate.h) is returned, with its replica counts. A segment that fits only
// recomputed is recomputed, by the rule every DP shares (recompute.h). The sequential
// partitioner plans with PipeDream's DP (pipedream.h), which charges a chain's relays itself;
// this search is kept as the reference that times stages exactly as the tree DP does
// (replica_stage_time, with no per-target caches), against which the tests check the tree DP. The order is cut into at
// most U = sqrt(4e6 / stages) units (about 250 for 64 stages); cost O(U^2 x (stages + levels))
// per probe, about log2(range / tolerance) probes.
#pragma once

#include <utility>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

std::vector<int> sequential_assignment(const Problem& problem);

// sequential_assignment's chain for each of `stage_caps` in its place (each as if it were
// problem.max_stages), from one table: the plans are those of separate calls wherever the order
// is cut into the same units for every cap (it is one unit an operator while the order has at
// most chain_unit_budget(largest cap) operators; a longer order is cut at the largest cap's
// granularity for all). A cap's plan lies among the table's first cap stages, so one table of
// the largest serves them all. At least one cap.
std::vector<std::vector<int>> sequential_assignments(const Problem& problem, const std::vector<int>& stage_caps);

// The most units sequential_assignment cuts an order into for chains of at most `stages`
// stages: max(16, sqrt(4e7 / stages)).
int chain_unit_budget(int stages);

// Cuts `weights` into at most `parts` contiguous runs of about equal weight: a run ends at the
// first item that brings the sum so far to (runs made + 1) / parts of `total`, or where every
// item left must start a run of its own; every run has an item. Returns the start of each run,
// then weights.size(). One item per run when parts >= weights.size().
std::vector<int> equal_weight_cuts(const std::vector<double>& weights, double total, int parts);

// Cuts problem.order into at most `units` contiguous chunks of about equal compute
// (equal_weight_cuts of the operators' compute in that order); returns the start position of
// each chunk, then the order's length.
std::vector<int> chunk_bounds(const Problem& problem, int units);

// (assignment, replica counts by label); both empty when no chain fits in memory.
std::pair<std::vector<int>, std::vector<int>> sequential_replicated(const Problem& problem, double tolerance);

}  // namespace graphpipe::partition
