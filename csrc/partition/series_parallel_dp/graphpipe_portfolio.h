// The "graphpipe" partitioner: a portfolio of stage layouts at each micro-batch size, judged by
// one rule (portfolio_winner) on the predicted step (docs/design.md §4.4).
//
// Why a portfolio: no single search covers every good plan. The series-parallel DP
// (graphpipe_dp.h) is fast and handles large graphs, but its family of stages misses some convex
// partitions (a stage holding the tail of one branch and the head of the next); cuts of a
// topological order (sequential.h) find those; refinement (refine.h) lowers the slowest stage
// but may deepen the stage graph; and on small graphs the exact down-set DP (downset.h) finds
// plans that interleave branches. So all are tried, and the predicted step, which weighs depth
// against the slowest stage, decides.
//
// Candidates on a series-parallel graph, in this order (the order breaks ties):
//   1. the DP's plans: that of least slowest stage, then the shallower ones found at larger
//      targets; and the first of them refined;                      label "graphpipe"
//   2. the sequential DP's cuts of three topological orders, evaluated as graphs (independent
//      segments run in parallel): the graph's own order, and the tree's order with each
//      parallel node's branches one after another, largest compute first or smallest first;
//      each as is and refined;                                       label "graphpipe(chain)"
//   3. on graphs of at most 64 operators and 1024 down-sets, the exact down-set DP's plans
//      (for every depth bound, the least slowest stage over all acyclic partitions);
//                                                                    label "graphpipe(downset)"
// Fallback, for a graph that is not series-parallel (logged at info level) and for a
// micro-batch size at which no layout of the DP's family fits in memory: two refined starts,
// METIS's layout (metis.h; computed once per device budget, at the middle candidate micro-batch
// size) and the sequential DP's chain, both candidates (the predicted step chooses: METIS's
// keeps branches apart, the chain's balances the stages);
//                                                                    label "graphpipe(fallback)"
// then the down-set plans where they exist, as in 3.
// Refinement of the DP's plan and of the starts is skipped when Options::refine is off.
//
// With replication (Problem::replicated(); docs/design.md, "Replicated stages in the planner"):
// the DP's plans carry the replica counts it chose with the cut. The candidates above are made
// at every device budget of a ladder (the powers of two up to the budget; the budget itself when
// it is one), since their searches are not monotone in the budget (the plain chains of every
// budget are read from one table per order: sequential_assignments); every one's leftover devices
// are then handed out greedily within the whole budget (replica_allocation.h, which only gains
// moves as the budget grows); plain data parallelism, the whole graph as one stage on its best
// replica count, is one more candidate,                              label "graphpipe(data-parallel)";
// and so are PipeDream's chains (pipedream.h, one per device count up to the budget) of the
// three orders, evaluated as graphs,                                 label "graphpipe(pipedream)".
// Each candidate's figures depend only on the devices it uses (evaluate.h), and the list for a
// budget holds, for every candidate for a smaller budget, one at least as fast: the planner never
// returns a slower plan for more devices, and never one slower than the sequential baseline's.
//
// The winner (portfolio_winner): the least predicted step, (M + depth - 1) x slowest stage +
// optimizer tail (evaluate.h), among the candidates that fit in memory; ties to the earlier
// candidate, so to the DP. Its label becomes Plan::partitioner, which says which part won.
#pragma once

#include <cstddef>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "graph/series_parallel.h"
#include "partition/partitioner_interface.h"
#include "partition/series_parallel_dp/graphpipe_dp.h"

namespace graphpipe::partition {

// The portfolio's rule, written once: the index of the candidate that fits in memory (of least
// overflow when none does) with the least predicted step (predicted_faster, evaluate.h: a step
// shorter beyond rounding, then the lower slowest stage); on a full tie the earliest. Candidates
// must be non-empty assignments; the list must not be empty.
std::size_t portfolio_winner(const Problem& problem, const std::vector<CandidatePlan>& candidates);

class GraphpipePortfolio final : public Partitioner {
 public:
  static constexpr std::string_view kName = "graphpipe";

  // Decomposes the graph into its series-parallel tree; on a graph that is not series-parallel,
  // logs why (the fallback's METIS start is made when a size first asks: metis_start).
  void prepare(const PartitionRequest& request) override;
  // The METIS starts, the only state kept between sizes, are made under a lock.
  bool plans_sizes_at_once() const override { return true; }
  // candidates()[portfolio_winner(...)]
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;

  // Every candidate the portfolio weighs at this micro-batch size, labelled, in the order above
  // (the fallback's list when the graph is not series-parallel or no DP layout fits).
  // prepare() must have run.
  std::vector<CandidatePlan> candidates(const PartitionRequest& request, const Problem& problem) override;

 private:
  // The plain chains for each cap on the stages in its place (three orders, each chain followed
  // by its refinement), cut on their own thread from one table per order; deferred, never cut,
  // where the graph is not series-parallel (no layouts ask then).
  using Chains = std::shared_future<std::vector<std::vector<CandidatePlan>>>;
  Chains chains_beside(const PartitionRequest& request, const Problem& problem, std::vector<int> caps) const;
  // The layouts of one search budget (problem.device_budget), before replica allocation: the
  // tree DP's plans, the plain chains of chains[cap] and the downset plans.
  std::vector<CandidatePlan> layouts(const PartitionRequest& request, const Problem& problem, const Chains& chains,
                                     std::size_t cap, std::vector<ReplicatedAssignment> dp);
  std::vector<CandidatePlan> fallback_layouts(const PartitionRequest& request, const Problem& problem);
  // METIS's start for the fallback at problem.device_budget (the stage count without
  // replication): made once, at the middle candidate micro-batch size, when a size first asks.
  std::vector<int> metis_start(const PartitionRequest& request, const Problem& problem);

  std::optional<graph::SPDecomposition> sp_;
  std::map<int, std::vector<int>> metis_by_budget_;  // metis_start's, by device budget
  // Guards metis_by_budget_: candidates() runs the budgets on threads, and partition() the
  // micro-batch sizes.
  std::mutex metis_mutex_;
};

}  // namespace graphpipe::partition
