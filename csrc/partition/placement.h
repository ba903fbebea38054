// Placement: which ranks each stage of a plan gets, once the replica counts are chosen
// (docs/design.md, "Replicated stages in the planner").
//
// The partitioners price transfers on the slowest link and a stage's all-reduce as if its
// replicas sat on consecutive ranks of as few nodes as possible (replicas.h), so placement's
// job is to make that true where it can: every stage gets a contiguous block of ranks inside one
// node when its replicas fit in a node, and a stage goes to the node of the stage that feeds it
// the most bytes when that node has room, so heavy stage edges stay on the fast links. Stages
// are placed in their (topological) order, each from the lowest free rank of the chosen node:
//   1. the node of its heaviest already-placed producer, if its replicas fit there;
//   2. else the first node (by lowest rank) where they fit;
//   3. else (more replicas than any node has free) whole free nodes first, then the rest, in
//      rank order: the stage spans nodes and its all-reduce is hierarchical.
// With one device per stage and no node boundary in the way this gives stage s rank s, as plans
// had before replication. O(S x nodes + E + count).
#pragma once

#include <utility>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::partition {

// replicas[s] >= 1 devices for stage s (stages in topological order); edges (src, dst) with the
// bytes they carry per micro-batch. Returns each stage's ranks, ascending. `ranks` > 0 places on
// the description's first `ranks` ranks only (their nodes as the description groups them), so
// that the placement of a plan does not depend on devices it does not use. Throws PlanningError
// when the stages need more devices than there are.
std::vector<std::vector<int>> place_stages(const cost::Devices& devices, const std::vector<int>& replicas,
                                           const std::vector<std::pair<int, int>>& edges,
                                           const std::vector<double>& edge_bytes, int ranks = 0);

// Stage `stage` of a placed plan (`stage_ranks`, each stage's ranks) with `extra` more ranks,
// taken from those no stage holds among the first `ranks` (0: all): first on the nodes the stage
// already occupies, so that its all-reduce stays on the fast links where it can, then in rank
// order. Returns the stage's ranks ascending; empty when too few ranks are free.
// O(count + ranks held).
std::vector<int> grow_stage(const cost::Devices& devices, const std::vector<std::vector<int>>& stage_ranks, int stage,
                            int extra, int ranks = 0);

}  // namespace graphpipe::partition
