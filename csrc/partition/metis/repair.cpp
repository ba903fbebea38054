#include "partition/metis/repair.h"

#include <algorithm>
#include <unordered_map>

namespace graphpipe::partition {

std::vector<int> compact_labels(const Problem& p, const std::vector<int>& labels) {
  std::unordered_map<int, int> renumber;
  std::vector<int> result(labels.size());
  for (graph::NodeId v : p.order) {
    auto [it, inserted] = renumber.try_emplace(labels[v], static_cast<int>(renumber.size()));
    result[v] = it->second;
  }
  return result;
}

std::vector<int> make_acyclic(const Problem& p, const std::vector<int>& parts) {
  std::vector<int> labels = compact_labels(p, parts);
  int k = 0;
  for (int l : labels) k = std::max(k, l + 1);
  std::vector<std::vector<int>> out(k), in(k);
  for (const graph::Edge& e : p.graph->edges()) {
    int a = labels[e.src], b = labels[e.dst];
    if (a != b) {
      out[a].push_back(b);
      in[b].push_back(a);
    }
  }
  // Kosaraju, iterative: finishing order on the graph, then components on the reverse graph.
  std::vector<int> finish;
  std::vector<char> seen(k, 0);
  for (int s = 0; s < k; ++s) {
    if (seen[s]) continue;
    std::vector<std::pair<int, std::size_t>> stack{{s, 0}};
    seen[s] = 1;
    while (!stack.empty()) {
      auto& [v, i] = stack.back();
      if (i < out[v].size()) {
        int w = out[v][i++];
        if (!seen[w]) {
          seen[w] = 1;
          stack.push_back({w, 0});
        }
      } else {
        finish.push_back(v);
        stack.pop_back();
      }
    }
  }
  std::vector<int> component(k, -1);
  int components = 0;
  for (auto it = finish.rbegin(); it != finish.rend(); ++it) {
    if (component[*it] != -1) continue;
    std::vector<int> stack{*it};
    component[*it] = components;
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      for (int w : in[v]) {
        if (component[w] == -1) {
          component[w] = components;
          stack.push_back(w);
        }
      }
    }
    ++components;
  }
  for (int& l : labels) l = component[l];
  return compact_labels(p, labels);
}

std::vector<int> split_to(const Problem& p, std::vector<int> assignment, int stages) {
  int k = 0;
  for (int l : assignment) k = std::max(k, l + 1);
  while (k < stages) {
    std::vector<double> compute(k, 0.0);
    std::vector<int> size(k, 0);
    for (std::size_t v = 0; v < assignment.size(); ++v) {
      compute[assignment[v]] += p.compute[v];
      ++size[assignment[v]];
    }
    int pick = -1;
    for (int s = 0; s < k; ++s) {
      if (size[s] >= 2 && (pick < 0 || compute[s] > compute[pick])) pick = s;
    }
    if (pick < 0) break;  // every stage is a single operator
    double acc = 0.0;
    int taken = 0;
    for (graph::NodeId v : p.order) {
      if (assignment[v] != pick) continue;
      // Move the suffix: everything after half the compute (at least one operator on each side).
      if (taken >= 1 && (acc >= compute[pick] / 2 || taken == size[pick] - 1)) {
        assignment[v] = k;
      } else {
        acc += p.compute[v];
      }
      ++taken;
    }
    ++k;
  }
  return assignment;
}

}  // namespace graphpipe::partition
