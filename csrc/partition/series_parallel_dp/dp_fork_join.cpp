// The series-parallel DP's fork and join fragments (dp_solver.h, graphpipe_dp.h): what follows
// a fork stage (inside), and a branch whose last stage also holds the join (branch_to_join).
#include "partition/series_parallel_dp/dp_solver.h"

namespace graphpipe::partition::series_parallel_dp {

// After a fork stage that holds the first k items of `branch` (one of the two largest branches
// of its parallel node): the branch's remaining items, the other branches, and the series
// children after the parallel node, on n devices with d stages after the enclosing series node.
// The join (the first series child after the parallel node) either starts its own stages
// (open), or shares a stage with the tail of the same branch (join) or of the other of the two
// largest branches (cross), or with the fork branch's rest and the whole other one (close).
Entry Solver::inside(int branch, int k, int n, int d) {
  if (n < 1 || too_few(inside_work(branch, k), n)) return {};
  const std::uint64_t memo_key = fragment(kInside, parent_[parent_[branch]], branch, k, n, d);
  int low, high;
  if (auto known = settled(memo_, memo_key, &Depths::main, low, high)) return *known;
  const int par = parent_[branch];
  const int q = slot_[par];
  const int m = static_cast<int>(tree_.nodes[parent_[par]].children.size());
  const int length = static_cast<int>(items_[branch].size());
  Entry best;
  if (high < kInf) best.depth = high + 1;  // bound(): nothing deeper than `high` can be best
  inside_open(branch, k, n, d, best);
  if (q + 1 < m && n >= 2) {
    if (k < length && best.depth > low) inside_join(branch, branch, k, n, d, best);
    if (best.depth > low) inside_join(branch, other_lead(branch), k, n, d, best);
  }
  if (q + 1 < m && best.depth > low) inside_close(branch, k, n, d, best);
  memo_.insert(memo_key, best);
  return best;
}

// Open: the series after the parallel node on n_r devices (only the least n_r of each depth it
// reaches can be best: the rest of the devices go to the branches), the fork branch's rest and
// the other branches beside each other before it.
void Solver::inside_open(int branch, int k, int n, int d, Entry& best) {
  const int par = parent_[branch];
  const int t = parent_[par];
  const int q = slot_[par];
  const int m = static_cast<int>(tree_.nodes[t].children.size());
  const int length = static_cast<int>(items_[branch].size());
  const bool last = q + 1 == m;
  levels(
      last ? 0 : 1, last ? 0 : n - 1, [&](int x) { return series(t, q + 1, x, d).depth; },
      [&](int n_r, int dj) {
        if (dj >= kInf || dj + 1 >= best.depth) return false;
        const int dd = cap(d + dj);
        const int left = n - n_r;
        if (k == length) {
          const int h = others(branch, left, dd);
          if (h < kInf && h + dj < best.depth) best = {h + dj, Open{n_r, 0}};
        } else {
          auto [h, n_m] = balance(
              1, left - 1, [&](int x) { return series(branch, k, x, dd).depth; },
              [&](int x) { return others(branch, left - x, dd); });
          if (h < kInf && h + dj < best.depth) best = {h + dj, Open{n_r, n_m}};
        }
        return true;
      });
}

// Join (tail == branch) or cross (tail the other largest branch): the join stage holds the tail
// of `tail` and children q+1..e; the stages of `tail` before it run beside the other branches,
// which feed the join stage. The join stage holds child q+1 alone or all the following children
// that fit (not every count in between: each would be another copy of branch_to_join's states).
void Solver::inside_join(int branch, int tail, int k, int n, int d, Entry& best) {
  const int par = parent_[branch];
  const int t = parent_[par];
  const int q = slot_[par];
  const int m = static_cast<int>(tree_.nodes[t].children.size());
  const int length = static_cast<int>(items_[branch].size());
  const int spare = sorted_[par].size() == 2 ? 0 : 1;  // devices the branches after the two largest need
  const auto& tails = join_row(tail, static_cast<int>(items_[tail].size()) - 1);
  const int fits_in_row = static_cast<int>(tails.size());
  int e_last = q + 1;
  while (e_last + 1 < m && e_last + 1 - q - 1 < fits_in_row && !too_big(tails[e_last + 1 - q - 1])) ++e_last;
  for (int e = q + 1; e < m; e = (e == e_last ? m : e_last)) {
    if (e - q - 1 >= fits_in_row || too_big(tails[e - q - 1])) break;
    const bool last = e + 1 == m;
    levels(
        last ? 0 : 1, last ? 0 : n - 2, [&](int x) { return series(t, e + 1, x, d).depth; },
        [&](int n_r, int rest) {
          if (rest >= kInf || rest + 2 >= best.depth) return false;
          const int d2 = cap(d + rest);
          const int left = n - n_r;
          if (tail == branch) {
            auto [h, n_t] = balance(
                1, left - 1, [&](int x) { return branch_to_join(branch, k, x, d2, e).depth; },
                [&](int x) { return others(branch, left - x, cap(d2 + 1)) + 1; });
            if (h < kInf && h + rest < best.depth) best = {h + rest, Join{{e, device_byte(n_r)}, n_t}};
            return true;
          }
          // Three parts: the fork branch's rest, the other branch up to the join, the others.
          auto split = [&](int n_f, int f) {
            auto [h, n_t] = balance(
                1, left - n_f - spare, [&](int x) { return branch_to_join(tail, 0, x, d2, e).depth; },
                [&](int x) { return parallel(par, 2, left - n_f - x, cap(d2 + 1)).depth + 1; });
            h = std::max(h, f);
            // A cross of one stage (the fork stage held the whole fork branch, the join stage
            // holds the whole other one, no branch runs beside) is a close, searched as one
            // (inside_close): left out here, every join or cross has a stage before its join
            // stage, which the scan's stop above (rest + 2) counts on.
            if (h < 2) return;
            if (h < kInf && h + rest < best.depth)
              best = {h + rest, Cross{{e, device_byte(n_r)}, device_byte(n_t), device_byte(n_f)}};
          };
          if (k == length) {
            split(0, 1);
          } else {
            levels(
                1, left - 1 - spare, [&](int x) { return series(branch, k, x, cap(d2 + 1)).depth + 1; },
                [&](int n_f, int f) {
                  if (f >= kInf || f + rest >= best.depth) return false;
                  split(n_f, f);
                  return true;
                });
          }
          return true;
        });
  }
}

// Close: the join stage holds the fork branch's rest, the whole other largest branch and
// children q+1..e; only the smaller branches run between the fork and the join stage.
void Solver::inside_close(int branch, int k, int n, int d, Entry& best) {
  const int par = parent_[branch];
  const int t = parent_[par];
  const int q = slot_[par];
  const int m = static_cast<int>(tree_.nodes[t].children.size());
  const int spare = sorted_[par].size() == 2 ? 0 : 1;
  const auto& joins = close_row(branch, k);
  for (int j = 0; j < static_cast<int>(joins.size()); ++j) {
    const Stats& s = joins[j];
    if (too_big(s)) break;
    // Cannot meet the target even with the fewest micro-batches in flight.
    if (replicas_to_fit(s, in_flight(d + 1), n) == 0) continue;
    const int e = q + 1 + j;
    const bool last = e + 1 == m;
    levels(
        last ? 0 : 1, last ? 0 : n - 1 - spare, [&](int x) { return series(t, e + 1, x, d).depth; },
        [&](int n_r, int rest) {
          if (rest >= kInf || rest + 1 >= best.depth) return false;
          const int r = replicas_to_fit(s, in_flight(d + rest + 1), n - n_r - spare);
          if (r == 0) return true;
          const int side = parallel(par, 2, n - n_r - r, cap(d + rest + 1)).depth;
          if (side < kInf && side + 1 + rest < best.depth) best = {side + 1 + rest, Close{{e, device_byte(n_r)}, r}};
          return true;
        });
  }
}

// Items i.. of `branch` on n devices, its last stage also holding the series children q+1..e
// after its parallel node (the join stage), with d stages after that stage.
Entry Solver::branch_to_join(int branch, int i, int n, int d, int e) {
  if (n < 1 || too_few(to_join_work(branch, i, e), n)) return {};
  const std::uint64_t to_join = fragment(kToJoin, parent_[parent_[branch]], branch, i, n, d);
  const std::pair<std::uint64_t, std::uint64_t> k{to_join, static_cast<std::uint64_t>(e)};
  int low, high;
  if (auto known = settled(join_memo_, k, &Depths::join, low, high)) return *known;
  const int q = slot_[parent_[branch]];
  const auto& items = items_[branch];
  const int length = static_cast<int>(items.size());
  Entry best;
  if (high < kInf) best.depth = high + 1;  // bound(): nothing deeper than `high` can be best
  const auto& tails = join_row(branch, i);
  if (e - q - 1 < static_cast<int>(tails.size())) {
    if (const int r = replicas_to_fit(tails[e - q - 1], in_flight(d + 1), n); r > 0) best = {1, JoinStage{r}};
  }
  if (best.depth > 1 && best.depth > low && n >= 2 && i + 1 < length) {
    const auto& stats = row(branch, i, items);
    for (int g = 0; g < static_cast<int>(stats.size()) && i + g + 1 < length && best.depth > low; ++g) {
      const Stats& s = stats[g];
      if (too_big(s)) break;
      // The branch's rest, then the join stage's children (q + 1..e).
      const auto& after = suffix_path_[parent_[parent_[branch]]];
      if (1 + path_depth(item_path_[branch][i + g + 1] + after[q + 1] - after[e + 1]) >= best.depth) continue;
      auto [rest, r] = stage_then(s, n, d, 0, [&](int x) { return branch_to_join(branch, i + g + 1, x, d, e).depth; });
      if (rest < kInf && rest + 1 < best.depth) best = {rest + 1, Group{i + g, r}};
    }
    if (!is_leaf(items[i]) && best.depth > low) {
      levels(
          1, n - 2, [&](int x) { return branch_to_join(branch, i + 1, x, d, e).depth; },
          [&](int x, int rest) {
            if (rest >= kInf || rest + 1 >= best.depth) return false;
            const int child = solve(items[i], n - x, d + rest).depth;
            if (child < kInf && child + rest < best.depth) best = {child + rest, Split{n - x}};
            return true;
          });
    }
  }
  join_memo_.insert(k, best);
  return best;
}

}  // namespace graphpipe::partition::series_parallel_dp
