#include "partition/graphpipe_dp.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <unordered_map>

#include "common/log.h"
#include "partition/group_stats.h"

namespace graphpipe::partition {

namespace {

constexpr int kInf = 1 << 20;

struct Stats {
  double compute = 0.0, time = 0.0, static_bytes = 0.0, act_bytes = 0.0;
};

struct Entry {
  int h = kInf;
  int a = -1;  // group end p / merged run end q, or the child/branch index for a decomposition
  int b = -1;  // devices given to the decomposed child/branch, -1 for a single stage
};

enum Kind : std::uint64_t { kSolve = 0, kSeries = 1, kParallel = 2 };

class Planner {
 public:
  Planner(const Problem& p, const graph::SPTree& tree) : p_(p), tree_(tree), stamps_(p.num_nodes(), -1) {
    const std::size_t count = tree.nodes.size();
    leaves_.resize(count);
    whole_.resize(count);
    for (std::size_t t = 0; t < count; ++t) {
      leaves_[t] = tree.leaves(static_cast<int>(t));
      whole_[t] = group(leaves_[t]);
    }
    sorted_.resize(count);
    for (std::size_t t = 0; t < count; ++t) {
      const graph::SPNode& node = tree.nodes[t];
      if (node.kind != graph::SPNode::Kind::parallel) continue;
      sorted_[t] = node.children;
      std::stable_sort(sorted_[t].begin(), sorted_[t].end(),
                       [&](int x, int y) { return whole_[x].compute > whole_[y].compute; });
    }
    devices_ = std::max(1, std::min({p.max_stages, 255, static_cast<int>(p.num_nodes())}));
  }

  std::optional<std::vector<int>> run(double tolerance) {
    const int root = tree_.root;
    double lo = 0.0;
    for (double c : p_.compute) lo = std::max(lo, c);
    lo = std::max(lo, p_.total_compute() / devices_);
    double hi = whole_[root].time;
    if (!feasible(hi)) {
      // At the whole graph's time every grouping meets the target: only memory can fail.
      return std::nullopt;
    }
    int probes = 1;
    if (feasible(lo)) {
      hi = lo;
    } else {
      while (hi > lo * (1.0 + tolerance)) {
        double mid = 0.5 * (lo + hi);
        ++probes;
        if (feasible(mid)) hi = mid; else lo = mid;
      }
    }
    feasible(hi);
    log::debug("graphpipe: target " + std::to_string(hi) + " s per micro-batch after " +
               std::to_string(probes) + " probes, " + std::to_string(memo_.size()) + " states");
    std::vector<int> assignment(p_.num_nodes(), -1);
    int next_label = 0;
    rebuild_solve(root, devices_, 0, assignment, next_label);
    return assignment;
  }

 private:
  Stats group(const std::vector<graph::NodeId>& nodes) {
    GroupStats g(p_, stamps_, next_stamp_++);
    for (graph::NodeId v : nodes) g.add(v);
    return {g.compute, g.time(), g.static_bytes, g.act_bytes};
  }

