#include "partition/downset/downset.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "partition/recompute.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using Set = std::uint64_t;  // bit v: operator v (graphs of at most 64 operators)

Set bit(int v) { return Set{1} << v; }
int lowest(Set s) { return __builtin_ctzll(s); }

// The down-sets in breadth-first order from the empty set: each is one operator more than one
// before it, so sizes never decrease along the list and a strict superset always comes later.
// Empty when there are more than `budget`.
std::vector<Set> enumerate_downsets(const std::vector<Set>& preds, int budget) {
  const int n = static_cast<int>(preds.size());
  std::vector<Set> sets{0};
  std::unordered_map<Set, int> seen{{0, 0}};
  for (std::size_t i = 0; i < sets.size(); ++i) {
    const Set from = sets[i];
    for (int v = 0; v < n; ++v) {
      if ((from & bit(v)) || (preds[v] & ~from)) continue;
      const Set to = from | bit(v);
      if (!seen.emplace(to, static_cast<int>(sets.size())).second) continue;
      sets.push_back(to);
      if (static_cast<int>(sets.size()) > budget) return {};
    }
  }
  return sets;
}

// A set of operators as a stage, alone: its time, the two parts of its memory, and what
// activation recomputation runs again and keeps (forward seconds, received bytes; recompute.h).
struct Figures {
  double time = 0.0, static_bytes = 0.0, act_bytes = 0.0, optimizer = 0.0;
  double forward = 0.0, input_bytes = 0.0;
  void add(const Figures& f) {
    time += f.time;
    static_bytes += f.static_bytes;
    act_bytes += f.act_bytes;
    forward += f.forward;
    input_bytes += f.input_bytes;
  }
  void remove(const Figures& f) {
    time -= f.time;
    static_bytes -= f.static_bytes;
    act_bytes -= f.act_bytes;
    forward -= f.forward;
    input_bytes -= f.input_bytes;
  }
  StageMemory memory(int in_flight, double limit) const {
    return stage_memory(static_bytes, act_bytes, input_bytes, in_flight, limit);
  }
  // The stage's time at `in_flight` micro-batches when it fits the limit (recomputed where it
  // fits only so), infinity when it does not.
  double time_if_fits(int in_flight, double limit) const {
    const StageMemory m = memory(in_flight, limit);
    return m.bytes <= limit ? time + m.extra_seconds(forward) : std::numeric_limits<double>::infinity();
  }
};

Figures figures_of(const Problem& p, Set stage) {
  const graph::OpGraph& g = *p.graph;
  Figures f;
  for (Set rest = stage; rest; rest &= rest - 1) {
    const int v = lowest(rest);
    f.time += p.compute[v];
    f.static_bytes += p.static_bytes[v];
    f.act_bytes += p.act_bytes[v];
    f.optimizer += p.optimizer[v];
    f.forward += p.forward[v];
    for (graph::EdgeId e : g.in_edges(v)) {
      if (stage & bit(g.edge(e).src)) continue;
      f.time += p.edge_seconds[e];
      f.act_bytes += p.edge_bytes[e];  // received tensors are stashed for the backward
      f.input_bytes += p.edge_bytes[e];
    }
    for (graph::EdgeId e : g.out_edges(v)) {
      if (!(stage & bit(g.edge(e).dst))) f.time += p.edge_seconds[e];
    }
  }
  return f;
}

// The weakly connected components of the subgraph induced by `layer`.
std::vector<Set> components(Set layer, const std::vector<Set>& neighbours) {
  std::vector<Set> out;
  for (Set left = layer; left;) {
    Set component = left & (~left + 1), frontier = component;
    while (frontier) {
      Set grown = 0;
      for (Set f = frontier; f; f &= f - 1) grown |= neighbours[lowest(f)];
      frontier = grown & layer & ~component;
      component |= frontier;
    }
    out.push_back(component);
    left &= ~component;
  }
  return out;
}

// One layer J \ I of a chain of down-sets: its components are parts[first .. first + count).
struct Layer {
  int from = 0, to = 0;  // indices of I and J
  int first = 0, count = 0;
  bool roomy = false;    // fits on one device at the most micro-batches any stage holds
};

// The components grouped into exactly g stages (group[q]: the stage of component q).
struct Grouping {
  double slowest = kInf;
  std::vector<int> group;
};

