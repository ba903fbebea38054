#include "cost/rings.h"

#include <algorithm>
#include <set>
#include <string>

#include "common/error.h"

namespace graphpipe::cost {

void check_group(const Devices& devices, const std::vector<int>& group) {
  std::set<int> seen;
  for (int d : group) {
    if (d < 0 || d >= devices.count) {
      throw PlanningError("collective group names device " + std::to_string(d) + ", but the description has " +
                          std::to_string(devices.count) + " devices");
    }
    if (!seen.insert(d).second) {
      throw PlanningError("collective group names device " + std::to_string(d) + " twice");
    }
  }
}

std::vector<int> ring_order(const Devices& devices, std::vector<int> group) {
  std::sort(group.begin(), group.end(), [&](int a, int b) {
    return std::make_pair(devices.node_of(a), a) < std::make_pair(devices.node_of(b), b);
  });
  return group;
}

double ring_step_seconds(const Devices& devices, const std::vector<int>& ring, double chunk) {
  if (ring.size() < 2 || chunk <= 0.0) return 0.0;
  // Measured figures of a collective's ring step, where given, price it (cost/devices.h says why).
  if (devices.has_collective_link()) {
    return devices.collective_latency_seconds + chunk / devices.collective_bandwidth_bytes_per_second;
  }
  double slowest = 0.0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    slowest = std::max(slowest, devices.transfer_seconds(ring[i], ring[(i + 1) % ring.size()], chunk));
  }
  return slowest;
}

int inter_node_links(const Devices& devices, const std::vector<int>& ring) {
  int links = 0;
  for (std::size_t i = 0; i < ring.size(); ++i) {
    if (devices.node_of(ring[i]) != devices.node_of(ring[(i + 1) % ring.size()])) ++links;
  }
  return links;
}

std::map<int, std::vector<int>> by_node(const Devices& devices, const std::vector<int>& group) {
  std::map<int, std::vector<int>> nodes;
  for (int d : ring_order(devices, group)) nodes[devices.node_of(d)].push_back(d);
  return nodes;
}

bool equal_nodes(const std::map<int, std::vector<int>>& nodes) {
  if (nodes.empty()) return true;
  const std::size_t local = nodes.begin()->second.size();
  return std::all_of(nodes.begin(), nodes.end(), [&](const auto& entry) { return entry.second.size() == local; });
}

double slowest_cross_node_rings(const Devices& devices, const std::map<int, std::vector<int>>& nodes, double steps,
                                double chunk) {
  if (nodes.size() < 2) return 0.0;
  double slowest = 0.0;
  for (std::size_t j = 0; j < nodes.begin()->second.size(); ++j) {
    std::vector<int> ring;
    ring.reserve(nodes.size());
    for (const auto& [node, members] : nodes) ring.push_back(members[j]);
    slowest = std::max(slowest, steps * ring_step_seconds(devices, ring, chunk));
  }
  return slowest;
}

double slowest_node_rings(const Devices& devices, const std::map<int, std::vector<int>>& nodes, double steps,
                          double chunk) {
  double slowest = 0.0;
  for (const auto& [node, members] : nodes)
    slowest = std::max(slowest, steps * ring_step_seconds(devices, members, chunk));
  return slowest;
}

}  // namespace graphpipe::cost
