// Piper's input: a layer graph and its down-sets (partition/piper/piper.h).
//
// Piper (Tarnawski et al., NeurIPS 2021) plans over a DAG of layers, and its DP enumerates the
// down-sets (ideals) of that DAG, whose number grows exponentially with the graph's width. A
// traced operator graph is far finer than a layer graph (the paper-size MMT has 651 operators,
// DLRM 101, CANDLE-Uno 72, each with hundreds of thousands of down-sets), so the operators are
// grouped into units first, the layers Piper sees:
//   - operators are grouped by their owning module's path cut to a depth (depth 0: each operator
//     alone; an operator of the root module is always alone), as a model's modules are its
//     layers; a depth whose groups would feed each other in a cycle is skipped; a model input,
//     and an operator without arithmetic or parameters that feeds one operator (an indexing, a
//     view), joins the group of its first consumer: they are no layers;
//   - maximal chains of the group DAG (a -> b where a's only successor is b and b's only
//     predecessor is a) are found; a branch of a multi-branch model is one chain;
//   - each chain is cut into at most q pieces of about equal compute (contiguous in the chain);
//   - the units are the pieces; the unit graph (operator edges between pieces) is a DAG.
// For each depth (operators first, then the deepest module level up to the top), every q of
// 1..64 whose unit graph has at most 64 units and at most `max_downsets` down-sets (the count only
// grows with q) is tried, and the one whose largest unit has the least compute is kept (no stage
// is faster than its largest unit; ties: more down-sets). Which granularity plans best is not
// known before the DP runs, so the partitioner runs Piper's DP on the layer graph of every depth
// and keeps the best plan. A stage is a difference of two unit down-sets, so a stage never splits
// a unit: the granularity is what keeps the DP within its budget. When no depth fits even with
// whole chains (q = 1), nor the order's chunks below, the graph is too wide for Piper: a
// PlanningError naming the limits.
// One more layer graph joins them: the topological order cut into at most 64 chunks of about
// equal compute (PipeDream's units, sequential.h), halved while its down-sets overflow the
// budget, down to kMinChunks (interleaved branches make chunks independent of each other).
// Every prefix of chunks is a down-set, so Piper's search holds every chain PipeDream's planner
// (sequential/pipedream.h) weighs, as Piper's does at full resolution; its module_depth is -1.
// Building it is O(depths x q x (V + E + D x units)) for D down-sets.
#pragma once

#include <cstdint>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition::piper {

using Set = std::uint64_t;  // bit u: unit u (at most 64 units)

inline constexpr int kMaxUnits = 64;
inline constexpr int kMinChunks = 16;
// The default budget of down-sets: the DP's work grows with the pairs of nested down-sets
// (up to D^2 / 2) times replica levels times devices.
inline constexpr int kDefaultMaxDownsets = 2048;

struct LayerGraph {
  int module_depth = 0;                           // the module path depth operators are grouped by (0: none;
                                                  // -1: chunks of the topological order)
  int pieces_per_chain = 1;                       // q
  int chains = 0;                                 // maximal chains of the operator DAG
  std::vector<int> unit_of;                       // operator -> unit
  std::vector<std::vector<graph::NodeId>> units;  // unit -> its operators, in topological order
  std::vector<Set> preds;                         // unit -> units with an edge into it
  std::vector<Set> downsets;                      // breadth-first from the empty set; the last is all units
};

// One layer graph per module depth that fits the budget (distinct ones), as above, the one with
// the least largest unit first; problem gives the graph and the compute that pieces balance.
// Throws PlanningError when the graph is too wide for `max_downsets` at every depth.
std::vector<LayerGraph> build_layer_graphs(const Problem& problem, int max_downsets = kDefaultMaxDownsets);
// The first of build_layer_graphs.
LayerGraph build_layer_graph(const Problem& problem, int max_downsets = kDefaultMaxDownsets);

}  // namespace graphpipe::partition::piper
