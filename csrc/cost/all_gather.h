// all_gather: what gathering every device's `bytes` onto every device of a group costs.
//
// Top-k sparsification (cost/sync_cost.h) exchanges each replica's selected entries this way: the
// entries of different replicas sit at different indices, so they cannot be summed on the way
// as an all-reduce would; every replica receives all of them and adds them up itself. `bytes` is
// what ONE device contributes (the input each rank hands to all_gather); each device receives
// (d - 1) x bytes.
//
//   ring          the group in one ring (ordered as cost/all_reduce.h orders it): d - 1 steps,
//                 each moving one device's `bytes` over every ring link at once; a step lasts as
//                 long as its slowest link.
//   hierarchical  across nodes first: the devices with the same local index form L rings of n
//                 (one per local index, each device with its own inter-node link as all_reduce.h
//                 assumes), n - 1 steps of `bytes`; then inside every node a ring of L devices
//                 gathers the n x bytes each now holds, L - 1 steps. Inter-node bytes per device:
//                 (n - 1) x bytes (a flat ring sends up to (d - 1) x bytes over the node
//                 boundary links); intra-node: (L - 1) x n x bytes. Groups with unequal nodes use
//                 the ring, as the all-reduce does.
//
// The runtime's top-k gathers with the backend's flat all_gather; the hierarchical form prices
// the same exchange run in two levels (what hierarchical=true asks for), an algorithm the
// runtime does not run for top-k today. Every function is O(d log d) and throws PlanningError
// for a device outside the description or a repeated one; a group of one device costs nothing.
#pragma once

#include <vector>

#include "cost/all_reduce.h"
#include "cost/devices.h"

namespace graphpipe::cost {

// AllReduceCost's fields read the same for a gather: the algorithm, the seconds, and the bytes
// each device sends over intra-node and inter-node links.
AllReduceCost ring_all_gather(const Devices& devices, const std::vector<int>& group, double bytes);
AllReduceCost hierarchical_all_gather(const Devices& devices, const std::vector<int>& group, double bytes);

}  // namespace graphpipe::cost
