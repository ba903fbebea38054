// The graphpipe partitioner (Jeon et al., ASPLOS 2025; docs/design.md §4.2): binary search on
// the target stage time, and for each target a dynamic program over the series-parallel
// decomposition tree x device count that says whether every stage can meet the target within
// the memory limit, and with which least pipeline depth.
//
// State (memoised per target): a fragment of the tree, the devices it may use (at most n), and
// d, the depth of the stages after it (its stages hold min(internal depth + d, M) micro-batches
// in flight under 1F1B). Value: the least internal depth that meets the target, or infeasible.
// Fragments and their moves:
//   - subtree: the whole subtree as one stage on one device, or decomposed;
//   - series suffix i..m: children i..p as one stage, then i+1.. recursively; or child i
//     decomposed on n1 devices with the rest on n - n1, the rest's depth added to child i's d;
//   - parallel suffix: branches (sorted by compute, largest first) each get their own devices
//     and stages (depth = the deepest branch), or a run of consecutive branches shares a stage;
//   - fork (series suffix i..m whose child q is a parallel node): children i..q-1 and the first
//     items of one of q's two largest branches as one stage; then ("inside") the rest of that
//     branch and the other branches run beside each other, and the join (child q+1 on) either
//     starts its own stages, or shares one stage with the tail of one of the two largest branches
//     (that branch's earlier stages beside the others), or with the fork branch's rest and the
//     whole other largest branch. Such a join stage holds child q+1 alone or as many of the
//     following children as fit. A branch's items: its children when it is a series node, else
//     the branch itself.
// Forks and joins keep multi-branch models from spending a device on a small operator before or
// after the branches (an input split, a concatenation and head), which the paper's family
// (stages = unions of consecutive series children, whole subtrees, or runs of parallel
// branches) cannot avoid. The least depth of the rest is always the best choice for what
// precedes it (a smaller d only relaxes memory), and depth never grows with the devices a part
// may use, so device splits are searched by bisection; the recursion is exact for this family.
//
// Search: bisection on the target until hi / lo <= 1 + tolerance, after galloping up from the
// lower bound max(largest operator, total compute / devices). The step time is
// (M + depth - 1) x slowest stage, so a shallower plan at a slightly larger target can be
// faster: for each depth below the least target's, the least target reaching it is bisected
// too, but only up to the target where that depth stops paying off (not at all where a larger
// target probed already is too deep for it), with at most max(16, probes of the first search)
// more probes. Every such plan is returned.
//
// Probes reuse each other: depth never grows with the target, so a fragment whose depths at the
// nearest probed targets above and below are equal has that depth at the target in between, and
// is not searched again; otherwise those depths bound its search (it starts from the upper bound
// and stops at a move reaching the lower one). "Nearest" is per fragment: the nearest probe that
// solved it, since a bounded probe solves only the fragments its pinned ones do not cover. Such a probe's memo has no
// moves for the fragments it took from its neighbours: each plan returned is solved once more
// with its own probe's depths pinning every fragment that probe solved, and the rebuild searches
// the fragments on the plan's path for their first moves, which are those the exact search takes
// (the first move reaching the least depth). The plans are those of the search without reuse
// (about 1.6x fewer DP seconds on MMT at paper size, 64 devices, replicated; the rebuild from
// depths instead of an exact solve of each plan took a sixth off the planning time there).
//
// Device floor: a stage's time per micro-batch is at least its operators' compute on one replica,
// and a stage of r replicas spends r devices, so a fragment needs at least (the least device-
// seconds its operators can cost) / target devices. A fragment given fewer is infeasible without
// being searched, and device splits are searched only where each part gets its floor. The
// answers are the same; at low targets, where most splits leave one part too few devices, the
// probes are far cheaper (the first probe of each search, at the lower bound, cost about half of
// the search's time on MMT at paper size, 64 devices, replicated; now it is answered at the root).
//
// Memory-free subtrees: d matters only through memory (a stage's in-flight micro-batches). Where
// a whole subtree's bytes, every tensor its operators receive included, fit with M micro-batches
// in flight, no stage made of its operators can fail memory, whatever d: its fragments are
// solved once, with d taken as 0, instead of once per d. Same answers again.
//
// Memory: a stage that does not fit with its in-flight micro-batches' activations but fits
// with activation recomputation is taken recomputed, its time with the forward once more
// (recompute.h, the rule the evaluation applies), so such layouts are in the family too; that
// test stays monotone in the in-flight count, which the argument above needs. With replicated
// stages the same rule is applied per replica count (need(), dp_stage_fit.cpp: a replica holds
// its shard's activations and runs its shard's forward once more).
//
// Graphs that are not series-parallel have no tree; the caller falls back to METIS (documented
// in graphpipe_portfolio.h). Cost per target: O(states x (L + log n)) with L the children a
// stage can hold within the target; states are tree positions x devices x the d values actually
// reached, the fork and join ones also x fork head lengths.
//
// Implementation: the Solver of dp_solver.h, which lists its files (memo, named steps, rows,
// stage test, recurrences, rebuild).
#pragma once

#include <optional>
#include <vector>

#include "graph/series_parallel.h"
#include "partition/problem.h"

namespace graphpipe::partition {

// The assignment of the least-bottleneck plan found, or nullopt when no stage layout of this
// family fits in memory at this micro-batch size. At most min(max_stages, 255) devices are used.
std::optional<std::vector<int>> graphpipe_assignment(const Problem& problem, const graph::SPTree& tree,
                                                     double tolerance);
// That plan first, then the shallower plans found at larger targets, each strictly shallower
// than the one before; empty when nothing fits.
std::vector<std::vector<int>> graphpipe_assignments(const Problem& problem, const graph::SPTree& tree,
                                                    double tolerance);

// A plan of the DP with the replica count of each stage label (all 1 unless problem.replicated()).
struct ReplicatedAssignment {
  std::vector<int> assignment;
  std::vector<int> replicas;
};
// The search's shortcuts (above), each of which changes no answer, only the time; tests turn
// them off to check that it changes none.
struct SearchShortcuts {
  bool device_floor = true;    // fragments given fewer devices than their floor have no plan
  bool memory_free = true;     // d is dropped where memory cannot bind
  bool pinned_rebuild = true;  // the plans are rebuilt from their probes' depths, not solved again
  bool path_floor = true;      // moves whose path of operators needs as many stages as the best are skipped
};
// graphpipe_assignments with the replica counts.
std::vector<ReplicatedAssignment> graphpipe_plans(const Problem& problem, const graph::SPTree& tree, double tolerance,
                                                  SearchShortcuts shortcuts = {});
// graphpipe_plans on each of `budgets` (devices, 1..problem's budget; past 255 the DP's 255, as
// graphpipe_plans caps them): the plans of the problem
// with that device budget, searched one after the other on one solver, whose probes keep every
// fragment's depth. A fragment's least depth on n devices at a target is the same whatever the
// budget, so each search's probes are bounded by the depths of the searches before it (MMT at
// paper size onto 64 V100s, replicated: see docs/design.md §4.10). The same plans as
// graphpipe_plans(problem at that budget) each.
std::vector<std::vector<ReplicatedAssignment>> graphpipe_ladder_plans(const Problem& problem, const graph::SPTree& tree,
                                                                      double tolerance, const std::vector<int>& budgets,
                                                                      SearchShortcuts shortcuts = {});

}  // namespace graphpipe::partition
