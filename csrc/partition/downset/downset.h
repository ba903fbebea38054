// Exact plans for small graphs, by dynamic programming over the lattice of down-sets (as in
// Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph Operators",
// NeurIPS 2020), extended with the pipeline depth.
//
// Why it is exact: in a partition whose stage graph is acyclic, give every stage its level, the
// stages on the longest path from a source stage to it (itself included). The operators of the
// stages of level <= l form a down-set D_l (closed under predecessors: an operator's
// predecessors sit in its own stage or in a stage of lower level), so D_1 < D_2 < ... < D_depth
// is a chain of down-sets. No operator edge joins two stages of one level, so every stage of
// level l is a union of weakly connected components of the layer D_l \ D_{l-1}. Conversely, any
// chain of down-sets with each layer's components grouped into stages is an acyclic partition
// of depth at most the number of layers. Hence
//   best[r][c][I] = least slowest stage of r layers with at most c stages covering all but the
//                   down-set I
//                 = min over down-sets J > I and stage counts c' for the layer J \ I of
//                   max(best grouping of the layer's components into c' stages,
//                       best[r - 1][c - c'][J])
// ranges over every acyclic partition, and for each depth bound r it gives the least slowest
// stage of depth <= r. The caller turns depth and slowest stage into the predicted step,
// (M + depth - 1) x slowest stage + optimizer tail, and so finds the step-optimal plan that the
// series-parallel family (graphpipe_dp.h) and the cuts of a few topological orders
// (sequential.h) can miss: the best stages of a multi-branch graph often interleave branches,
// the head of one with the middle of another.
//
// Within a layer, components have no edges between them, so a stage's time and memory are the
// sums of its components'. The grouping is exact (every partition of the components) for up to
// kExactComponents components, longest-processing-time-first beyond that.
// Memory: a stage r layers before the end has at most r stages on a path to a sink, so under
// 1F1B it holds at most min(r, M) micro-batches; what fits at that count fits in the plan (the
// caller evaluates every plan with the real rule). A stage that fits there only with activation
// recomputation is taken recomputed and timed with its forward once more (recompute.h, the rule
// the evaluation applies; both its need and its time only grow with the count).
// Optimizer tail (evaluate.h): the first layer's stages have nothing upstream, so their
// optimizer steps outlast the pipeline; the last move of each r (the layer from the empty
// down-set) is chosen by (M + r - 1) x slowest stage + the first layer's largest optimizer step.
// Later layers' steps are hidden behind the backward work upstream of them unless they are
// larger than it, which this objective does not see.
//
// Limits: graphs of at most 64 operators with at most `max_downsets` down-sets (enumerated
// breadth-first, stopped at the budget; a chain of n operators has n + 1, k independent
// branches of length b have (b + 1)^k), and at most kMaxWork pair x stage-count steps.
// Cost O(D^2 x (V + E) + D^2 x depth x stages^2) for D down-sets.
// Files: downset.cpp (the enumeration and the DP, class DownsetSearch), layer_groups.h (a
// layer's components, their figures and groupings).
#pragma once

#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

// The default budget: 1024 down-sets is at most half a million layers, some tens of
// milliseconds per micro-batch size.
inline constexpr int kDefaultMaxDownsets = 1024;
inline constexpr int kExactComponents = 7;
inline constexpr double kMaxWork = 1e8;

// For each depth bound r = 1..min(max_stages, operators), the plan of depth <= r that fits in
// memory with the least (M + r - 1) x slowest stage + first-layer optimizer step, as a node ->
// stage label assignment, without repeats; a bound with no fitting plan is skipped.
// Empty when the graph is too large for the budget.
std::vector<std::vector<int>> downset_plans(const Problem& problem, int max_downsets = kDefaultMaxDownsets);

}  // namespace graphpipe::partition
