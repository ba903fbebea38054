// PipeDream's planner (Narayanan et al., SOSP 2019, §3.1), the replicated sequential baseline:
// a dynamic program over contiguous cuts of one topological order and the devices each stage
// gets, stages replicated within and across servers.
//
// A(j, m) is the least bottleneck (slowest stage time) of a chain covering units j.. of the
// order with AT MOST m devices:
//   A(j, m) = min( A(j, m - 1),
//                  min over a first segment j..e-1 on r replicas (r <= m) of
//                      max(T(j, e, r), A(e, m - r)) )
// as PipeDream's recurrence (its A(i -> j, m) with the replicated stage time T), where "at most"
// lets a plan leave devices idle. T is the replica-aware stage time the other DPs use
// (replica_allocation.h: compute at the replica's shard, its share of the crossing tensors, the
// stage's sync amortised over the micro-batches); the sync of r contiguous ranks is the
// all-reduce inside a node, and hierarchical across nodes when r spans several, which is where
// PipeDream's per-level bandwidths come in. Transfers are priced at one link per DP run: the
// slowest link inside the first node for plans of at most a node's devices (placement keeps them
// there, placement.h), and the slowest link of the description for larger plans; both figures
// depend only on the kind of device and the node size, never on how many devices there are.
// A segment must fit in memory with the micro-batches a 1F1B chain stage may hold: at most
// 1 + the devices left for the rest (each later stage takes one at least), and at most M.
//
// On a chain (Problem::chain) a segment is also charged the tensors the chain relays through it
// (chain_units.h), as the evaluation charges them, so its chains fit as evaluated; the chains of
// PipeDream's own pricing, which knows no relays, are returned after them (the caller evaluates
// every candidate: those that overflow by a relay drop out, those that fit may simulate faster).
//
// Every distinct chain A(0, m) for m = 1..budget is returned (with its replica counts): the set
// for a larger budget contains the set for a smaller one, so that choosing among them by the
// predicted step (evaluate.h, which depends only on the devices a plan uses) never gets worse
// with more devices. The order is cut into at most 64 units of about equal compute (chunk_bounds,
// sequential.h). Cost O(U^2 x budget x levels) per micro-batch size, U <= 64.
#pragma once

#include <utility>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

struct ChainPlan {
  std::vector<int> assignment;  // node -> stage label, labels along the chain
  std::vector<int> replicas;    // by label
};

// Needs problem.replicated(). Empty when no chain fits in memory.
std::vector<ChainPlan> pipedream_plans(const Problem& problem);

// A chain's ranks per label: placed (placement.h) on the first ranks it uses, as the DP above
// assumes (contiguous ranks), not on the whole budget. Placed on the budget, a chain's ranks
// could change with devices it does not use (a node only partly in the budget has room for one
// more replica at budget n + 1 than at n), and so its step: the candidates of a larger budget
// would no longer include every smaller budget's as they were.
std::vector<std::vector<int>> placed_on_first_ranks(const Problem& problem, const ChainPlan& chain);

// One search's chains: with the relays charged on a chain (`relays`), or priced as PipeDream
// prices them.
std::vector<ChainPlan> pipedream_chains(const Problem& problem, bool relays);

}  // namespace graphpipe::partition
