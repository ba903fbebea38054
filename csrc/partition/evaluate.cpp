#include "partition/evaluate.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "common/error.h"

namespace graphpipe::partition {

double Evaluation::iteration_seconds(const Problem& problem) const {
  return static_cast<double>(problem.num_micro_batches + depth - 1) * bottleneck + optimizer_tail;
}

bool predicted_faster(double step, double bottleneck, double best_step, double best_bottleneck) {
  return step < best_step * (1.0 - 1e-12) || (step <= best_step * (1.0 + 1e-12) && bottleneck < best_bottleneck);
}

namespace {

// Finds one cycle of the label graph (adjacency lists), for the message of a cyclic result.
std::vector<int> find_label_cycle(const std::vector<std::vector<int>>& out) {
  const int k = static_cast<int>(out.size());
  std::vector<int> state(k, 0), parent(k, -1);
  for (int start = 0; start < k; ++start) {
    if (state[start]) continue;
    std::vector<std::pair<int, std::size_t>> stack{{start, 0}};
    state[start] = 1;
    while (!stack.empty()) {
      auto& [v, i] = stack.back();
      if (i < out[v].size()) {
        int w = out[v][i++];
        if (state[w] == 1) {
          std::vector<int> cycle{w};
          for (int x = v; x != w; x = parent[x]) cycle.push_back(x);
          std::reverse(cycle.begin() + 1, cycle.end());
          return cycle;
        }
        if (state[w] == 0) {
          state[w] = 1;
          parent[w] = v;
          stack.push_back({w, 0});
        }
      } else {
        state[v] = 2;
        stack.pop_back();
      }
    }
  }
  return {};
}

}  // namespace

Evaluation evaluate(const Problem& p, const std::vector<int>& assignment) {
  const graph::OpGraph& g = *p.graph;
  const int n = static_cast<int>(g.num_nodes());
  if (static_cast<int>(assignment.size()) != n) {
    throw PlanningError("assignment has " + std::to_string(assignment.size()) + " entries for " +
                        std::to_string(n) + " operators");
  }
  int k = 0;
  for (int v = 0; v < n; ++v) {
    if (assignment[v] < 0) {
      throw PlanningError("operator " + graph::describe(g, v) + " has no stage (label " +
                          std::to_string(assignment[v]) + ")");
    }
    k = std::max(k, assignment[v] + 1);
  }
  std::vector<int> first(k, std::numeric_limits<int>::max());
  for (int v = 0; v < n; ++v) first[assignment[v]] = std::min(first[assignment[v]], p.position[v]);
  for (int s = 0; s < k; ++s) {
    if (first[s] == std::numeric_limits<int>::max()) {
      throw PlanningError("stage label " + std::to_string(s) + " of " + std::to_string(k) +
                          " has no operator");
    }
  }
  // Stage graph on input labels.
  std::vector<std::vector<int>> out(k);
  std::vector<int> indegree(k, 0);
  {
    std::vector<std::pair<int, int>> pairs;
    for (const graph::Edge& e : g.edges()) {
      int a = assignment[e.src], b = assignment[e.dst];
      if (a != b) pairs.push_back({a, b});
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    for (auto [a, b] : pairs) {
      out[a].push_back(b);
      ++indegree[b];
    }
  }
  Evaluation ev;
  // Kahn's order on labels, ties by first operator position.
  using Item = std::pair<int, int>;  // (first position, label)
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> ready;
  for (int s = 0; s < k; ++s) {
    if (indegree[s] == 0) ready.push({first[s], s});
  }
  std::vector<int> renumber(k, -1);
  int next = 0;
  while (!ready.empty()) {
    int s = ready.top().second;
    ready.pop();
    renumber[s] = next++;
    for (int t : out[s]) {
      if (--indegree[t] == 0) ready.push({first[t], t});
    }
  }
  ev.num_stages = k;
  if (next != k) {
    ev.acyclic = false;
    ev.cycle = find_label_cycle(out);
    return ev;
  }
  ev.acyclic = true;
  ev.stage_of.resize(n);
  for (int v = 0; v < n; ++v) ev.stage_of[v] = renumber[assignment[v]];
  ev.stages.assign(k, StageFigures{});
  for (int v = 0; v < n; ++v) {
    StageFigures& s = ev.stages[ev.stage_of[v]];
    s.forward += p.forward[v];
    s.backward += p.backward[v];
    s.static_bytes += p.static_bytes[v];
    s.activation_bytes += p.act_bytes[v];
    s.optimizer += p.optimizer[v];
  }
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    int a = ev.stage_of[edge.src], b = ev.stage_of[edge.dst];
    if (a == b) continue;
    ev.stages[a].transfer += p.edge_seconds[e];
    ev.stages[b].transfer += p.edge_seconds[e];
    ev.stages[b].activation_bytes += p.edge_bytes[e];
    if (p.chain) {
      // A chain relays a skip tensor through every stage in between: each receives and sends it
      // on, and holds it for the micro-batch. The stage graph is the chain itself.
      for (int k = a + 1; k < b; ++k) {
        ev.stages[k].transfer += 2.0 * p.edge_seconds[e];
        ev.stages[k].activation_bytes += p.edge_bytes[e];
      }
      for (int k = a; k < b; ++k) ev.stage_edges.push_back({k, k + 1});
    } else {
      ev.stage_edges.push_back({a, b});
    }
  }
  std::sort(ev.stage_edges.begin(), ev.stage_edges.end());
  ev.stage_edges.erase(std::unique(ev.stage_edges.begin(), ev.stage_edges.end()), ev.stage_edges.end());
  // A chain also runs stage i before stage i + 1 where no tensor says so.
  cost::StageEdges order_edges = ev.stage_edges;
  if (p.chain) {
    for (int s = 0; s + 1 < k; ++s) order_edges.push_back({s, s + 1});
    std::sort(order_edges.begin(), order_edges.end());
    order_edges.erase(std::unique(order_edges.begin(), order_edges.end()), order_edges.end());
  }
  std::vector<int> longest(k, 1);
  for (int s = k - 1; s >= 0; --s) {
    // order_edges is sorted by src, so scan the edges out of s
    auto it = std::lower_bound(order_edges.begin(), order_edges.end(), std::pair<int, int>{s, -1});
    for (; it != order_edges.end() && it->first == s; ++it) longest[s] = std::max(longest[s], longest[it->second] + 1);
  }
  ev.depth = k ? *std::max_element(longest.begin(), longest.end()) : 0;
  // Backward work upstream of each stage (stages are numbered topologically, edges by src).
  std::vector<double> upstream(k, 0.0);
  for (const auto& [a, b] : order_edges) upstream[b] = std::max(upstream[b], upstream[a] + ev.stages[a].backward);
  for (int s = 0; s < k; ++s) ev.optimizer_tail = std::max(ev.optimizer_tail, ev.stages[s].optimizer - upstream[s]);
  std::vector<int> in_flight = p.in_flight(k, order_edges, p.num_micro_batches);
  if (static_cast<int>(in_flight.size()) != k) {
    throw PlanningError("the in-flight rule returned " + std::to_string(in_flight.size()) +
                        " figures for " + std::to_string(k) + " stages");
  }
  ev.max_overflow = -std::numeric_limits<double>::infinity();
  for (int s = 0; s < k; ++s) {
    StageFigures& f = ev.stages[s];
    f.in_flight = in_flight[s];
    f.memory = cost::CostModel::stage_memory(f.static_bytes, f.activation_bytes, f.in_flight);
    ev.bottleneck = std::max(ev.bottleneck, f.time());
    double overflow = f.memory - p.memory_limit;
    if (overflow > ev.max_overflow) {
      ev.max_overflow = overflow;
      ev.worst_memory_stage = s;
    }
  }
  return ev;
}

}  // namespace graphpipe::partition
