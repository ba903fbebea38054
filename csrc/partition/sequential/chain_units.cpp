#include "partition/sequential/chain_units.h"

#include "partition/group_stats.h"
#include "partition/replicas.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

ChainUnits::ChainUnits(const Problem& p, int max_units)
    : bounds_(chunk_bounds(p, max_units)), units_(static_cast<int>(bounds_.size()) - 1) {
  const ReplicaTable& table = *p.replicas;
  while (usable_ < table.num_levels() && table.replicas(usable_) <= p.device_budget) ++usable_;
  fraction_.resize(usable_);
  for (int l = 0; l < usable_; ++l) fraction_[l] = table.row_fraction(l);
  prefix_sums(p);
  grow_segments(p);
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

void ChainUnits::grow_segments(const Problem& p) {
  seg_.resize(units_);
  first_.assign(units_ + 1, 0);
  std::vector<int> stamps(p.num_nodes(), -1);
  for (int j = 0; j < units_; ++j) {
    GroupStats g(p, stamps, j);
    for (int e = j + 1; e <= units_; ++e) {
      for (int i = bounds_[e - 1]; i < bounds_[e]; ++i) g.add(p.order[i]);
      if (g.static_bytes > p.memory_limit) break;
      seg_[j].push_back({g.transfer, g.cross_bytes, g.params, g.static_bytes, g.act_bytes, g.input_bytes, g.crossings});
    }
    first_[j + 1] = first_[j] + seg_[j].size();
  }
}

}  // namespace graphpipe::partition
