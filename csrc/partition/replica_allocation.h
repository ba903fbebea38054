// Replica allocation for a fixed stage layout, and the data-parallel candidate
// (docs/design.md, "Replicated stages in the planner").
//
// The graphpipe and sequential DPs choose replica counts jointly with the cut; every other
// candidate (METIS's layout, refined or down-set layouts, a DP plan that leaves devices unused)
// gets its replicas here, greedily: the slowest stage (or, while a stage overflows memory, the
// worst one, whose activations shrink with its shard) gets the next replica count that shrinks
// its shard, if the predicted step (evaluate.h) does not get worse and that stage gets faster;
// the first such move the device budget cannot pay for ends the allocation (the moves do not
// depend on the budget, so a larger budget makes the same moves and then more: never slower).
// Each round is one evaluation, O(V + E), at most device-count rounds.
//
// Replica-aware stage time used inside the DPs: a stage of d replicas is charged
//   compute at ceil(b / d) rows + its crossing transfers with each tensor's bytes / d
//   + its sync estimate / num_micro_batches,
// the sync (the all-reduce by default) amortised over the micro-batches because it runs once per iteration, while the
// slowest stage's time repeats (M + depth - 1) times in the step. The transfer share assumes the
// neighbours have no more replicas (bytes / max(d_src, d_dst) is at most bytes / d), so the DPs
// never promise less than the evaluation charges.
#pragma once

#include <utility>
#include <vector>

#include "partition/partitioner_interface.h"
#include "partition/problem.h"

namespace graphpipe::partition {

// A stage's per-replica time at `level` (ReplicaTable) from the group sums the DPs keep: its
// compute at that level, its transfer and crossing bytes on one device, its parameter bytes.
double replica_stage_time(const Problem& problem, int level, double compute, double transfer, double cross_bytes,
                          double params);

// The DPs' O(1) estimate of the sync of a stage of `params` parameter bytes on d replicas: the
// problem's sync method (Problem::sync) priced by the table's collective estimates
// (EstimatePricer) on the graph's sync load scaled to the stage's share of the parameter bytes
// (a stage is assumed as compressible as the whole graph; the plan's figure prices its own
// operators, evaluate.h). With the default all-reduce it is ReplicaTable::all_reduce_estimate.
double sync_estimate(const Problem& problem, int d, double params);

// Replica counts by label for `assignment`, starting from `replicas` (empty: one each), adding
// devices greedily as above within problem.device_budget. Returns `replicas` unchanged (or ones)
// when the problem is not replicated. `trail`, when given, receives every state the greedy
// allocation passes through before the last (the start first): with fewer devices the
// allocation stops at one of them, so a list that holds them holds the smaller budgets' results.
std::vector<int> allocate_replicas(const Problem& problem, const std::vector<int>& assignment,
                                   std::vector<int> replicas = {}, std::vector<std::vector<int>>* trail = nullptr);

// Plain data parallelism: every operator in one stage, on the replica count (at most the device
// budget and the micro-batch's rows) with the least predicted step. Returns (assignment, replicas).
std::pair<std::vector<int>, std::vector<int>> data_parallel_plan(const Problem& problem);

// Plain data parallelism at every replica count the table distinguishes (its levels) within
// the budget, as replica vectors of the one stage, fewest devices first.
std::vector<std::vector<int>> data_parallel_counts(const Problem& problem);

// The index of the candidate (with its replicas) that fits with the least predicted step (the
// least overflow when none fits; ties to the earlier), as the graphpipe portfolio judges.
std::size_t fastest_candidate(const Problem& problem, const std::vector<CandidatePlan>& candidates);

}  // namespace graphpipe::partition
