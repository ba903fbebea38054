#include "partition/evaluate.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "common/error.h"
#include "cost/gradient_buckets.h"
#include "cost/reshard.h"
#include "partition/backward_halves.h"
#include "partition/placement.h"
#include "partition/recompute.h"

namespace graphpipe::partition {

double Evaluation::iteration_seconds(const Problem& problem) const {
  const double fixed = problem.model->devices().step_overhead_seconds;
  if (problem.zero_bubble) {
    return static_cast<double>(problem.num_micro_batches) * split_bottleneck +
           static_cast<double>(depth - 1) * split_fill + optimizer_tail + fixed;
  }
  return pipeline_step(problem.num_micro_batches, depth, bottleneck) + optimizer_tail + fixed;
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

Evaluation evaluate(const Problem& p, const std::vector<int>& assignment, const std::vector<int>& replicas,
                    const std::vector<std::vector<int>>& devices) {
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
  // Replica counts by renumbered stage.
  if (!replicas.empty() && static_cast<int>(replicas.size()) != k) {
    throw PlanningError("replica counts for " + std::to_string(replicas.size()) + " stages, the assignment has " +
                        std::to_string(k));
  }
  if (!devices.empty() && static_cast<int>(devices.size()) != k) {
    throw PlanningError("device lists for " + std::to_string(devices.size()) + " stages, the assignment has " +
                        std::to_string(k));
  }
  bool replicated = false;
  for (int label = 0; label < k; ++label) {
    const int r = devices.empty() ? (replicas.empty() ? 1 : replicas[label])
                                  : static_cast<int>(devices[label].size());
    if (!devices.empty() && !replicas.empty() && replicas[label] != r) {
      throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(replicas[label]) +
                          " replicas but " + std::to_string(r) + " devices");
    }
    if (r < 1) throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(r) + " replicas");
    if (r > 1 && (!p.replicas || r > p.replicas->max_replicas())) {
      throw PlanningError("stage label " + std::to_string(label) + " has " + std::to_string(r) + " replicas, but " +
                          (p.replicas ? "a micro-batch of " + std::to_string(p.micro_batch_size) +
                                            " rows gives at most " + std::to_string(p.replicas->max_replicas())
                                      : std::string("replication is off (Options::replicate)")));
    }
    ev.stages[renumber[label]].replicas = r;
    replicated = replicated || r > 1;
  }
  std::vector<int> level(k, 0);
  std::vector<double> fraction(k, 1.0);  // rows of a replica's shard / rows of a micro-batch
  if (replicated) {
    for (int s = 0; s < k; ++s) {
      level[s] = p.replicas->level_of(ev.stages[s].replicas);
      fraction[s] = p.replicas->row_fraction(level[s]);
    }
  }
  std::vector<cost::SyncLoad> sync(replicated ? k : 0);
  std::vector<char> input_walks(k, 0);
  for (int v = 0; v < n; ++v) {
    const int stage = ev.stage_of[v];
    StageFigures& s = ev.stages[stage];
    if (replicated) sync[stage] += p.sync_load[v];
    if (s.replicas == 1) {
      s.forward += p.forward[v];
      s.backward += p.backward[v];
    } else {
      s.forward += p.replicas->forward(level[stage], v);
      s.backward += p.replicas->backward(level[stage], v);
    }
    s.static_bytes += p.static_bytes[v];
    s.activation_bytes += p.act_bytes[v] * fraction[stage];
    s.optimizer += p.optimizer[v];
  }
  {
    // I and W of each stage's split backward, from its operators' at the stage's rows.
    std::vector<double> level_input, level_weight;
    if (replicated) {
      level_input.resize(n);
      level_weight.resize(n);
      for (int v = 0; v < n; ++v) {
        const int stage = ev.stage_of[v];
        const bool one = ev.stages[stage].replicas == 1;
        level_input[v] = one ? p.backward_input[v] : p.replicas->backward_input(level[stage], v);
        level_weight[v] = one ? p.backward_weight[v] : p.replicas->backward_weight(level[stage], v);
      }
    }
    const auto halves = backward_halves(g, p.order, ev.stage_of, k, replicated ? level_input : p.backward_input,
                                        replicated ? level_weight : p.backward_weight);
    for (int s = 0; s < k; ++s) {
      ev.stages[s].backward_input = halves[s].input;
      ev.stages[s].backward_weight = halves[s].weight;
      input_walks[s] = halves[s].input_walks;
    }
  }
  std::vector<double> pair_bytes;  // bytes of each entry of stage_edges before deduplication
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    int a = ev.stage_of[edge.src], b = ev.stage_of[edge.dst];
    if (a == b) continue;
    ev.stages[b].activation_bytes += p.edge_bytes[e] * fraction[b];
    ev.stages[b].input_bytes += p.edge_bytes[e] * fraction[b];
    if (p.chain) {
      // A chain relays a skip tensor through every stage in between: each receives and sends it
      // on, and holds it for the micro-batch. The stage graph is the chain itself.
      for (int k = a + 1; k < b; ++k) {
        ev.stages[k].activation_bytes += p.edge_bytes[e] * fraction[k];
        ev.stages[k].input_bytes += p.edge_bytes[e] * fraction[k];
      }
      for (int k = a; k < b; ++k) {
        ev.stage_edges.push_back({k, k + 1});
        pair_bytes.push_back(p.edge_bytes[e]);
      }
    } else {
      ev.stage_edges.push_back({a, b});
      pair_bytes.push_back(p.edge_bytes[e]);
    }
  }
  // Ranks, and the all-reduce of each replicated stage over its own.
  if (!devices.empty()) {
    for (int label = 0; label < k; ++label) {
      std::vector<int> ranks = devices[label];
      std::sort(ranks.begin(), ranks.end());
      ev.stages[renumber[label]].devices = std::move(ranks);
    }
  } else if (!replicated) {
    for (int s = 0; s < k; ++s) ev.stages[s].devices = {s};
  } else {
    // Heavier stage edges first claim a shared node (placement.h): sum the bytes per pair.
    std::vector<std::size_t> index(ev.stage_edges.size());
    for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
    std::sort(index.begin(), index.end(), [&](std::size_t x, std::size_t y) { return ev.stage_edges[x] < ev.stage_edges[y]; });
    std::vector<std::pair<int, int>> pairs;
    std::vector<double> bytes;
    for (std::size_t i : index) {
      if (pairs.empty() || pairs.back() != ev.stage_edges[i]) {
        pairs.push_back(ev.stage_edges[i]);
        bytes.push_back(0.0);
      }
      bytes.back() += pair_bytes[i];
    }
    std::vector<int> counts(k);
    for (int s = 0; s < k; ++s) counts[s] = ev.stages[s].replicas;
    std::vector<std::vector<int>> placed = place_stages(p.model->devices(), counts, pairs, bytes);
    for (int s = 0; s < k; ++s) ev.stages[s].devices = std::move(placed[s]);
  }
  for (int s = 0; s < k; ++s) {
    StageFigures& f = ev.stages[s];
    if (f.replicas > 1) f.all_reduce = stage_sync_seconds(p, f.devices, sync[s]);
  }
  // Every operator edge between stages by the links between the ranks the two stages got
  // (cost/reshard.h, the simulator's rule: re-sharded pairs of replicas at once, the busiest
  // rank's sum), charged at both ends; along a chain, on every hop of its relay. A link that is
  // the description's slowest keeps the problem's own figure (Problem::edge_seconds).
  const cost::Devices& described = p.model->devices();
  const double slow_bandwidth = p.replicas ? p.replicas->link_bandwidth() : described.slowest_link_bandwidth();
  auto on_devices = [&](const std::vector<int>& ranks) {
    for (int r : ranks) {
      if (r < 0 || r >= described.count) return false;
    }
    return true;
  };
  auto hop_seconds = [&](std::size_t e, int x, int y) {
    const auto& from = ev.stages[x].devices;
    const auto& to = ev.stages[y].devices;
    // More stages than devices (a plan build_plan refuses): no ranks to price, the slowest link.
    if (!on_devices(from) || !on_devices(to)) return p.edge_seconds[e];
    if (from.size() == 1 && to.size() == 1 && described.link_bandwidth[from[0]][to[0]] <= slow_bandwidth) {
      return p.edge_seconds[e];
    }
    return cost::reshard_seconds(described, from, to, p.micro_batch_size, p.edge_bytes[e]);
  };
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    const int a = ev.stage_of[edge.src], b = ev.stage_of[edge.dst];
    if (a == b) continue;
    if (p.chain) {
      for (int h = a; h < b; ++h) {
        const double seconds = hop_seconds(e, h, h + 1);
        ev.stages[h].transfer += seconds;
        ev.stages[h + 1].transfer += seconds;
      }
    } else {
      const double seconds = hop_seconds(e, a, b);
      ev.stages[a].transfer += seconds;
      ev.stages[b].transfer += seconds;
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
  std::vector<int> in_flight = p.in_flight(k, order_edges, p.num_micro_batches);
  if (static_cast<int>(in_flight.size()) != k) {
    throw PlanningError("the in-flight rule returned " + std::to_string(in_flight.size()) +
                        " figures for " + std::to_string(k) + " stages");
  }
  for (int s = 0; s < k; ++s) {
    StageFigures& f = ev.stages[s];
    f.in_flight = in_flight[s];
    // Recomputation where the activations do not fit (recompute.h, the rule the DPs share):
    // the forward runs again in the backward, in the half that first uses the activations.
    const StageMemory m = stage_memory(f.static_bytes, f.activation_bytes, f.input_bytes, f.in_flight, p.memory_limit);
    f.memory = m.bytes;
    if (m.recompute) {
      f.recompute = true;
      f.backward += f.forward;
      (input_walks[s] ? f.backward_input : f.backward_weight) += f.forward;
    }
  }
  // Backward work upstream of each stage (stages are numbered topologically, edges by src).
  std::vector<double> upstream(k, 0.0);
  for (const auto& [a, b] : order_edges) upstream[b] = std::max(upstream[b], upstream[a] + ev.stages[a].backward);
  // The runtime sums a replicated stage's gradients in buckets (cost/gradient_buckets.h) that
  // start while its last backward still runs (the backward fills them at an even pace, the
  // simulator's model): with n equal buckets of c = all_reduce / n each, bucket i is ready i / n
  // into that backward B, and the last one ends max over i of (i B / n + (n - i + 1) c) - B after
  // the backward, max(c, all_reduce - B (n - 1) / n) (the expression is linear in i).
  std::vector<double> stage_params(k, 0.0);
  for (int v = 0; v < n; ++v) stage_params[ev.stage_of[v]] += p.param_bytes[v];
  for (int s = 0; s < k; ++s) {
    const StageFigures& f = ev.stages[s];
    double exposed = f.all_reduce;
    if (f.all_reduce > 0.0) {
      const double buckets = std::max(1, cost::bucket_count(stage_params[s]));
      exposed = std::max(f.all_reduce / buckets, f.all_reduce - f.backward * (buckets - 1.0) / buckets);
    }
    ev.optimizer_tail = std::max(ev.optimizer_tail, exposed + f.optimizer - upstream[s]);
  }
  ev.max_overflow = -std::numeric_limits<double>::infinity();
  for (int s = 0; s < k; ++s) ev.stages[s].dispatch = 2.0 * p.model->devices().instruction_overhead_seconds;
  for (int s = 0; s < k; ++s) {
    const StageFigures& f = ev.stages[s];
    if (f.time() > ev.bottleneck) ev.bottleneck = f.time();
    // A split backward dispatches three instructions per micro-batch (F, I, W).
    const double split = f.forward + f.backward_input + f.backward_weight + f.transfer + f.dispatch * 1.5;
    if (split > ev.split_bottleneck) {
      ev.split_bottleneck = split;
      ev.split_fill = std::max(0.0, f.forward + f.transfer + f.backward_input - f.backward_weight);
    }
    double overflow = f.memory - p.memory_limit;
    if (overflow > ev.max_overflow) {
      ev.max_overflow = overflow;
      ev.worst_memory_stage = s;
    }
  }
  return ev;
}

}  // namespace graphpipe::partition
