#include "partition/placement.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "common/error.h"

namespace graphpipe::partition {

std::vector<std::vector<int>> place_stages(const cost::Devices& devices, const std::vector<int>& replicas,
                                           const std::vector<std::pair<int, int>>& edges,
                                           const std::vector<double>& edge_bytes, int ranks) {
  const int stages = static_cast<int>(replicas.size());
  const long need = std::accumulate(replicas.begin(), replicas.end(), 0L);
  const int count = ranks > 0 ? std::min(ranks, devices.count) : devices.count;
  if (need > count) {
    throw PlanningError("the stages need " + std::to_string(need) + " devices in all, the description has " +
                        std::to_string(count) + (count < devices.count ? " (placed on its first ranks)" : ""));
  }
  // Nodes in order of their lowest rank, each with its ranks ascending and a cursor to the first
  // free one (ranks are taken from the front, so a stage's block inside a node is contiguous).
  std::map<int, std::vector<int>> by_node;
  for (int d = 0; d < count; ++d) by_node[devices.node_of(d)].push_back(d);
  std::vector<std::vector<int>> nodes;
  nodes.reserve(by_node.size());
  for (auto& [id, ranks] : by_node) nodes.push_back(std::move(ranks));
  std::sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  std::vector<std::size_t> used(nodes.size(), 0);
  std::vector<int> node_of_stage(stages, -1);
  auto free_in = [&](std::size_t n) { return nodes[n].size() - used[n]; };

  std::vector<std::vector<int>> result(stages);
  for (int s = 0; s < stages; ++s) {
    const auto r = static_cast<std::size_t>(replicas[s]);
    if (replicas[s] < 1)
      throw PlanningError("stage " + std::to_string(s) + " has " + std::to_string(replicas[s]) + " replicas");
    // The heaviest producer already placed.
    int producer = -1;
    double heaviest = -1.0;
    for (std::size_t e = 0; e < edges.size(); ++e) {
      if (edges[e].second == s && node_of_stage[edges[e].first] >= 0 && edge_bytes[e] > heaviest) {
        heaviest = edge_bytes[e];
        producer = edges[e].first;
      }
    }
    int chosen = -1;
    if (producer >= 0 && free_in(node_of_stage[producer]) >= r) chosen = node_of_stage[producer];
    for (std::size_t n = 0; chosen < 0 && n < nodes.size(); ++n) {
      if (free_in(n) >= r) chosen = static_cast<int>(n);
    }
    if (chosen >= 0) {
      for (std::size_t i = 0; i < r; ++i) result[s].push_back(nodes[chosen][used[chosen]++]);
      node_of_stage[s] = chosen;
      continue;
    }
    // Spans nodes: whole free nodes first (their links are all the stage's own), then the rest.
    std::size_t left = r;
    for (int pass = 0; pass < 2 && left; ++pass) {
      for (std::size_t n = 0; n < nodes.size() && left; ++n) {
        if (pass == 0 && used[n] != 0) continue;
        while (left && used[n] < nodes[n].size()) {
          result[s].push_back(nodes[n][used[n]++]);
          --left;
        }
        if (node_of_stage[s] < 0) node_of_stage[s] = static_cast<int>(n);
      }
    }
    std::sort(result[s].begin(), result[s].end());
  }
  return result;
}

std::vector<int> grow_stage(const cost::Devices& devices, const std::vector<std::vector<int>>& stage_ranks, int stage,
                            int extra, int ranks) {
  const int count = ranks > 0 ? std::min(ranks, devices.count) : devices.count;
  std::vector<char> held(count, 0), own_node;
  for (const auto& list : stage_ranks) {
    for (int d : list) {
      if (d < count) held[d] = 1;
    }
  }
  std::vector<int> grown = stage_ranks.at(stage);
  for (int d : grown) {
    const auto node = static_cast<std::size_t>(devices.node_of(d));
    if (own_node.size() <= node) own_node.resize(node + 1, 0);
    own_node[node] = 1;
  }
  auto on_own_node = [&](int d) {
    const auto node = static_cast<std::size_t>(devices.node_of(d));
    return node < own_node.size() && own_node[node] != 0;
  };
  for (int pass = 0; pass < 2 && extra > 0; ++pass) {
    for (int d = 0; d < count && extra > 0; ++d) {
      if (held[d] || (pass == 0 && !on_own_node(d))) continue;
      held[d] = 1;
      grown.push_back(d);
      --extra;
    }
  }
  if (extra > 0) return {};
  std::sort(grown.begin(), grown.end());
  return grown;
}

}  // namespace graphpipe::partition
