#include "partition/piper/layer_graph.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "common/error.h"
#include "partition/downset/layer_groups.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition::piper {

namespace {

std::vector<graph::NodeId> distinct(std::vector<graph::NodeId> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The operators grouped by their owning module's first `depth` path components (depth 0, or an
// operator of the root module: one group per operator): the DAG the chains are found in.
struct Quotient {
  std::vector<std::vector<graph::NodeId>> members;  // in topological order
  std::vector<std::vector<int>> succ, pred;         // distinct
  std::vector<int> order;                           // a topological order of the groups
  std::vector<int> group_of;
};

std::string module_prefix(const std::string& module, int depth) {
  std::size_t at = 0;
  for (int k = 0; k < depth; ++k) {
    at = module.find('.', at);
    if (at == std::string::npos) return module;
    if (k + 1 < depth) ++at;
  }
  return module.substr(0, at);
}

// Empty (no groups) when contracting the module groups would make a cycle.
Quotient quotient(const Problem& p, int depth) {
  const graph::OpGraph& g = *p.graph;
  Quotient q;
  q.group_of.assign(p.num_nodes(), -1);
  std::unordered_map<std::string, int> by_key;
  // A model input, or an operator without arithmetic or parameters that feeds one operator (an
  // indexing or a view), is no layer: it joins the group of its (first) consumer, so that a
  // model's many inputs and their slices do not multiply the down-sets.
  auto joins_consumer = [&](graph::NodeId v) {
    const graph::Node& node = g.node(v);
    if (g.out_edges(v).empty()) return false;
    if (node.is_input) return true;
    return node.forward_flops == 0.0 && node.param_bytes == 0 && distinct(g.successors(v)).size() == 1;
  };
  for (graph::NodeId v : p.order) {
    if (joins_consumer(v)) continue;
    const std::string& module = g.node(v).module;
    int id = -1;
    if (depth > 0 && !module.empty()) {
      auto [it, added] = by_key.emplace(module_prefix(module, depth), static_cast<int>(q.members.size()));
      id = it->second;
      if (added) q.members.emplace_back();
    } else {
      id = static_cast<int>(q.members.size());
      q.members.emplace_back();
    }
    q.group_of[v] = id;
    q.members[id].push_back(v);
  }
  // From the back, so that a consumer that joins its own consumer has its group already.
  for (auto it = p.order.rbegin(); it != p.order.rend(); ++it) {
    const graph::NodeId v = *it;
    if (!joins_consumer(v)) continue;
    graph::NodeId first = -1;
    for (graph::NodeId w : g.successors(v)) {
      if (first < 0 || p.position[w] < p.position[first]) first = w;
    }
    q.group_of[v] = q.group_of[first];
    q.members[q.group_of[v]].push_back(v);
  }
  const std::size_t n = q.members.size();
  q.succ.assign(n, {});
  q.pred.assign(n, {});
  for (const graph::Edge& e : g.edges()) {
    const int a = q.group_of[e.src], b = q.group_of[e.dst];
    if (a != b) q.succ[a].push_back(b), q.pred[b].push_back(a);
  }
  std::vector<int> indegree(n);
  for (std::size_t a = 0; a < n; ++a) {
    for (auto* list : {&q.succ[a], &q.pred[a]}) {
      std::sort(list->begin(), list->end());
      list->erase(std::unique(list->begin(), list->end()), list->end());
    }
    indegree[a] = static_cast<int>(q.pred[a].size());
  }
  for (std::size_t a = 0; a < n; ++a) {
    if (indegree[a] == 0) q.order.push_back(static_cast<int>(a));
  }
  for (std::size_t i = 0; i < q.order.size(); ++i) {
    for (int b : q.succ[q.order[i]]) {
      if (--indegree[b] == 0) q.order.push_back(b);
    }
  }
  if (q.order.size() != n) return {};
  return q;
}

// The maximal chains of the quotient (a -> b where a's only successor is b and b's only
// predecessor is a), each in order.
std::vector<std::vector<int>> maximal_chains(const Quotient& q) {
  const std::size_t n = q.members.size();
  std::vector<int> next(n, -1);
  std::vector<char> continues(n, 0);
  for (std::size_t a = 0; a < n; ++a) {
    if (q.succ[a].size() != 1 || q.pred[q.succ[a][0]].size() != 1) continue;
    next[a] = q.succ[a][0];
    continues[q.succ[a][0]] = 1;
  }
  std::vector<std::vector<int>> chains;
  for (int a : q.order) {
    if (continues[a]) continue;
    std::vector<int> chain;
    for (int b = a; b >= 0; b = next[b]) chain.push_back(b);
    chains.push_back(std::move(chain));
  }
  return chains;
}

// The chain cut into at most q contiguous pieces of about equal compute (by count when it has
// none), as bounds into the chain.
std::vector<int> piece_bounds(const Problem& p, const Quotient& qt, const std::vector<int>& chain, int q) {
  const int n = static_cast<int>(chain.size());
  q = std::min(q, n);
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) {
    prefix[i + 1] = prefix[i];
    for (graph::NodeId v : qt.members[chain[i]]) prefix[i + 1] += p.compute[v];
  }
  const bool by_count = !(prefix[n] > 0.0);
  std::vector<int> bounds{0};
  for (int k = 1; k < q; ++k) {
    int at = by_count
                 ? k * n / q
                 : static_cast<int>(std::lower_bound(prefix.begin(), prefix.end(), prefix[n] * k / q) - prefix.begin());
    at = std::clamp(at, bounds.back() + 1, n - (q - k));
    bounds.push_back(at);
  }
  bounds.push_back(n);
  return bounds;
}

// The layer graph of q pieces per chain, without its down-sets.
LayerGraph units_of(const Problem& p, const Quotient& qt, const std::vector<std::vector<int>>& chains, int q) {
  LayerGraph lg;
  lg.pieces_per_chain = q;
  lg.chains = static_cast<int>(chains.size());
  lg.unit_of.assign(p.num_nodes(), -1);
  for (const auto& chain : chains) {
    const std::vector<int> bounds = piece_bounds(p, qt, chain, q);
    for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
      std::vector<graph::NodeId> unit;
      for (int i = bounds[k]; i < bounds[k + 1]; ++i) {
        unit.insert(unit.end(), qt.members[chain[i]].begin(), qt.members[chain[i]].end());
      }
      std::sort(unit.begin(), unit.end(),
                [&](graph::NodeId a, graph::NodeId b) { return p.position[a] < p.position[b]; });
      for (graph::NodeId v : unit) lg.unit_of[v] = static_cast<int>(lg.units.size());
      lg.units.push_back(std::move(unit));
    }
  }
  if (lg.units.size() > static_cast<std::size_t>(kMaxUnits)) return lg;
  lg.preds.assign(lg.units.size(), 0);
  for (const graph::Edge& e : p.graph->edges()) {
    const int a = lg.unit_of[e.src], b = lg.unit_of[e.dst];
    if (a != b) lg.preds[b] |= Set{1} << a;
  }
  return lg;
}

