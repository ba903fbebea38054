// Piper's partitioning algorithm (Tarnawski et al., "Piper: Multidimensional Planner for DNN Parallelization",
// NeurIPS 2021), the second replicated baseline beside PipeDream's (sequential/pipedream.h).
//
// Piper's two-level DP. The outer level runs over the down-sets (ideals) of the layer graph: a
// stage is the difference J \ I of two down-sets I < J, and the stages form a chain (a linear
// pipeline order), so a plan is a chain of down-sets {} = D_0 < D_1 < ... < D_S = all. Unlike
// PipeDream's contiguous cuts of one topological order, a stage may take the head of one branch
// with the middle of another. For each stage it chooses a number of devices d, and the inner
// level a configuration per layer (tensor-parallel degree, recomputation) by a knapsack under the
// memory limit. The objective is the time per sample, the slowest stage's time.
//
// graphpipe has no tensor parallelism, so the inner level reduces to data parallelism only: a
// stage's configuration is its replica count d (the least d of each shard size, ReplicaTable's
// levels) and, where it fits only so, activation recomputation (recompute.h's rule, the one
// every partitioner and the evaluation share). Stage time and sync are the cost layer's
// (replica_stage_time: compute at the replica's shard, its share of the crossing tensors, the
// stage's sync estimate amortised over the micro-batches), as in PipeDream's partitioner.
//
//   T(I, m) = least slowest stage of a chain covering all but the down-set I with at most m
//             devices
//           = min( T(I, m - 1),
//                  min over J > I and levels with r <= m replicas of
//                      max(stage(J \ I, r, in-flight), T(J, m - r)) )
// A stage holds its in-flight micro-batches' activations under 1F1B. Piper tracks the exact
// number of later stages as a DP dimension; here, as in pipedream.h, it is bounded by the devices
// left for the later stages (each takes one at least) and by M: never below the exact count, so
// a stage judged to fit does fit (the evaluation re-checks every plan), at the price of turning
// down some deep plans under a tight limit. Layers: layer_graph.h (operator chains cut into
// pieces, as fine as the down-set budget allows; too wide a graph is a PlanningError naming the
// limit).
//
// Every distinct chain T({}, m) for m = 1..budget is returned with its replica counts; the
// partitioner keeps the one with the least predicted step (evaluate.h), as for PipeDream's.
// Plans run as chains (Plan::chain: 1F1B by chain position, skip tensors relayed and charged by
// the evaluation, as for every chain baseline).
// Which paper-size models it handles (V100s, 8 per node, batch 256, default budget of 2048
// down-sets): MMT, DLRM and CANDLE-Uno all plan, but only on coarse layer graphs: MMT's four
// branches of 8 Transformer layers as about 5 pieces each, CANDLE-Uno's branches whole, and
// DLRM (7 dense and 7 embedding branches side by side: 2^14 down-sets at any finer grouping)
// only with its top-level modules as layers, the dense towers together as one. Wider graphs
// are refused (layer_graph.h).
// Cost O(P x levels x budget) for P nested down-set pairs, plus O(P x unit edges) for their
// figures.
#pragma once

#include <vector>

#include "partition/piper/layer_graph.h"
#include "partition/problem.h"
#include "partition/sequential/pipedream.h"

namespace graphpipe::partition {

// Needs problem.replicated(); `layers` from build_layer_graph on a problem of the same graph.
// Empty when no chain fits in memory.
std::vector<ChainPlan> piper_plans(const Problem& problem, const piper::LayerGraph& layers);

}  // namespace graphpipe::partition
