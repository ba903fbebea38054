// Random operator graphs and independent plan checks for the partition tests.
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "graph/op_graph.h"
#include "partition/evaluate.h"
#include "partition/problem.h"
#include "plan/plan.h"

namespace graphpipe::testing {

inline graph::Node random_node(std::mt19937& rng, int index) {
  std::uniform_real_distribution<double> flops(0.5e9, 8e9), out(1e3, 2e5);
  std::uniform_int_distribution<int> params(0, 4);
  graph::Node n;
  n.name = "n" + std::to_string(index);
  n.op = "call_module";
  n.target = "Op";
  n.module = "m" + std::to_string(index);
  n.forward_flops = flops(rng);
  n.param_bytes = static_cast<std::int64_t>(params(rng)) * 1000000;
  n.output_bytes = out(rng);
  return n;
}

// A two-terminal series-parallel DAG of n >= 2 operators: start from source -> sink and
// repeatedly either subdivide an edge (series) or add a new path next to it (parallel).
inline graph::OpGraph random_sp_graph(unsigned seed, int n) {
  std::mt19937 rng(seed);
  std::vector<std::pair<int, int>> edges{{0, 1}};
  int count = 2;
  while (count < n) {
    std::uniform_int_distribution<std::size_t> pick(0, edges.size() - 1);
    std::size_t i = pick(rng);
    auto [u, v] = edges[i];
    int w = count++;
    if (rng() % 2) {
      edges[i] = {u, w};
    }
    edges.push_back({u, w});
    edges.push_back({w, v});
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  }
  // Relabel so that ids follow a topological order (by longest distance from the source).
  std::vector<int> level(count, 0);
  for (int round = 0; round < count; ++round)
    for (auto [u, v] : edges) level[v] = std::max(level[v], level[u] + 1);
  std::vector<int> ids(count);
  for (int i = 0; i < count; ++i) ids[i] = i;
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return level[a] < level[b]; });
  std::vector<int> rename(count);
  for (int i = 0; i < count; ++i) rename[ids[i]] = i;
  graph::OpGraph g;
  for (int i = 0; i < count; ++i) g.add_node(random_node(rng, i));
  std::uniform_real_distribution<double> bytes(1e3, 2e5);
  std::sort(edges.begin(), edges.end(), [&](auto a, auto b) {
    return std::pair(rename[a.first], rename[a.second]) < std::pair(rename[b.first], rename[b.second]);
  });
  for (auto [u, v] : edges) g.add_edge(rename[u], rename[v], bytes(rng));
  g.trace_batch_size = 16;
  return g;
}

// A random DAG (not series-parallel in general): node j > 0 gets 1-3 predecessors among
// earlier nodes.
inline graph::OpGraph random_dag(unsigned seed, int n) {
  std::mt19937 rng(seed);
  graph::OpGraph g;
  for (int i = 0; i < n; ++i) g.add_node(random_node(rng, i));
  std::uniform_real_distribution<double> bytes(1e3, 2e5);
  for (int j = 1; j < n; ++j) {
    int preds = 1 + static_cast<int>(rng() % 3);
    std::vector<int> chosen;
    for (int k = 0; k < preds; ++k) {
      int lo = std::max(0, j - 6);
      int u = lo + static_cast<int>(rng() % (j - lo));
      if (std::find(chosen.begin(), chosen.end(), u) == chosen.end()) chosen.push_back(u);
    }
    std::sort(chosen.begin(), chosen.end());
    for (int u : chosen) g.add_edge(u, j, bytes(rng));
  }
  g.trace_batch_size = 16;
  return g;
}

// A chain of n random operators.
inline graph::OpGraph random_chain(unsigned seed, int n) {
  std::mt19937 rng(seed);
  graph::OpGraph g;
  for (int i = 0; i < n; ++i) {
    g.add_node(random_node(rng, i));
    if (i) g.add_edge(i - 1, i, 1e4);
  }
  g.trace_batch_size = 8;
  return g;
}

// A random graph of one of three kinds: 0 a series-parallel graph, 1 a DAG, else a chain.
inline graph::OpGraph random_graph_of_kind(unsigned kind, unsigned seed, int n) {
  switch (kind) {
    case 0:
      return random_sp_graph(seed, n);
    case 1:
      return random_dag(seed, n);
    default:
      return random_chain(seed, n);
  }
}