// The deepest module path of any operator (at most 8 levels are tried).
int module_depth(const graph::OpGraph& g) {
  int most = 0;
  for (const graph::Node& node : g.nodes()) {
    if (node.module.empty()) continue;
    most = std::max(most, 1 + static_cast<int>(std::count(node.module.begin(), node.module.end(), '.')));
  }
  return std::min(most, 8);
}

// The compute of the layer graph's largest unit.
double largest_unit(const Problem& p, const LayerGraph& lg) {
  double most = 0.0;
  for (const auto& unit : lg.units) {
    double sum = 0.0;
    for (graph::NodeId v : unit) sum += p.compute[v];
    most = std::max(most, sum);
  }
  return most;
}

// The topological order cut into at most `units` chunks of about equal compute (chunk_bounds,
// PipeDream's units), each a layer: contiguous chunks of a topological order are convex and
// every prefix of chunks is a down-set, so Piper's search on it holds every chain of PipeDream's.
LayerGraph order_chunks(const Problem& p, int units) {
  LayerGraph lg;
  lg.module_depth = -1;
  const std::vector<int> bounds = chunk_bounds(p, units);
  lg.unit_of.assign(p.num_nodes(), -1);
  for (std::size_t k = 0; k + 1 < bounds.size(); ++k) {
    lg.units.emplace_back(p.order.begin() + bounds[k], p.order.begin() + bounds[k + 1]);
    for (graph::NodeId v : lg.units.back()) lg.unit_of[v] = static_cast<int>(k);
  }
  lg.chains = 1;
  lg.pieces_per_chain = static_cast<int>(lg.units.size());
  lg.preds.assign(lg.units.size(), 0);
  for (const graph::Edge& e : p.graph->edges()) {
    const int a = lg.unit_of[e.src], b = lg.unit_of[e.dst];
    if (a != b) lg.preds[b] |= Set{1} << a;
  }
  return lg;
}

}  // namespace

