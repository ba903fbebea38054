#include "cost/all_reduce.h"

#include <algorithm>
#include <map>
#include <set>

#include "common/error.h"

namespace graphpipe::cost {

namespace {

void check_group(const Devices& devices, const std::vector<int>& group) {
  std::set<int> seen;
  for (int d : group) {
    if (d < 0 || d >= devices.count) {
      throw PlanningError("all-reduce group names device " + std::to_string(d) + ", but the description has " +
                          std::to_string(devices.count) + " devices");
    }
    if (!seen.insert(d).second) {
      throw PlanningError("all-reduce group names device " + std::to_string(d) + " twice");
    }
  }
}

// Ring order: by node, then device, so that a node's devices are neighbours and the ring
// crosses each node boundary once.
std::vector<int> ring_order(const Devices& devices, std::vector<int> group) {
  std::sort(group.begin(), group.end(), [&](int a, int b) {
    return std::make_pair(devices.node_of(a), a) < std::make_pair(devices.node_of(b), b);
  });
  return group;
}

// The slowest link of one ring step moving `chunk` bytes from every member to the next.
double ring_step_seconds(const Devices& devices, const std::vector<int>& ring, double chunk) {
  double slowest = 0.0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    slowest = std::max(slowest, devices.transfer_seconds(ring[i], ring[(i + 1) % ring.size()], chunk));
  }
  return slowest;
}

}  // namespace

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
  int inter_links = 0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    if (devices.node_of(ring[i]) != devices.node_of(ring[(i + 1) % ring.size()])) ++inter_links;
  }
  const double sent = 2.0 * (d - 1.0) * chunk;
  cost.inter_node_bytes_per_device = sent * inter_links / d;
  cost.intra_node_bytes_per_device = sent - cost.inter_node_bytes_per_device;
  return cost;
}

AllReduceCost hierarchical_all_reduce(const Devices& devices, const std::vector<int>& group, double bytes) {
  check_group(devices, group);
  std::map<int, std::vector<int>> by_node;
  for (int d : ring_order(devices, group)) by_node[devices.node_of(d)].push_back(d);
  const std::size_t local = by_node.begin()->second.size();
  bool equal_nodes = std::all_of(by_node.begin(), by_node.end(),
                                 [&](const auto& entry) { return entry.second.size() == local; });
  // With unequal nodes there is no one local share to exchange across nodes; such a group is
  // summed by the ring (what NCCL falls back to as well).
  if (!equal_nodes || group.size() <= 1 || bytes <= 0.0) {
    AllReduceCost cost = ring_all_reduce(devices, group, bytes);
    cost.algorithm = AllReduceAlgorithm::hierarchical;
    return cost;
  }
  const auto L = static_cast<double>(local);
  const auto n = static_cast<double>(by_node.size());
  AllReduceCost cost;
  cost.algorithm = AllReduceAlgorithm::hierarchical;
  // Reduce-scatter and all-gather inside every node: L - 1 steps of bytes / L each.
  double intra = 0.0;
  for (const auto& [node, members] : by_node) {
    intra = std::max(intra, (L - 1.0) * ring_step_seconds(devices, members, bytes / L));
  }
  // Across nodes: ring j joins the j-th device of every node and sums their 1 / L shares.
  double inter = 0.0;
  for (std::size_t j = 0; j < local; ++j) {
    std::vector<int> ring;
    for (const auto& [node, members] : by_node) ring.push_back(members[j]);
    if (ring.size() > 1) inter = std::max(inter, 2.0 * (n - 1.0) * ring_step_seconds(devices, ring, bytes / (L * n)));
  }
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
