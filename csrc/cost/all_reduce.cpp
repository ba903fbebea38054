#include "cost/all_reduce.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "cost/rings.h"

namespace graphpipe::cost {

std::string to_string(AllReduceAlgorithm algorithm) {
  return algorithm == AllReduceAlgorithm::ring ? "ring" : "hierarchical";
}

AllReduceAlgorithm parse_all_reduce_algorithm(const std::string& name) {
  if (name == "ring") return AllReduceAlgorithm::ring;
  if (name == "hierarchical") return AllReduceAlgorithm::hierarchical;
  throw PlanningError("unknown all-reduce algorithm '" + name + "': choose ring or hierarchical");
}

AllReduceCost ring_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes) {
  check_group(devices, group);
  AllReduceCost cost;
  cost.algorithm = AllReduceAlgorithm::ring;
  const auto d = static_cast<double>(group.size());
  if (group.size() <= 1 || bytes <= 0.0) return cost;
  const std::vector<int> ring = ring_order(devices, group);
  const double chunk = bytes / d;
  cost.seconds = 2.0 * (d - 1.0) * ring_step_seconds(devices, ring, chunk);
  // Each device sends 2 (d - 1) chunks to its successor; average the two kinds of link over
  // the group.
  const int inter_links = inter_node_links(devices, ring);
  const double sent = 2.0 * (d - 1.0) * chunk;
  cost.inter_node_bytes_per_device = sent * inter_links / d;
  cost.intra_node_bytes_per_device = sent - cost.inter_node_bytes_per_device;
  return cost;
}

AllReduceCost hierarchical_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes) {
  check_group(devices, group);
  const std::map<int, std::vector<int>> nodes = by_node(devices, group);
  // With unequal nodes there is no one local share to exchange across nodes; such a group is
  // summed by the ring (what NCCL falls back to as well).
  if (!equal_nodes(nodes) || group.size() <= 1 || bytes <= 0.0) {
    AllReduceCost cost = ring_all_reduce(devices, group, bytes);
    cost.algorithm = AllReduceAlgorithm::hierarchical;
    return cost;
  }
  const std::size_t local = nodes.begin()->second.size();
  const auto L = static_cast<double>(local);
  const auto n = static_cast<double>(nodes.size());
  AllReduceCost cost;
  cost.algorithm = AllReduceAlgorithm::hierarchical;
  // Reduce-scatter and all-gather inside every node: L - 1 steps of bytes / L each.
  const double intra = slowest_node_rings(devices, nodes, L - 1.0, bytes / L);
  // Across nodes: ring j joins the j-th device of every node and sums their 1 / L shares.
  const double inter = slowest_cross_node_rings(devices, nodes, 2.0 * (n - 1.0), bytes / (L * n));
  cost.seconds = 2.0 * intra + inter;
  cost.intra_node_bytes_per_device = 2.0 * (L - 1.0) * bytes / L;
  cost.inter_node_bytes_per_device = 2.0 * (n - 1.0) * bytes / (L * n);
  return cost;
}

AllReduceCost best_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes) {
  AllReduceCost ring = ring_all_reduce(devices, group, bytes);
  AllReduceCost hierarchical = hierarchical_all_reduce(devices, group, bytes);
  // Equal within rounding counts as a tie, which the ring (one algorithm, not three phases) wins.
  return hierarchical.seconds < ring.seconds * (1.0 - 1e-9) ? hierarchical : ring;
}

}  // namespace graphpipe::cost