std::vector<LayerGraph> build_layer_graphs(const Problem& p, int max_downsets) {
  // Operators (depth 0), then module groups from the deepest to the top level; at each, every
  // count of pieces per chain within the limits, of which the one whose largest unit has the
  // least compute is kept (no stage is faster than its largest unit; ties: the most down-sets).
  std::vector<std::pair<double, LayerGraph>> kept;
  bool over_units = true;
  std::vector<int> depths{0};
  for (int depth = module_depth(*p.graph); depth >= 1; --depth) depths.push_back(depth);
  for (int depth : depths) {
    const Quotient qt = quotient(p, depth);
    if (qt.members.empty()) continue;  // the module groups would feed each other in a cycle
    const auto chains = maximal_chains(qt);
    std::size_t longest = 1;
    for (const auto& chain : chains) longest = std::max(longest, chain.size());
    std::pair<double, LayerGraph> best{0.0, {}};
    for (int q = 1; q <= kMaxUnits && static_cast<std::size_t>(q) <= longest; ++q) {
      LayerGraph lg = units_of(p, qt, chains, q);
      lg.module_depth = depth;
      if (lg.units.size() > static_cast<std::size_t>(kMaxUnits)) break;
      over_units = false;
      lg.downsets = downset::enumerate_downsets(lg.preds, max_downsets);
      if (lg.downsets.empty()) break;
      const double coarsest = largest_unit(p, lg);
      if (best.second.downsets.empty() || coarsest < best.first ||
          (coarsest == best.first && lg.downsets.size() > best.second.downsets.size())) {
        best = {coarsest, std::move(lg)};
      }
    }
    if (best.second.downsets.empty()) continue;
    const bool seen =
        std::any_of(kept.begin(), kept.end(), [&](const auto& k) { return k.second.unit_of == best.second.unit_of; });
    if (!seen) kept.push_back(std::move(best));
  }
  // PipeDream's units too: 64 chunks, fewer while their down-sets overflow the budget, but not
  // below kMinChunks (coarser chains say little; a graph that wide is refused below).
  for (int units = kMaxUnits; units >= kMinChunks; units /= 2) {
    LayerGraph lg = order_chunks(p, units);
    lg.downsets = downset::enumerate_downsets(lg.preds, max_downsets);
    if (lg.downsets.empty()) continue;
    const bool seen =
        std::any_of(kept.begin(), kept.end(), [&](const auto& k) { return k.second.unit_of == lg.unit_of; });
    if (!seen) kept.emplace_back(largest_unit(p, lg), std::move(lg));
    break;
  }
  if (kept.empty()) {
    throw PlanningError(
        "piper: the graph is too wide for Piper's down-set DP: even with its operators grouped by "
        "module and each chain of groups as one layer, it has " +
        (over_units ? "more than " + std::to_string(kMaxUnits) + " layers"
                    : "more than " + std::to_string(max_downsets) + " down-sets") +
        " (the limits: " + std::to_string(kMaxUnits) + " layers, " + std::to_string(max_downsets) +
        " down-sets); use the graphpipe or sequential partitioner");
  }
  std::stable_sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.first < b.first || (a.first == b.first && a.second.downsets.size() > b.second.downsets.size());
  });
  std::vector<LayerGraph> out;
  out.reserve(kept.size());
  for (auto& k : kept) out.push_back(std::move(k.second));
  return out;
}

LayerGraph build_layer_graph(const Problem& p, int max_downsets) {
  return std::move(build_layer_graphs(p, max_downsets).front());
}

}  // namespace graphpipe::partition::piper