// For g = 1..cap, the grouping of the parts into exactly g stages with the least slowest stage,
// every stage fitting at `in_flight` micro-batches (slowest = infinity where none fits).
std::vector<Grouping> group_parts(const Figures* parts, int m, int cap, int in_flight, double limit) {
  cap = std::min(cap, m);
  std::vector<Grouping> best(cap + 1);
  if (cap < 1) return best;
  auto fits = [&](const Figures& f) { return f.memory(in_flight, limit).bytes <= limit; };
  if (m <= kExactComponents) {
    // Every partition of the parts into at most cap labelled-by-first-use groups.
    std::vector<int> group(m, 0);
    std::vector<Figures> stage(cap);
    auto visit = [&](auto& self, int q, int used) -> void {
      if (q == m) {
        double slowest = 0.0;
        for (int s = 0; s < used; ++s) {
          const double time = stage[s].time_if_fits(in_flight, limit);
          if (time == kInf) return;
          slowest = std::max(slowest, time);
        }
        if (slowest < best[used].slowest) best[used] = {slowest, group};
        return;
      }
      for (int s = 0; s <= std::min(used, cap - 1); ++s) {
        group[q] = s;
        stage[s].add(parts[q]);
        self(self, q + 1, std::max(used, s + 1));
        stage[s].remove(parts[q]);
      }
    };
    visit(visit, 0, 0);
    return best;
  }
  // Longest processing time first: each part, slowest first, to the least loaded stage that
  // still fits it.
  std::vector<int> order(m);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return parts[a].time > parts[b].time; });
  for (int g = 1; g <= cap; ++g) {
    std::vector<Figures> stage(g);
    std::vector<bool> used(g, false);
    std::vector<int> group(m, -1);
    bool ok = true;
    for (int q : order) {
      int pick = -1;
      for (int s = 0; s < g; ++s) {
        Figures f = stage[s];
        f.add(parts[q]);
        if (fits(f) && (pick < 0 || stage[s].time < stage[pick].time)) pick = s;
      }
      if (pick < 0) {
        ok = false;
        break;
      }
      group[q] = pick;
      used[pick] = true;
      stage[pick].add(parts[q]);
    }
    if (!ok || std::find(used.begin(), used.end(), false) != used.end()) continue;
    double slowest = 0.0;
    for (const Figures& f : stage) slowest = std::max(slowest, f.time_if_fits(in_flight, limit));
    best[g] = {slowest, group};
  }
  return best;
}

}  // namespace

