// The series-parallel DP's recurrences over whole subtrees, series suffixes and parallel
// suffixes (dp_solver.h; the fork and join fragments are in dp_fork_join.cpp). Each returns the
// least depth of its fragment on n devices with d stages after it, and its first move.
#include "partition/series_parallel_dp/dp_solver.h"

namespace graphpipe::partition::series_parallel_dp {

// Subtree t: as one stage, or decomposed into its series or parallel fragment.
Entry Solver::solve(int t, int n, int d) {
  if (n < 1 || too_few(work_[t], n)) return {};
  d = cap(d);
  const std::uint64_t k = fragment(kSolve, t, t, 0, n, d);
  int low, high;
  if (auto known = settled(memo_, k, &Depths::main, low, high)) return *known;
  Entry e;
  const graph::SPNode& node = tree_.nodes[t];
  if (const int r = replicas_to_fit(whole_[t], in_flight(d + 1), n); r > 0) {
    e = {1, WholeStage{r}};
  } else if (node.kind == graph::SPNode::Kind::series) {
    e = {series(t, 0, n, d).depth, Decomposed{}};
  } else if (node.kind == graph::SPNode::Kind::parallel) {
    e = {parallel(t, 0, n, d).depth, Decomposed{}};
  }
  memo_.insert(k, e);
  return e;
}

// Series node t's children i.. : a group of children as one stage, child i decomposed, or a
// fork stage.
Entry Solver::series(int t, int i, int n, int d) {
  const auto& children = tree_.nodes[t].children;
  if (i == static_cast<int>(children.size())) return {0, Nothing{}};
  if (n < 1 || too_few(suffix_work_[t][i], n)) return {};
  const std::uint64_t k = fragment(kSeries, t, t, i, n, d);
  int low, high;
  if (auto known = settled(memo_, k, &Depths::main, low, high)) return *known;
  Entry best;
  if (high < kInf) best.depth = high + 1;  // bound(): nothing deeper than `high` can be best
  const auto& stats = row(t, i, children);
  series_groups(t, i, n, d, stats, low, best);
  if (best.depth > low && !is_leaf(children[i])) series_split(t, i, n, d, best);
  if (best.depth > low) series_forks(t, i, n, d, stats, low, best);
  memo_.insert(k, best);
  return best;
}

// Children i..p as one stage, then p+1.. on the devices it leaves. The scan stops once the best
// reaches `low`, the fragment's least depth (bound()): no later group can be shallower, and a
// group only replaces the best when strictly shallower, so the move is the same.
void Solver::series_groups(int t, int i, int n, int d, const std::vector<Stats>& stats, int low, Entry& best) {
  for (int q = 0; q < static_cast<int>(stats.size()) && best.depth > low; ++q) {
    const Stats& s = stats[q];
    if (too_big(s)) break;
    const int p = i + q;
    if (1 + path_depth(suffix_path_[t][p + 1]) >= best.depth) continue;  // the rest is too long
    auto [rest, r] = stage_then(s, n, d, 0, [&](int x) { return series(t, p + 1, x, d).depth; });
    if (rest < kInf && rest + 1 < best.depth) best = {rest + 1, Group{p, r}};
  }
}

// Child i decomposed: it gets the devices the rest does not need for each depth the rest can
// reach.
void Solver::series_split(int t, int i, int n, int d, Entry& best) {
  const int child_node = tree_.nodes[t].children[i];
  levels(
      least_devices(suffix_work_[t][i + 1]), std::min(n - 2, n - least_devices(work_[child_node])),
      [&](int x) { return series(t, i + 1, x, d).depth; },
      [&](int x, int rest) {
        // Rests come shallowest first: the child's own floor stops the scan for good.
        if (rest >= kInf || rest + std::max(1, path_depth(path_[child_node])) >= best.depth) return false;
        const int child = solve(child_node, n - x, d + rest).depth;
        if (child < kInf && child + rest < best.depth) best = {child + rest, Split{n - x}};
        return true;
      });
}

// Fork: children i..q-1 and the head of one of parallel child q's two largest branches as one
// stage; the rest of q starts after it (inside()).
void Solver::series_forks(int t, int i, int n, int d, const std::vector<Stats>& stats, int low, Entry& best) {
  if (n < 2 || best.depth <= 2) return;  // a fork stage has at least one stage after it
  const auto& children = tree_.nodes[t].children;
  const int m = static_cast<int>(children.size());
  for (int q = i + 1; q < m && q - 1 - i < static_cast<int>(stats.size()) && best.depth > low; ++q) {
    if (too_big(stats[q - 1 - i])) break;
    if (!is_parallel(children[q])) continue;
    // After the fork stage come at least the children after the parallel node.
    if (1 + path_depth(suffix_path_[t][q + 1]) >= best.depth) continue;
    const auto& lead = sorted_[children[q]];
    for (int slot = 0; slot < 2; ++slot) {
      const auto& heads = fork_row(t, i, q, lead[slot]);
      for (int j = 0; j < static_cast<int>(heads.size()) && best.depth > low; ++j) {
        const Stats& s = heads[j];
        if (too_big(s)) break;
        // The branch's rest, then the children after the parallel node.
        if (1 + path_depth(item_path_[lead[slot]][j + 1] + suffix_path_[t][q + 1]) >= best.depth) continue;
        auto [rest, r] = stage_then(s, n, d, 1, [&](int x) { return inside(lead[slot], j + 1, x, d).depth; });
        if (rest < kInf && rest + 1 < best.depth) best = {rest + 1, Fork{q, j + 1, device_byte(slot), device_byte(r)}};
      }
    }
  }
}

// Parallel node t's sorted branches j.. : a run of branches sharing one stage, or branch j on
// its own devices beside the rest.
Entry Solver::parallel(int t, int j, int n, int d) {
  const auto& branches = sorted_[t];
  const int count = static_cast<int>(branches.size());
  if (j == count) return {0, Nothing{}};
  if (n < 1 || too_few(suffix_work_[t][j], n)) return {};
  const std::uint64_t k = fragment(kParallel, t, t, j, n, d);
  int low, high;
  if (auto known = settled(memo_, k, &Depths::main, low, high)) return *known;
  Entry best;
  if (high < kInf) best.depth = high + 1;  // bound(): nothing deeper than `high` can be best
  const auto& stats = row(t, j, branches);
  for (int q = 0; q < static_cast<int>(stats.size()) && best.depth > low; ++q) {
    const Stats& s = stats[q];
    if (too_big(s)) break;
    const int r = replicas_to_fit(s, in_flight(d + 1), n);
    if (r == 0) continue;
    const int rest = parallel(t, j + q + 1, n - r, d).depth;
    const int h = std::max(1, rest);
    if (rest < kInf && h < best.depth) best = {h, Run{j + q, r}};
  }
  if (best.depth > low) {
    auto [h, n1] = balance(
        std::max(2, least_devices(work_[branches[j]])), n - least_devices(suffix_work_[t][j + 1]),
        [&](int x) { return solve(branches[j], x, d).depth; },
        [&](int x) { return parallel(t, j + 1, n - x, d).depth; });
    if (h < best.depth) best = {h, Split{n1}};
  }
  memo_.insert(k, best);
  return best;
}

// Least depth of the branches of `branch`'s parallel node other than `branch` (one of the two
// largest) on n devices.
int Solver::others(int branch, int n, int d) {
  const int par = parent_[branch];
  if (sorted_[par][0] == branch) return parallel(par, 1, n, d).depth;
  if (n < 1 || too_few(others_work(branch), n)) return kInf;
  const std::uint64_t k = fragment(kOthers, par, par, 0, n, d);
  int low, high;
  if (auto known = settled(memo_, k, &Depths::main, low, high)) return known->depth;
  const int spare = sorted_[par].size() == 2 ? 0 : 1;
  auto [h, n1] = balance(
      std::max(1, least_devices(work_[sorted_[par][0]])), std::min(n - spare, n - least_devices(suffix_work_[par][2])),
      [&](int x) { return solve(sorted_[par][0], x, d).depth; },
      [&](int x) { return parallel(par, 2, n - x, d).depth; });
  memo_.insert(k, {h, OthersSplit{n1}});
  return h;
}

}  // namespace graphpipe::partition::series_parallel_dp