// The planner tests' graphs: a random chain (odd seeds) or series-parallel graph of 24
// operators, 8 samples a batch.
inline graph::OpGraph planner_test_graph(unsigned seed) {
  graph::OpGraph g = seed % 2 ? random_chain(seed, 24) : random_sp_graph(seed, 24);
  g.trace_batch_size = 8;
  return g;
}

// Exhaustive search: calls visit(evaluation) for every partition of the operators into at most
// k stages (restricted growth strings along the topological order, so each partition once)
// whose stage graph is acyclic and which fits in memory.
template <class Visit>
void for_each_valid_partition(const partition::Problem& p, int k, Visit visit) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<int> labels(n, 0);  // by topological position
  std::vector<int> assignment(n, 0);
  auto walk = [&](auto& self, int i, int used) -> void {
    if (i == n) {
      for (int j = 0; j < n; ++j) assignment[p.order[j]] = labels[j];
      partition::Evaluation ev = partition::evaluate(p, assignment);
      if (ev.acyclic && ev.fits()) visit(ev);
      return;
    }
    for (int l = 0; l <= std::min(used, k - 1); ++l) {
      labels[i] = l;
      self(self, i + 1, std::max(used, l + 1));
    }
  };
  walk(walk, 0, 0);
}

// Exhaustive search with replicas: calls visit(assignment, replicas) for every partition of the
// operators into at most k stages whose stage graph is acyclic, with every replica vector of at
// most `devices` devices in all (each count at most the ReplicaTable's max_replicas; all ones on
// a problem without replicas).
template <class Visit>
void for_each_replicated_layout(const partition::Problem& p, int k, int devices, Visit visit) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<int> labels(n, 0), assignment(n, 0);
  auto walk = [&](auto& self, int i, int used) -> void {
    if (i == n) {
      for (int j = 0; j < n; ++j) assignment[p.order[j]] = labels[j];
      if (!partition::evaluate(p, assignment).acyclic) return;
      std::vector<int> replicas(used, 1);
      auto count = [&](auto& again, int s, int left) -> void {
        if (s == used) {
          visit(assignment, replicas);
          return;
        }
        const int most = p.replicated() ? std::min(left - (used - s - 1), p.replicas->max_replicas()) : 1;
        for (int r = 1; r <= most; ++r) {
          replicas[s] = r;
          again(again, s + 1, left - r);
        }
      };
      count(count, 0, devices);
      return;
    }
    for (int l = 0; l <= std::min(used, k - 1); ++l) {
      labels[i] = l;
      self(self, i + 1, std::max(used, l + 1));
    }
  };
  walk(walk, 0, 0);
}

// Independent checks of a plan (not using validate_plan): "" when all hold, else the problem.
inline std::string check_plan(const plan::Plan& plan, const graph::OpGraph& g, int devices) {
  const int n = static_cast<int>(g.num_nodes());
  std::vector<int> stage_of(n, -1);
  for (const auto& st : plan.stages) {
    for (auto v : st.nodes) {
      if (stage_of[v] != -1) return "operator in two stages";
      stage_of[v] = st.id;
    }
  }
  for (int v = 0; v < n; ++v)
    if (stage_of[v] == -1) return "operator " + std::to_string(v) + " in no stage";
  if (static_cast<int>(plan.stages.size()) > devices) return "more stages than devices";
  // convexity: nothing reachable by leaving a stage leads back into it
  for (const auto& st : plan.stages) {
    std::vector<char> seen(n, 0);
    std::vector<int> todo;
    for (auto v : st.nodes)
      for (auto w : g.successors(v))
        if (stage_of[w] != st.id && !seen[w]) seen[w] = 1, todo.push_back(w);
    while (!todo.empty()) {
      int v = todo.back();
      todo.pop_back();
      if (stage_of[v] == st.id) return "stage " + std::to_string(st.id) + " is not convex";
      for (auto w : g.successors(v))
        if (!seen[w]) seen[w] = 1, todo.push_back(w);
    }
  }
  // stage graph acyclic: every crossing edge goes forward in the (topological) stage order
  for (const auto& e : g.edges())
    if (stage_of[e.src] > stage_of[e.dst]) return "stage graph edge goes backwards";
  return "";
}

}  // namespace graphpipe::testing