  // Stats of the unions of children items[start..q] for q = start.. while compute <= target
  // (series children in order, or a parallel node's sorted branches).
  const std::vector<Stats>& row(int t, int start, const std::vector<int>& items) {
    // A tree node is either series or parallel, so (node, start) names one row.
    std::uint64_t key = (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint32_t>(start);
    auto& r = rows_[key];
    if (r.complete || (!r.stats.empty() && r.limit >= target_)) return r.stats;
    r.stats.clear();
    GroupStats g(p_, stamps_, next_stamp_++);
    std::size_t q = static_cast<std::size_t>(start);
    for (; q < items.size(); ++q) {
      for (graph::NodeId v : leaves_[items[q]]) g.add(v);
      r.stats.push_back({g.compute, g.time(), g.static_bytes, g.act_bytes});
      if (g.compute > target_ || g.static_bytes > p_.memory_limit) break;
    }
    r.complete = q >= items.size();
    r.limit = target_;
    return r.stats;
  }

  int in_flight(int depth) const {
    return static_cast<int>(std::min<std::int64_t>(depth, p_.num_micro_batches));
  }
  bool fits(const Stats& s, int in_flight_count) const {
    return s.time <= target_ && s.static_bytes + s.act_bytes * in_flight_count <= p_.memory_limit;
  }
  int cap(int d) const { return static_cast<int>(std::min<std::int64_t>(d, std::min<std::int64_t>(p_.num_micro_batches, 255))); }

  static std::uint64_t key(Kind kind, int t, int i, int n, int d) {
    return (((static_cast<std::uint64_t>(t) * 3 + kind) << 38) | (static_cast<std::uint64_t>(i) << 16) |
            (static_cast<std::uint64_t>(n) << 8) | static_cast<std::uint64_t>(d));
  }

  bool feasible(double target) {
    target_ = target;
    memo_.clear();
    return solve(tree_.root, devices_, 0).h < kInf;
  }

  Entry solve(int t, int n, int d) {
    d = cap(d);
    if (n < 1) return {};
    auto k = key(kSolve, t, 0, n, d);
    if (auto it = memo_.find(k); it != memo_.end()) return it->second;
    Entry e;
    const graph::SPNode& node = tree_.nodes[t];
    if (fits(whole_[t], in_flight(d + 1))) {
      e = {1, -1, -1};
    } else if (node.kind == graph::SPNode::Kind::series) {
      e = {series(t, 0, n, d).h, 0, 0};
    } else if (node.kind == graph::SPNode::Kind::parallel) {
      e = {parallel(t, 0, n, d).h, 0, 0};
    }
    memo_[k] = e;
    return e;
  }

  Entry series(int t, int i, int n, int d) {
    const auto& children = tree_.nodes[t].children;
    const int m = static_cast<int>(children.size());
    if (i == m) return {0, -1, -1};
    if (n < 1) return {};
    auto k = key(kSeries, t, i, n, d);
    if (auto it = memo_.find(k); it != memo_.end()) return it->second;
    Entry best;
    const auto& stats = row(t, i, children);
    for (int q = 0; q < static_cast<int>(stats.size()); ++q) {
      const Stats& s = stats[q];
      if (s.compute > target_ || s.static_bytes > p_.memory_limit) break;
      if (s.time > target_) continue;
      int p = i + q;
      int rest = series(t, p + 1, n - 1, d).h;
      if (rest >= kInf || rest + 1 >= best.h) continue;
      if (fits(s, in_flight(d + rest + 1))) best = {rest + 1, p, -1};
    }
    if (tree_.nodes[children[i]].kind != graph::SPNode::Kind::leaf) {
      for (int n1 = 2; n1 <= n; ++n1) {
        int rest = series(t, i + 1, n - n1, d).h;
        if (rest >= kInf) continue;
        int child = solve(children[i], n1, d + rest).h;
        if (child < kInf && child + rest < best.h) best = {child + rest, i, n1};
      }
    }
    memo_[k] = best;
    return best;
  }

  Entry parallel(int t, int j, int n, int d) {
    const auto& branches = sorted_[t];
    const int count = static_cast<int>(branches.size());
    if (j == count) return {0, -1, -1};
    if (n < 1) return {};
    auto k = key(kParallel, t, j, n, d);
    if (auto it = memo_.find(k); it != memo_.end()) return it->second;
    Entry best;
    const auto& stats = row(t, j, branches);
    for (int q = 0; q < static_cast<int>(stats.size()); ++q) {
      const Stats& s = stats[q];
      if (s.compute > target_ || s.static_bytes > p_.memory_limit) break;
      if (!fits(s, in_flight(d + 1))) continue;
      int rest = parallel(t, j + q + 1, n - 1, d).h;
      int h = std::max(1, rest);
      if (rest < kInf && h < best.h) best = {h, j + q, -1};
    }
    for (int n1 = 2; n1 <= n; ++n1) {
      int branch = solve(branches[j], n1, d).h;
      if (branch >= kInf) continue;
      int rest = parallel(t, j + 1, n - n1, d).h;
      int h = std::max(branch, rest);
      if (rest < kInf && h < best.h) best = {h, j, n1};
    }
    memo_[k] = best;
    return best;
  }

  void label(const std::vector<graph::NodeId>& nodes, int stage, std::vector<int>& assignment) {
    for (graph::NodeId v : nodes) assignment[v] = stage;
  }

  void rebuild_solve(int t, int n, int d, std::vector<int>& assignment, int& next) {
    d = cap(d);
    Entry e = solve(t, n, d);
    if (e.a < 0) {
      label(leaves_[t], next++, assignment);
    } else if (tree_.nodes[t].kind == graph::SPNode::Kind::series) {
      rebuild_series(t, 0, n, d, assignment, next);
    } else {
      rebuild_parallel(t, 0, n, d, assignment, next);
    }
  }

  void rebuild_series(int t, int i, int n, int d, std::vector<int>& assignment, int& next) {
    const auto& children = tree_.nodes[t].children;
    if (i == static_cast<int>(children.size())) return;
    Entry e = series(t, i, n, d);
    if (e.b < 0) {
      int stage = next++;
      for (int c = i; c <= e.a; ++c) label(leaves_[children[c]], stage, assignment);
      rebuild_series(t, e.a + 1, n - 1, d, assignment, next);
    } else {
      int rest = series(t, i + 1, n - e.b, d).h;
      rebuild_solve(children[i], e.b, d + rest, assignment, next);
      rebuild_series(t, i + 1, n - e.b, d, assignment, next);
    }
  }

  void rebuild_parallel(int t, int j, int n, int d, std::vector<int>& assignment, int& next) {
    const auto& branches = sorted_[t];
    if (j == static_cast<int>(branches.size())) return;
    Entry e = parallel(t, j, n, d);
    if (e.b < 0) {
      int stage = next++;
      for (int q = j; q <= e.a; ++q) label(leaves_[branches[q]], stage, assignment);
      rebuild_parallel(t, e.a + 1, n - 1, d, assignment, next);
    } else {
      rebuild_solve(branches[j], e.b, d, assignment, next);
      rebuild_parallel(t, j + 1, n - e.b, d, assignment, next);
    }
  }

  struct Row {
    std::vector<Stats> stats;
    bool complete = false;
    double limit = 0.0;
  };

  const Problem& p_;
  const graph::SPTree& tree_;
  std::vector<int> stamps_;
  int next_stamp_ = 0;
  int devices_ = 1;
  double target_ = 0.0;
  std::vector<std::vector<graph::NodeId>> leaves_;
  std::vector<Stats> whole_;
  std::vector<std::vector<int>> sorted_;
  std::unordered_map<std::uint64_t, Row> rows_;
  std::unordered_map<std::uint64_t, Entry> memo_;
};

}  // namespace

std::optional<std::vector<int>> graphpipe_assignment(const Problem& problem, const graph::SPTree& tree,
                                                     double tolerance) {
  if (tree.root < 0) return std::nullopt;
  return Planner(problem, tree).run(tolerance);
}

}  // namespace graphpipe::partition
