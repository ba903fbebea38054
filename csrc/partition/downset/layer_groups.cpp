#include "partition/downset/layer_groups.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "partition/downset/downset.h"

namespace graphpipe::partition::downset {

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

}  // namespace graphpipe::partition::downset
