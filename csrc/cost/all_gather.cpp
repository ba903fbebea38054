#include "cost/all_gather.h"

#include <algorithm>
#include <map>

#include "cost/rings.h"

namespace graphpipe::cost {

AllReduceCost ring_all_gather(const Devices& devices, const std::vector<int>& group, double bytes) {
  check_group(devices, group);
  AllReduceCost cost;
  cost.algorithm = AllReduceAlgorithm::ring;
  const auto d = static_cast<double>(group.size());
  if (group.size() <= 1 || bytes <= 0.0) return cost;
  const std::vector<int> ring = ring_order(devices, group);
  cost.seconds = (d - 1.0) * ring_step_seconds(devices, ring, bytes);
  // Each device forwards d - 1 contributions to its successor; averaged over the group's links.
  const double sent = (d - 1.0) * bytes;
  cost.inter_node_bytes_per_device = sent * inter_node_links(devices, ring) / d;
  cost.intra_node_bytes_per_device = sent - cost.inter_node_bytes_per_device;
  return cost;
}

AllReduceCost hierarchical_all_gather(const Devices& devices, const std::vector<int>& group, double bytes) {
  check_group(devices, group);
  const std::map<int, std::vector<int>> nodes = by_node(devices, group);
  if (!equal_nodes(nodes) || group.size() <= 1 || bytes <= 0.0) {
    AllReduceCost cost = ring_all_gather(devices, group, bytes);
    cost.algorithm = AllReduceAlgorithm::hierarchical;
    return cost;
  }
  const std::size_t local = nodes.begin()->second.size();
  const auto L = static_cast<double>(local);
  const auto n = static_cast<double>(nodes.size());
  AllReduceCost cost;
  cost.algorithm = AllReduceAlgorithm::hierarchical;
  // Across nodes first: ring j joins the j-th device of every node; n - 1 steps of `bytes`.
  const double inter = slowest_cross_node_rings(devices, nodes, n - 1.0, bytes);
  // Then inside every node: L - 1 steps of the n x bytes each device holds now.
  const double intra = slowest_node_rings(devices, nodes, L - 1.0, n * bytes);
  cost.seconds = inter + intra;
  cost.inter_node_bytes_per_device = (n - 1.0) * bytes;
  cost.intra_node_bytes_per_device = (L - 1.0) * n * bytes;
  return cost;
}

}  // namespace graphpipe::cost