std::vector<std::vector<int>> downset_plans(const Problem& p, int max_downsets) {
  const graph::OpGraph& g = *p.graph;
  const int n = static_cast<int>(p.num_nodes());
  if (n == 0 || n > 64) return {};
  std::vector<Set> preds(n, 0), neighbours(n, 0);
  for (const graph::Edge& e : g.edges()) {
    preds[e.dst] |= bit(e.src);
    neighbours[e.dst] |= bit(e.src);
    neighbours[e.src] |= bit(e.dst);
  }
  const std::vector<Set> sets = enumerate_downsets(preds, max_downsets);
  if (sets.empty()) return {};
  const int d = static_cast<int>(sets.size());
  const int all = d - 1;  // the whole graph: the only down-set of the largest size
  const int K = std::max(1, std::min(p.max_stages, n));
  if (static_cast<double>(K + 1) * (K + 1) * d > kMaxWork / 10) return {};

  auto in_flight = [&](int r) { return static_cast<int>(std::min<std::int64_t>(r, p.num_micro_batches)); };
  // Whether the layer fits on one device at r layers before the end without recomputation:
  // then so does every stage of its components at every r' <= r, and none is recomputed, so its
  // groupings are the same at every such r.
  auto fits_plain = [&](const Figures& f, int r) {
    const StageMemory m = f.memory(in_flight(r), p.memory_limit);
    return !m.recompute && m.bytes <= p.memory_limit;
  };
  // Components recur in many layers: their figures are computed once.
  std::unordered_map<Set, int> component_index;
  std::vector<Set> component_set;
  std::vector<Figures> component_figures;
  std::vector<int> parts;  // component indices, layer after layer
  std::vector<Layer> layers;
  for (int i = 0; i < d; ++i) {
    for (int j = i + 1; j < d; ++j) {
      if (sets[i] & ~sets[j]) continue;
      Layer layer{i, j, static_cast<int>(parts.size()), 0, false};
      Figures whole;
      bool heavy = false;  // a component whose weights alone overflow fits in no stage
      for (Set component : components(sets[j] & ~sets[i], neighbours)) {
        auto [it, added] = component_index.emplace(component, static_cast<int>(component_set.size()));
        if (added) {
          component_set.push_back(component);
          component_figures.push_back(figures_of(p, component));
        }
        const Figures& f = component_figures[it->second];
        heavy = heavy || f.static_bytes > p.memory_limit;
        whole.add(f);
        parts.push_back(it->second);
        ++layer.count;
      }
      if (heavy) {
        parts.resize(layer.first);
        continue;
      }
      layer.roomy = fits_plain(whole, K);
      layers.push_back(layer);
    }
  }
  if (static_cast<double>(layers.size()) * K * K > kMaxWork) return {};

  std::vector<Figures> scratch;
  auto groupings = [&](const Layer& layer, int r) {
    scratch.clear();
    for (int q = 0; q < layer.count; ++q) scratch.push_back(component_figures[parts[layer.first + q]]);
    return layer.roomy ? group_parts(scratch.data(), layer.count, K, in_flight(K), p.memory_limit)
                       : group_parts(scratch.data(), layer.count, K - (r - 1), in_flight(r), p.memory_limit);
  };
  // The least slowest stage of each stage count of a layer at r layers before the end; a roomy
  // layer's are the same at every r and kept (NaN: not computed yet).
  std::vector<double> roomy_slowest(layers.size() * static_cast<std::size_t>(K + 1),
                                    std::numeric_limits<double>::quiet_NaN());
  std::vector<double> slowest(K + 1);
  auto slowest_of = [&](std::size_t l, int r) -> const double* {
    const Layer& layer = layers[l];
    if (layer.count == 1) {  // most layers: one component, one stage
      slowest.assign(K + 1, kInf);
      const Figures& f = component_figures[parts[layer.first]];
      slowest[1] = f.time_if_fits(in_flight(r), p.memory_limit);
      return slowest.data();
    }
    double* kept = roomy_slowest.data() + l * (K + 1);
    if (layer.roomy && !std::isnan(kept[0])) return kept;
    std::vector<Grouping> g = groupings(layer, r);
    double* out = layer.roomy ? kept : slowest.data();
    for (int s = 0; s <= K; ++s) out[s] = s < static_cast<int>(g.size()) ? g[s].slowest : kInf;
    return out;
  };

  // best[r][c][i], flattened; choice: the layer and its stage count.
  auto at = [&](int r, int c, int i) { return (static_cast<std::size_t>(r) * (K + 1) + c) * d + i; };
  std::vector<double> best(static_cast<std::size_t>(K + 1) * (K + 1) * d, kInf);
  std::vector<int> via(best.size(), -1), stages_of(best.size(), 0);
  for (int c = 0; c <= K; ++c) best[at(0, c, all)] = 0.0;
  // The first layer's stages have no stage upstream, so their optimizer steps run past the
  // pipeline's end (evaluate.h's optimizer tail). Plans that start at the empty down-set are
  // ranked by their predicted step, (M + r - 1) x slowest stage + that tail, not by the slowest
  // stage alone: a slightly slower stage elsewhere may shorten the first layer's optimizer step.
  std::vector<double> step(static_cast<std::size_t>(K + 1) * (K + 1), kInf);
  // For s = 1..most, the largest optimizer step among the layer's stages grouped into s.
  auto first_layer_tails = [&](const Layer& layer, int r, int most) {
    std::vector<double> tails(most + 1, 0.0);
    const std::vector<Grouping> all_groupings = groupings(layer, r);
    for (int s = 1; s <= most && s < static_cast<int>(all_groupings.size()); ++s) {
      if (all_groupings[s].group.empty()) continue;  // no grouping into s stages fits
      std::vector<double> optimizer(s, 0.0);
      for (int q = 0; q < layer.count; ++q) {
        optimizer[all_groupings[s].group[q]] += component_figures[parts[layer.first + q]].optimizer;
      }
      tails[s] = *std::max_element(optimizer.begin(), optimizer.end());
    }
    return tails;
  };
  std::vector<char> reached(d);  // down-sets from which r - 1 layers can finish
  for (int r = 1; r <= K; ++r) {
    for (int i = 0; i < d; ++i) {
      reached[i] = 0;
      for (int c = 0; c <= K && !reached[i]; ++c) reached[i] = best[at(r - 1, c, i)] < kInf;
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const Layer& layer = layers[l];
      if (!reached[layer.to] || (r == 1) != (layer.to == all)) continue;
      const double* least = slowest_of(l, r);
      const int most = std::min(layer.count, K - (r - 1));
      const std::vector<double> tails = layer.from == 0 ? first_layer_tails(layer, r, most) : std::vector<double>{};
      for (int s = 1; s <= most; ++s) {
        if (least[s] == kInf) continue;
        const double layer_slowest = least[s];
        for (int c = s + r - 1; c <= K; ++c) {
          const double rest = best[at(r - 1, c - s, layer.to)];
          if (rest == kInf) continue;
          const double value = std::max(layer_slowest, rest);
          const std::size_t here = at(r, c, layer.from);
          if (layer.from == 0) {
            double& predicted = step[static_cast<std::size_t>(r) * (K + 1) + c];
            const double candidate =
                static_cast<double>(p.num_micro_batches + r - 1) * value + tails[s];
            if (!(candidate < predicted)) continue;
            predicted = candidate;
          } else if (!(value < best[here])) {
            continue;
          }
          best[here] = value;
          via[here] = static_cast<int>(l);
          stages_of[here] = s;
        }
      }
    }
  }

  std::vector<std::vector<int>> plans;
  for (int r = 1; r <= K; ++r) {
    if (step[static_cast<std::size_t>(r) * (K + 1) + K] == kInf) continue;
    std::vector<int> assignment(n, -1);
    int i = 0, c = K, base = 0;
    for (int left = r; left >= 1; --left) {
      const std::size_t here = at(left, c, i);
      const Layer& layer = layers[via[here]];
      const int s = stages_of[here];
      const Grouping grouping = groupings(layer, left)[s];
      for (int q = 0; q < layer.count; ++q) {
        for (Set part = component_set[parts[layer.first + q]]; part; part &= part - 1) {
          assignment[lowest(part)] = base + grouping.group[q];
        }
      }
      base += s;
      c -= s;
      i = layer.to;
    }
    if (std::find(plans.begin(), plans.end(), assignment) == plans.end()) plans.push_back(std::move(assignment));
  }
  return plans;
}

}  // namespace graphpipe::partition
