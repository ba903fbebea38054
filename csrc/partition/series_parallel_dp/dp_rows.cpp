// The series-parallel DP's stage unions (dp_solver.h): the figures of a group of operators as
// one stage, grown one item at a time along a node's children (a row), cached per target.
#include "partition/group_stats.h"
#include "partition/series_parallel_dp/dp_solver.h"

namespace graphpipe::partition::series_parallel_dp {

Stats Solver::group(const std::vector<graph::NodeId>& nodes) {
  GroupStats g(p_, stamps_, next_stamp_++);
  for (graph::NodeId v : nodes) g.add(v);
  Stats s{g.compute, g.time(), g.static_bytes, g.act_bytes, g.forward, g.input_bytes, g.params, g.cross_bytes, -1};
  if (rep_) {
    level_sums_.assign(2 * static_cast<std::size_t>(num_levels_), 0.0);
    for (graph::NodeId v : nodes) add_levels(v);
    s.levels = store_levels();
  }
  return s;
}

// The replicated problem's per-level compute, then per-level forward, of the group being grown
// (level_sums_, 2 x num_levels_ entries).
void Solver::add_levels(graph::NodeId v) {
  for (int l = 0; l < num_levels_; ++l) level_sums_[l] += rep_->compute(l, v);
  for (int l = 0; l < num_levels_; ++l) level_sums_[num_levels_ + l] += rep_->forward(l, v);
}

std::int64_t Solver::store_levels() {
  const auto at = static_cast<std::int64_t>(arena_.size());
  arena_.insert(arena_.end(), level_sums_.begin(), level_sums_.end());
  return at;
}

// The row under `key` when it was grown for this target or a larger one, or completely.
const Solver::Row* Solver::cached(const Rows& rows, std::uint64_t key) const {
  auto it = rows.find(key);
  if (it == rows.end() || !it->second.computed) return nullptr;
  return it->second.complete || it->second.limit >= target_ ? &it->second : nullptr;
}

// Stats of `fixed` plus items[start..q] for q = start.. while the compute stays within
// kGrowMargin x the target (the entry that crosses it is kept, so callers see where to stop).
// Cached per key; a row grown for a larger target serves every smaller one.
const std::vector<Stats>& Solver::grow(Rows& rows, std::uint64_t key, const std::vector<int>& fixed,
                                       std::size_t fixed_begin, std::size_t fixed_end, const std::vector<int>& items,
                                       std::size_t start) {
  if (const Row* hit = cached(rows, key)) return hit->stats;
  auto& r = rows[key];
  r.stats.clear();
  r.computed = true;
  const double reach = target_ * kGrowMargin;
  r.limit = reach;
  GroupStats g(p_, stamps_, next_stamp_++);
  r.complete = false;
  if (rep_) level_sums_.assign(2 * static_cast<std::size_t>(num_levels_), 0.0);
  // Without replicas a group's compute bounds its time; with them, its smallest shard's.
  auto least = [&] { return rep_ ? level_sums_[num_levels_ - 1] : g.compute; };
  auto add = [&](int item) {
    for (graph::NodeId v : leaves_[item]) {
      g.add(v);
      if (rep_) add_levels(v);
    }
  };
  for (std::size_t f = fixed_begin; f < fixed_end; ++f) {
    add(fixed[f]);
    if (least() > reach || g.static_bytes > p_.memory_limit) return r.stats;
  }
  std::size_t q = start;
  for (; q < items.size(); ++q) {
    add(items[q]);
    r.stats.push_back({g.compute, g.time(), g.static_bytes, g.act_bytes, g.forward, g.input_bytes, g.params,
                       g.cross_bytes, rep_ ? store_levels() : -1});
    if (least() > reach || g.static_bytes > p_.memory_limit) break;
  }
  r.complete = q >= items.size();
  return r.stats;
}

// Unions of children items[start..q] (series children in order, or a parallel node's sorted
// branches). A tree node is either series or parallel, so (node, start) names one row.
const std::vector<Stats>& Solver::row(int t, int start, const std::vector<int>& items) {
  static const std::vector<int> none;
  return grow(rows_, (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint32_t>(start), none, 0, 0, items,
              static_cast<std::size_t>(start));
}

// Series node t's children i..q-1 plus the first 1, 2, ... items of `branch`, one of the two
// largest branches of parallel child q.
const std::vector<Stats>& Solver::fork_row(int t, int i, int q, int branch) {
  std::uint64_t key = (static_cast<std::uint64_t>(branch) << 40) | (static_cast<std::uint64_t>(i) << 20) |
                      static_cast<std::uint64_t>(q);
  return grow(fork_rows_, key, tree_.nodes[t].children, i, q, items_[branch], 0);
}

// Items k.. of `branch` (one of the two largest of its parallel node) plus the series children
// after the parallel node: q+1, q+1..q+2, ...
const std::vector<Stats>& Solver::join_row(int branch, int k) {
  const int par = parent_[branch];
  const int t = parent_[par];
  std::uint64_t key = (static_cast<std::uint64_t>(branch) << 32) | static_cast<std::uint32_t>(k);
  return grow(join_rows_, key, items_[branch], k, items_[branch].size(), tree_.nodes[t].children,
              static_cast<std::size_t>(slot_[par]) + 1);
}

// The rest of `branch` from item k, the whole other one of the two largest branches, and the
// series children after the parallel node: q+1, q+1..q+2, ...
const std::vector<Stats>& Solver::close_row(int branch, int k) {
  const std::uint64_t key = (static_cast<std::uint64_t>(branch) << 32) | static_cast<std::uint32_t>(k);
  if (const Row* r = cached(close_rows_, key)) return r->stats;
  const int par = parent_[branch];
  std::vector<int> fixed(items_[branch].begin() + k, items_[branch].end());
  fixed.push_back(other_lead(branch));
  return grow(close_rows_, key, fixed, 0, fixed.size(), tree_.nodes[parent_[par]].children,
              static_cast<std::size_t>(slot_[par]) + 1);
}

}  // namespace graphpipe::partition::series_parallel_dp
