// Piper's input: a layer graph and its down-sets (partition/piper/piper.h).
//
// Piper (Tarnawski et al., NeurIPS 2021) plans over a DAG of layers, and its DP enumerates the
// down-sets (ideals) of that DAG, whose number grows exponentially with the graph's width. A
// traced operator graph is far finer than a layer graph (the paper-size MMT has 651 operators,
// DLRM 101, CANDLE-Uno 72, each with hundreds of thousands of down-sets), so the operators are
// grouped into units first, the layers Piper sees:
//   - operators are grouped by their owning module's path cut to a depth (depth 0: each operator
//     alone; an operator of the root module is always alone), as a model's modules are its
//     layers; a depth whose groups would feed each other in a cycle is skipped;
//   - maximal chains of the group DAG (a -> b where a's only successor is b and b's only
//     predecessor is a) are found; a branch of a multi-branch model is one chain;
//   - each chain is cut into at most q pieces of about equal compute (contiguous in the chain);
//   - the units are the pieces; the unit graph (operator edges between pieces) is a DAG.
// For each depth (operators first, then the deepest module level up to the top), q is the largest
// of 1..64 whose unit graph has at most 64 units and at most `max_downsets` down-sets (the count
// only grows with q); of all these, the layer graph whose largest unit has the least compute (no
// stage is faster than its largest unit) is kept, ties to the one with more down-sets. A stage is then a difference of two unit down-sets, so a stage never
// splits a unit: the granularity is what keeps the DP within its budget. When no depth fits
// even with whole chains (q = 1), the graph is too wide for Piper and build_layer_graph throws a
// PlanningError naming the limits.
// Building it is O(depths x q x (V + E + D x units)) for D down-sets.
#pragma once

#include <cstdint>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition::piper {

using Set = std::uint64_t;  // bit u: unit u (at most 64 units)

inline constexpr int kMaxUnits = 64;
// The default budget of down-sets: the DP's work grows with the pairs of nested down-sets
// (up to D^2 / 2) times replica levels times devices.
inline constexpr int kDefaultMaxDownsets = 2048;

struct LayerGraph {
  int module_depth = 0;                     // the module path depth operators are grouped by (0: none)
  int pieces_per_chain = 1;                 // q
  int chains = 0;                           // maximal chains of the operator DAG
  std::vector<int> unit_of;                 // operator -> unit
  std::vector<std::vector<graph::NodeId>> units;  // unit -> its operators, in topological order
  std::vector<Set> preds;                   // unit -> units with an edge into it
  std::vector<Set> downsets;                // breadth-first from the empty set; the last is all units
};

// The down-sets of a DAG of preds.size() <= 64 units, breadth-first from the empty set (each is
// one unit more than one before it, so a strict superset always comes later). Empty when there
// are more than `budget`.
std::vector<Set> enumerate_downsets(const std::vector<Set>& preds, int budget);

// The finest layer graph within the budget, as above; problem gives the graph and the compute
// that pieces balance. Throws PlanningError when the graph is too wide for `max_downsets`.
LayerGraph build_layer_graph(const Problem& problem, int max_downsets = kDefaultMaxDownsets);

}  // namespace graphpipe::partition::piper
