#include "partition/sequential/chain_units.h"

#include "partition/group_stats.h"
#include "partition/replicas.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

ChainUnits::ChainUnits(const Problem& p, int max_units, bool relays)
    : bounds_(chunk_bounds(p, max_units)), units_(static_cast<int>(bounds_.size()) - 1) {
  const ReplicaTable& table = *p.replicas;
  while (usable_ < table.num_levels() && table.replicas(usable_) <= p.device_budget) ++usable_;
  fraction_.resize(usable_);
  for (int l = 0; l < usable_; ++l) fraction_[l] = table.row_fraction(l);
  prefix_sums(p);
  grow_segments(p, relays);
}

void ChainUnits::prefix_sums(const Problem& p) {
  const ReplicaTable& table = *p.replicas;
  compute_.assign(table.num_levels(), std::vector<double>(units_ + 1, 0.0));
  forward_ = compute_;
  for (int l = 0; l < table.num_levels(); ++l) {
    for (int u = 0; u < units_; ++u) {
      double c = 0.0, f = 0.0;
      for (int i = bounds_[u]; i < bounds_[u + 1]; ++i) {
        const graph::NodeId v = p.order[i];
        c += l == 0 ? p.compute[v] : table.compute(l, v);
        f += l == 0 ? p.forward[v] : table.forward(l, v);
      }
      compute_[l][u + 1] = compute_[l][u] + c;
      forward_[l][u + 1] = forward_[l][u] + f;
    }
  }
}

std::vector<std::vector<ChainUnits::Relay>> ChainUnits::relays(const Problem& p) const {
  // through[j][e]: the edges from a unit before j to a unit at e or later, by (before, at) unit
  // sums: relayed through every segment units[j..e) of a chain.
  std::vector<std::vector<Relay>> through(units_ + 1, std::vector<Relay>(units_ + 1));
  if (!p.chain) return through;
  std::vector<int> unit(p.num_nodes(), 0);
  for (int u = 0; u < units_; ++u)
    for (int i = bounds_[u]; i < bounds_[u + 1]; ++i) unit[p.order[i]] = u;
  // spans[a][b]: edges from unit a to unit b > a.
  std::vector<std::vector<Relay>> spans(units_, std::vector<Relay>(units_));
  for (std::size_t e = 0; e < p.graph->num_edges(); ++e) {
    const graph::Edge& edge = p.graph->edge(static_cast<graph::EdgeId>(e));
    const int a = unit[edge.src], b = unit[edge.dst];
    if (b <= a + 1) continue;  // adjacent units (or one unit): no segment lies in between
    spans[a][b].bytes += p.edge_bytes[e];
    spans[a][b].edges += 1;
  }
  for (int j = 1; j <= units_; ++j) {
    // through[j][e] = through[j - 1][e] + the edges from unit j - 1 to units >= e.
    Relay from{};
    for (int e = units_; e >= 0; --e) {
      if (e < units_) {
        from.bytes += spans[j - 1][e].bytes;
        from.edges += spans[j - 1][e].edges;
      }
      through[j][e] = {through[j - 1][e].bytes + from.bytes, through[j - 1][e].edges + from.edges};
    }
  }
  return through;
}

void ChainUnits::grow_segments(const Problem& p, bool relays) {
  seg_.resize(units_);
  first_.assign(units_ + 1, 0);
  std::vector<int> stamps(p.num_nodes(), -1);
  const std::vector<std::vector<Relay>> through =
      relays ? this->relays(p) : std::vector<std::vector<Relay>>(units_ + 1, std::vector<Relay>(units_ + 1));
  for (int j = 0; j < units_; ++j) {
    GroupStats g(p, stamps, j);
    for (int e = j + 1; e <= units_; ++e) {
      for (int i = bounds_[e - 1]; i < bounds_[e]; ++i) g.add(p.order[i]);
      // A chain relays every tensor that skips the segment: the stage receives it, holds it for
      // the micro-batch (its backward sends the gradient back) and sends it on, two hops, as
      // the evaluation charges (evaluate.h).
      const Relay& r = through[j][e];
      if (g.static_bytes > p.memory_limit) break;
      seg_[j].push_back({g.transfer, g.cross_bytes + 2.0 * r.bytes, g.params, g.static_bytes, g.act_bytes + r.bytes,
                         g.input_bytes + r.bytes, g.crossings + 2 * r.edges});
    }
    first_[j + 1] = first_[j] + seg_[j].size();
  }
}

}  // namespace graphpipe::partition
