// The graphpipe partitioner (Jeon et al., ASPLOS 2025, §2 of DESIGN.md): binary search on the
// target stage time, and for each target a dynamic program over the series-parallel
// decomposition tree x device count that says whether every stage can meet the target within
// the memory limit, and with which least pipeline depth.
//
// State (memoised per target): a fragment of the tree (a whole subtree; a suffix of a series
// node's children; a suffix of a parallel node's branches), the devices it may use, and d, the
// depth of the stages after it (its stages hold min(internal depth + d, M) micro-batches in
// flight under 1F1B). Value: the least internal depth that meets the target, or infeasible.
//   - base: the fragment as one stage on one device;
//   - series suffix i..m: children i..p as one stage, then i+1.. recursively; or child i
//     decomposed on n1 devices with the rest on n - n1 (every split n1 + n2 = n is tried), the
//     rest's depth added to child i's d;
//   - parallel: branches (sorted by compute, largest first) each get their own devices and
//     stages (depth = the deepest branch), or a run of consecutive branches shares one stage.
// The least depth of the rest is always the best choice for what precedes it (a smaller d only
// relaxes memory), so the recursion is exact for this family of partitions: stages that are
// unions of consecutive series children, whole subtrees, or runs of parallel branches.
// The search stops when hi / lo <= 1 + tolerance; the plan is the one for hi.
//
// Graphs that are not series-parallel have no tree; the caller falls back to METIS (documented
// in partitioner.h). Cost per target: O(states x (L + n)) with L the children a stage can hold
// within the target; states are tree positions x devices x the d values actually reached.
#pragma once

#include <optional>
#include <vector>

#include "graph/series_parallel.h"
#include "partition/problem.h"

namespace graphpipe::partition {

// The assignment of the best plan found, or nullopt when no stage layout of this family fits in
// memory at this micro-batch size. At most min(max_stages, 255) devices are used.
std::optional<std::vector<int>> graphpipe_assignment(const Problem& problem,
                                                     const graph::SPTree& tree, double tolerance);

}  // namespace graphpipe::partition
