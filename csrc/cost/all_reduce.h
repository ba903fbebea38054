// all_reduce: what summing a buffer over a group of devices costs, by ring or hierarchically.
//
// Data parallelism inside a stage sums every replica's gradients; this module prices that sum
// for the cost model and the simulator. Two algorithms, as NCCL and Gloo run them:
//
//   ring          the group in one ring (ordered by node, then device, so that a node's devices
//                 are neighbours): a reduce-scatter and an all-gather, 2 (d - 1) steps, each
//                 moving bytes / d over every ring link at once; a step lasts as long as its
//                 slowest link (latency + chunk / bandwidth).
//   hierarchical  reduce-scatter inside each node (L - 1 steps of bytes / L on the intra-node
//                 ring), then an all-reduce of each device's 1 / L share across the n nodes (L
//                 rings side by side, one per local index: 2 (n - 1) steps of bytes / (L n)),
//                 then an all-gather inside each node (L - 1 steps again). L is the most devices
//                 the group has on one node; each device is assumed to have its own inter-node
//                 link (a NIC per GPU, as the GPU presets describe), so the L rings do not share.
//
// Both move 2 (d - 1) / d of the buffer per device; the hierarchy moves most of it over the
// fast intra-node links and takes 2 (L - 1) + 2 (n - 1) steps instead of 2 (d - 1), so it wins
// where inter-node links are slower or latency counts. best_all_reduce takes the cheaper (the
// ring on a tie); for a group on one node, or with one device per node, both are the same ring. A group of one device
// costs nothing. Every function is O(d log d) and throws PlanningError for a device outside the description or a
// repeated one.
#pragma once

#include <string>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

enum class AllReduceAlgorithm { ring, hierarchical };

// "ring", "hierarchical"; parse_all_reduce_algorithm is the inverse (PlanningError otherwise).
std::string to_string(AllReduceAlgorithm algorithm);
AllReduceAlgorithm parse_all_reduce_algorithm(const std::string& name);

struct AllReduceCost {
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::ring;
  double seconds = 0.0;
  // Bytes each device sends over intra-node and inter-node links (what a measurement of the
  // traffic can be checked against).
  double intra_node_bytes_per_device = 0.0;
  double inter_node_bytes_per_device = 0.0;
};

AllReduceCost ring_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes);
AllReduceCost hierarchical_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes);
AllReduceCost best_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes);

}  // namespace graphpipe::cost
