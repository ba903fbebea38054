#include "partition/series_parallel_dp/graphpipe_dp.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <numeric>
#include <unordered_map>

#include "common/log.h"
#include "partition/group_stats.h"
#include "partition/recompute.h"
#include "partition/replica_allocation.h"

namespace graphpipe::partition {

namespace {

constexpr int kInf = 1 << 20;
// Rows of stage unions are grown past the target by this factor: the search probes larger
// targets later (galloping, the shallower plans), and a row grown far enough serves them
// without being grown again from its start. Entries past the target change nothing (every
// reader stops at the first union whose compute exceeds the target). 1.5 measured best on the
// 10,000-operator series-parallel benchmark graph (rows regrown ~2x less, DP ~15% faster).
constexpr double kGrowMargin = 1.5;

struct Stats {
  double compute = 0.0, time = 0.0, static_bytes = 0.0, act_bytes = 0.0;
  // Forward seconds and received tensors' bytes: what activation recomputation runs again and
  // keeps (recompute.h).
  double forward = 0.0, input_bytes = 0.0;
  // Replicated problems only: parameter and crossing bytes, and where the group's compute at
  // every replica level starts in the planner's level arena, followed by its forward at every
  // level (-1: not replicated).
  double params = 0.0, cross_bytes = 0.0;
  std::int64_t levels = -1;
  // Replicated problems: bit l of `meets` says whether level l's replica meets the target of
  // probe `probe` (Planner::need), and of `meets_recomputed` whether it still does with its
  // forward run once more (recompute.h). Those tests depend on neither the devices nor the
  // in-flight count that need() varies, so they are made once per group, level and probe instead
  // of once per need() call; a new probe makes the masks again.
  mutable std::uint64_t meets = 0, meets_recomputed = 0;
  mutable int probe = -1;
};

// How a fragment's best plan starts, so that the rebuild can follow it.
enum class Move : std::uint8_t {
  none,   // empty or infeasible fragment, or (solve) the whole subtree as one stage
  group,  // series: children i..a as one stage
  split,  // series: child i decomposed on b devices; parallel: branch j on b devices
  run,    // parallel: sorted branches j..a share one stage
  fork,   // series: children i..a-1 and the first b items of child a's c-th largest branch
  open,   // inside: the rest of the series after the join on a devices, the fork branch's rest on b
  join,   // inside: the fork branch from k and the series children up to a (its last stage
          // holding them, see branch_to_join()) on c devices, the series after a on b devices
  cross,  // inside: as join, but the other largest branch from its start holds the join stage,
          // and the fork branch's rest gets e devices
  close,  // inside: the fork branch's rest, the other largest branch and the series children up
          // to a as one stage, the series after a on b devices
};

struct Entry {
  int h = kInf;
  int a = -1;
  int b = -1;
  int c = -1;
  int e = -1;
  Move move = Move::none;
};

enum Kind : std::uint64_t { kSolve = 0, kSeries = 1, kParallel = 2, kInside = 3, kToJoin = 4, kOthers = 5, kKinds = 6 };

// The memo of one probe: open addressing with linear probing, cleared in O(1) by bumping a
// generation (a probe visits up to millions of states; std::unordered_map's node allocations
// and bucket walks cost most of the DP's time).
template <class Key>
class Memo {
 public:
  const Entry* find(const Key& key) const {
    if (slots_.empty()) return nullptr;
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.generation != generation_) return nullptr;
      if (s.key == key) return &s.value;
    }
  }
  void insert(const Key& key, const Entry& value) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    for (std::size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.generation != generation_) {
        s = {generation_, key, value};
        ++size_;
        return;
      }
      if (s.key == key) {
        s.value = value;
        return;
      }
    }
  }
  void clear() {
    size_ = 0;
    if (++generation_ == 0) {  // wrapped: slots of generation 0 would look live
      slots_.assign(slots_.size(), Slot{});
      generation_ = 1;
    }
  }
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::uint32_t generation = 0;
    Key key{};
    Entry value;
  };
  static std::size_t mix(std::uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return static_cast<std::size_t>(x ^ (x >> 33));
  }
  static std::size_t hash(std::uint64_t k) { return mix(k); }
  static std::size_t hash(const std::pair<std::uint64_t, std::uint64_t>& k) { return mix(k.first ^ mix(k.second)); }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    const std::uint32_t live = generation_;
    slots_.assign(std::max<std::size_t>(1024, old.size() * 2), Slot{});
    mask_ = slots_.size() - 1;
    generation_ = 1;
    size_ = 0;
    for (const Slot& s : old)
      if (s.generation == live) insert(s.key, s.value);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
  std::uint32_t generation_ = 1;
};

class Planner {
 public:
  Planner(const Problem& p, const graph::SPTree& tree) : p_(p), tree_(tree), stamps_(p.num_nodes(), -1) {
    const std::size_t count = tree.nodes.size();
    leaves_.resize(count);
    whole_.resize(count);
    parent_.assign(count, -1);
    slot_.assign(count, -1);
    for (std::size_t t = 0; t < count; ++t) {
      leaves_[t] = tree.leaves(static_cast<int>(t));
      whole_[t] = group(leaves_[t]);
      const auto& children = tree.nodes[t].children;
      for (std::size_t c = 0; c < children.size(); ++c) {
        parent_[children[c]] = static_cast<int>(t);
        slot_[children[c]] = static_cast<int>(c);
      }
    }
    sorted_.resize(count);
    items_.resize(count);
    for (std::size_t t = 0; t < count; ++t) {
      const graph::SPNode& node = tree.nodes[t];
      if (node.kind != graph::SPNode::Kind::parallel) continue;
      sorted_[t] = node.children;
      std::stable_sort(sorted_[t].begin(), sorted_[t].end(),
                       [&](int x, int y) { return whole_[x].compute > whole_[y].compute; });
      // The two largest branches, which may share the fork or the join stage, as sequences of
      // series items: a branch's children when it is a series node, else the branch itself.
      for (std::size_t lead = 0; lead < 2 && lead < sorted_[t].size(); ++lead) {
        const int b = sorted_[t][lead];
        const graph::SPNode& node = tree.nodes[b];
        items_[b] = node.kind == graph::SPNode::Kind::series ? node.children : std::vector<int>{b};
      }
    }
    devices_ = std::max(1, std::min({p.max_stages, 255, static_cast<int>(p.num_nodes())}));
    if (p.replicated()) {
      // Replicas, not stages, spend the devices: the budget is the device count (docs/design.md,
      // "Replicated stages in the planner").
      rep_ = p.replicas.get();
      devices_ = std::max(1, std::min(p.device_budget, 255));
      num_levels_ = 0;
      while (num_levels_ < rep_->num_levels() && rep_->replicas(num_levels_) <= devices_) ++num_levels_;
      for (std::size_t t = 0; t < count; ++t) whole_[t] = group(leaves_[t]);  // with their levels
    }
  }

  std::vector<ReplicatedAssignment> run(double tolerance) {
    const int root = tree_.root;
    // Least depth at each probed target (kInf: infeasible); depth never grows with the target.
    std::map<double, int> seen;
    // The plan of each feasible probe, rebuilt while its memo is live: the plans returned are
    // those of probed targets, and solving a target again only to rebuild its plan would cost
    // a whole probe per plan.
    std::map<double, std::vector<int>> plan_at;
    std::map<double, std::vector<int>> replicas_at;  // the replica counts of each such plan
    int probes = 0;
    auto probe = [&](double target) {
      auto [it, fresh] = seen.try_emplace(target, 0);
      if (fresh) {
        ++probes;
        it->second = feasible(target) ? solve(root, devices_, 0).h : kInf;
        if (it->second < kInf) {
          plan_at.emplace(target, rebuild());
          replicas_at.emplace(target, rebuilt_replicas_);
        }
      }
      return it->second;
    };
    double lo = 0.0;
    // With replicas an operator's time can shrink to its time on the smallest shard.
    for (std::size_t v = 0; v < p_.num_nodes(); ++v) {
      lo = std::max(lo, rep_ ? rep_->compute(num_levels_ - 1, static_cast<int>(v)) : p_.compute[v]);
    }
    lo = std::max(lo, p_.total_compute() / devices_);
    double hi = whole_[root].time;
    // At the whole graph's time every grouping meets the target (on one device a stage: with
    // replicas, at level 0): only memory can fail. A stage that fits only recomputed runs its
    // forward once more (recompute.h), so a layout may need up to the whole forward more; that
    // target is probed only when the first fails, so that the search (and every plan that fits
    // without recomputation) stays as it was.
    if (probe(hi) >= kInf) {
      hi += whole_[root].forward;
      if (probe(hi) >= kInf) return {};
    }
    if (probe(lo) < kInf) {
      hi = lo;
    } else {
      // The least target is usually within a small factor of the lower bound: gallop up to it
      // before bisecting.
      for (double up = 2.0 * lo; up < hi; up *= 2.0) {
        if (probe(up) < kInf) {
          hi = up;
          break;
        }
        lo = up;
      }
      while (hi > lo * (1.0 + tolerance)) {
        double mid = 0.5 * (lo + hi);
        if (probe(mid) < kInf) hi = mid; else lo = mid;
      }
    }
    const int main_probes = probes;
    // Shallower plans at larger targets: the step is (M + depth - 1) x slowest stage, so a plan
    // one stage shallower pays for a slightly slower stage. For each depth h below the least
    // target's, the least target reaching h is found by bisection (bracketed by the targets
    // probed so far), but only below the target at which h would stop paying off; a depth that
    // cannot pay off costs at most one probe. Extra probes are capped at max(16, probes so far).
    std::vector<double> picks{hi};
    const double m = static_cast<double>(p_.num_micro_batches);
    double best = (m + probe(hi) - 1) * hi;
    const int limit = probes + std::max(16, probes);
    for (int h = probe(hi) - 1; h >= 1 && probes < limit;) {
      const double upper = best / (m + h - 1);
      // a: the largest probe known too deep for h; b: the smallest known to reach h.
      double a = picks.back(), b = upper;
      bool reached = false;
      for (auto [target, depth] : seen) {
        if (target > upper) break;
        if (depth > h) a = std::max(a, target);
        else if (!reached) b = target, reached = true;
      }
      if (!reached && (upper <= a * (1.0 + tolerance) || probe(upper) > h)) {
        --h;
        continue;
      }
      while (b > a * (1.0 + tolerance) && probes < limit) {
        double mid = 0.5 * (a + b);
        if (probe(mid) <= h) b = mid; else a = mid;
      }
      picks.push_back(b);
      best = std::min(best, (m + probe(b) - 1) * b);
      h = probe(b) - 1;
    }
    log::debug("graphpipe: target " + std::to_string(hi) + " s per micro-batch after " + std::to_string(main_probes) +
               " probes; " + std::to_string(picks.size() - 1) + " shallower plans after " +
               std::to_string(probes - main_probes) + " more");
    std::vector<ReplicatedAssignment> plans;
    for (double target : picks) {
      plans.push_back({plan_at.at(target), rep_ ? replicas_at.at(target) : std::vector<int>{}});
    }
    return plans;
  }

 private:
  struct Row {
    std::vector<Stats> stats;
    bool computed = false;
    bool complete = false;
    double limit = 0.0;
  };

  Stats group(const std::vector<graph::NodeId>& nodes) {
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

  // The replicated problem's per-level compute, then per-level forward, of the group being
  // grown (level_sums_, 2 x num_levels_ entries).
  void add_levels(graph::NodeId v) {
    for (int l = 0; l < num_levels_; ++l) level_sums_[l] += rep_->compute(l, v);
    for (int l = 0; l < num_levels_; ++l) level_sums_[num_levels_ + l] += rep_->forward(l, v);
  }
  std::int64_t store_levels() {
    const auto at = static_cast<std::int64_t>(arena_.size());
    arena_.insert(arena_.end(), level_sums_.begin(), level_sums_.end());
    return at;
  }
  // The least compute a replica of the group can reach (its smallest shard).
  double least_compute(const Stats& s) const { return rep_ ? arena_[s.levels + num_levels_ - 1] : s.compute; }

  // The row under `key` when it was grown for this target or a larger one, or completely.
  const Row* cached(const std::unordered_map<std::uint64_t, Row>& rows, std::uint64_t key) const {
    auto it = rows.find(key);
    if (it == rows.end() || !it->second.computed) return nullptr;
    return it->second.complete || it->second.limit >= target_ ? &it->second : nullptr;
  }

  // Stats of `fixed` plus items[start..q] for q = start.. while the compute stays within
  // kGrowMargin x the target (the entry that crosses it is kept, so callers see where to stop).
  // Cached per key; a row grown for a larger target serves every smaller one.
  const std::vector<Stats>& grow(std::unordered_map<std::uint64_t, Row>& rows, std::uint64_t key,
                                 const std::vector<int>& fixed, std::size_t fixed_begin, std::size_t fixed_end,
                                 const std::vector<int>& items, std::size_t start) {
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
    for (std::size_t f = fixed_begin; f < fixed_end; ++f) {
      for (graph::NodeId v : leaves_[fixed[f]]) {
        g.add(v);
        if (rep_) add_levels(v);
      }
      if (least() > reach || g.static_bytes > p_.memory_limit) return r.stats;
    }
    std::size_t q = start;
    for (; q < items.size(); ++q) {
      for (graph::NodeId v : leaves_[items[q]]) {
        g.add(v);
        if (rep_) add_levels(v);
      }
      r.stats.push_back({g.compute, g.time(), g.static_bytes, g.act_bytes, g.forward, g.input_bytes, g.params,
                         g.cross_bytes, rep_ ? store_levels() : -1});
      if (least() > reach || g.static_bytes > p_.memory_limit) break;
    }
    r.complete = q >= items.size();
    return r.stats;
  }

  // Unions of children items[start..q] (series children in order, or a parallel node's sorted
  // branches). A tree node is either series or parallel, so (node, start) names one row.
  const std::vector<Stats>& row(int t, int start, const std::vector<int>& items) {
    static const std::vector<int> none;
    return grow(rows_, (static_cast<std::uint64_t>(t) << 32) | static_cast<std::uint32_t>(start), none, 0, 0,
                items, static_cast<std::size_t>(start));
  }

  // Series node t's children i..q-1 plus the first 1, 2, ... items of `branch`, one of the two
  // largest branches of parallel child q.
  const std::vector<Stats>& fork_row(int t, int i, int q, int branch) {
    std::uint64_t key = (static_cast<std::uint64_t>(branch) << 40) | (static_cast<std::uint64_t>(i) << 20) |
                        static_cast<std::uint64_t>(q);
    return grow(fork_rows_, key, tree_.nodes[t].children, i, q, items_[branch], 0);
  }

  // Items k.. of `branch` (one of the two largest of its parallel node) plus the series children
  // after the parallel node: q+1, q+1..q+2, ...
  const std::vector<Stats>& join_row(int branch, int k) {
    const int par = parent_[branch];
    const int t = parent_[par];
    std::uint64_t key = (static_cast<std::uint64_t>(branch) << 32) | static_cast<std::uint32_t>(k);
    return grow(join_rows_, key, items_[branch], k, items_[branch].size(), tree_.nodes[t].children,
                static_cast<std::size_t>(slot_[par] + 1));
  }

  // The rest of `branch` from item k, the whole other one of the two largest branches, and the
  // series children after the parallel node: q+1, q+1..q+2, ...
  const std::vector<Stats>& close_row(int branch, int k) {
    const std::uint64_t key = (static_cast<std::uint64_t>(branch) << 32) | static_cast<std::uint32_t>(k);
    if (const Row* r = cached(close_rows_, key)) return r->stats;
    const int par = parent_[branch];
    const auto& lead = sorted_[par];
    std::vector<int> fixed(items_[branch].begin() + k, items_[branch].end());
    fixed.push_back(lead[0] == branch ? lead[1] : lead[0]);
    return grow(close_rows_, key, fixed, 0, fixed.size(), tree_.nodes[parent_[par]].children,
                static_cast<std::size_t>(slot_[par] + 1));
  }

  int in_flight(int depth) const {
    return static_cast<int>(std::min<std::int64_t>(depth, p_.num_micro_batches));
  }
  // Whether a stage of figures s meets the target and fits with `in_flight_count` micro-batches,
  // recomputed where it fits only so (recompute.h; then its time has the forward once more).
  // Monotone in in_flight_count, as the moves below assume.
  bool fits(const Stats& s, int in_flight_count) const {
    return stage_fits(s.time, s.forward, s.static_bytes, s.act_bytes, s.input_bytes, in_flight_count,
                      p_.memory_limit, target_);
  }
  bool too_big(const Stats& s) const { return least_compute(s) > target_ || s.static_bytes > p_.memory_limit; }

  // Replicated problems: the least replica count, at most n, with which a stage of figures s
  // meets the target and fits with `in_flight_count` micro-batches, recomputed where the shared
  // rule says (recompute.h; a replica holds its shard's activations and received tensors, and
  // recomputed runs its shard's forward once more; replica_allocation.h says how a replica is
  // timed); 0 when none does. Grows with in_flight_count (the rule is monotone in it).
  int need(const Stats& s, int in_flight_count, int n) const {
    if (num_levels_ > 64) {  // more levels than a mask holds (micro-batches of thousands of rows)
      for (int l = 0; l < num_levels_ && rep_->replicas(l) <= n; ++l) {
        const double fraction = rep_->row_fraction(l);
        if (stage_fits(level_time(s, l), level_forward(s, l), s.static_bytes, s.act_bytes * fraction,
                       s.input_bytes * fraction, in_flight_count, p_.memory_limit, target_)) {
          return rep_->replicas(l);
        }
      }
      return 0;
    }
    if (s.probe != probe_id_) {  // masks of another target
      std::uint64_t mask = 0, recomputed = 0;
      for (int l = 0; l < num_levels_; ++l) {
        const double time = level_time(s, l);
        if (time <= target_) mask |= std::uint64_t{1} << l;
        if (time + StageMemory{0.0, true}.extra_seconds(level_forward(s, l)) <= target_) {
          recomputed |= std::uint64_t{1} << l;
        }
      }
      s.meets = mask;
      s.meets_recomputed = recomputed;
      s.probe = probe_id_;
    }
    // The scan above, over the levels that meet the target only (ascending): stage_fits with
    // its time test read from the masks.
    for (std::uint64_t left = s.meets; left != 0; left &= left - 1) {
      const int l = std::countr_zero(left);
      if (rep_->replicas(l) > n) return 0;
      const double fraction = rep_->row_fraction(l);
      const StageMemory m = stage_memory(s.static_bytes, s.act_bytes * fraction, s.input_bytes * fraction,
                                         in_flight_count, p_.memory_limit);
      if (m.bytes > p_.memory_limit) continue;
      if (!m.recompute || (s.meets_recomputed >> l & 1u)) return rep_->replicas(l);
    }
    return 0;
  }
  // A replica's time at level l (forward, backward, its share of the transfers, the amortised
  // sync), and its forward alone: what recomputation runs again (evaluate.cpp takes level 0 as
  // the problem's own figures).
  double level_time(const Stats& s, int l) const {
    const double compute = l == 0 ? s.compute : arena_[s.levels + l];
    return replica_stage_time(p_, l, compute, s.time - s.compute, s.cross_bytes, s.params);
  }
  double level_forward(const Stats& s, int l) const { return l == 0 ? s.forward : arena_[s.levels + num_levels_ + l]; }

  // Replicated problems: a stage of figures s with `after` stages at least after it (inside the
  // enclosing fragment), then the rest on the devices it leaves, rest(devices) giving the rest's
  // depth. Returns (rest's depth, the stage's replicas), the least replicas whose devices leave
  // the rest a depth at which the stage still fits in memory; (kInf, 0) when none does. More
  // replicas leave the rest fewer devices, so the least that fits is the best.
  template <class Rest>
  std::pair<int, int> stage_then(const Stats& s, int n, int d, int after, Rest rest) {
    int r = need(s, in_flight(d + after + 1), n);
    while (r > 0) {
      const int h = rest(n - r);
      if (h >= kInf) return {kInf, 0};
      const int wider = need(s, in_flight(d + h + 1), n);
      if (wider == r) return {h, r};
      r = wider;
    }
    return {kInf, 0};
  }
  int cap(int d) const { return static_cast<int>(std::min<std::int64_t>(d, std::min<std::int64_t>(p_.num_micro_batches, 255))); }

  static std::uint64_t key(Kind kind, int t, int i, int n, int d) {
    return (((static_cast<std::uint64_t>(t) * kKinds + kind) << 38) | (static_cast<std::uint64_t>(i) << 16) |
            (static_cast<std::uint64_t>(n) << 8) | static_cast<std::uint64_t>(d));
  }

  bool is_parallel(int t) const { return tree_.nodes[t].kind == graph::SPNode::Kind::parallel; }

  // min over x in [lo, hi] of max(f(x), g(x)) and its x, for f non-increasing and g
  // non-decreasing in x (two parts sharing devices: more for one is fewer for the other, and
  // depth never grows with devices), by bisection on the crossing: O(log(hi - lo)) calls.
  template <class F, class G>
  static std::pair<int, int> balance(int lo, int hi, F f, G g) {
    if (lo > hi) return {kInf, -1};
    int a = lo, b = hi;
    while (a < b) {
      int mid = a + (b - a) / 2;
      if (f(mid) <= g(mid)) b = mid; else a = mid + 1;
    }
    std::pair<int, int> best{std::max(f(a), g(a)), a};
    if (a > lo) {
      int before = std::max(f(a - 1), g(a - 1));
      if (before < best.first) best = {before, a - 1};
    }
    if (best.first >= kInf) best.first = kInf;
    return best;
  }

  // Calls visit(x, f(x)) for the least x in [lo, hi] of each value that f takes, smallest value
  // first, for f non-increasing in x (the depth of a part given at most x devices); stops when
  // visit returns false. The other part's share shrinks as x grows, so only these x can be best.
  template <class F, class V>
  static void levels(int lo, int hi, F f, V visit) {
    int r = hi;
    while (r >= lo) {
      const int v = f(r);
      int a = lo, b = r;
      while (a < b) {
        int mid = a + (b - a) / 2;
        if (f(mid) <= v) b = mid; else a = mid + 1;
      }
      if (!visit(a, v)) return;
      r = a - 1;
    }
  }

  // The plan of the target last solved (feasible() true), from its memo.
  std::vector<int> rebuild() {
    std::vector<int> assignment(p_.num_nodes(), -1);
    rebuilt_replicas_.clear();
    int next_label = 0;
    rebuild_solve(tree_.root, devices_, 0, assignment, next_label);
    return assignment;
  }

  bool feasible(double target) {
    target_ = target;
    ++probe_id_;  // every Stats' cached meets() mask is stale now
    memo_.clear();
    join_memo_.clear();
    return solve(tree_.root, devices_, 0).h < kInf;
  }

  Entry solve(int t, int n, int d) {
    d = cap(d);
    if (n < 1) return {};
    auto k = key(kSolve, t, 0, n, d);
    if (const Entry* hit = memo_.find(k)) return *hit;
    Entry e;
    const graph::SPNode& node = tree_.nodes[t];
    if (rep_ ? need(whole_[t], in_flight(d + 1), n) > 0 : fits(whole_[t], in_flight(d + 1))) {
      e = {1, -1, rep_ ? need(whole_[t], in_flight(d + 1), n) : -1, -1, -1, Move::none};
    } else if (node.kind == graph::SPNode::Kind::series) {
      e = {series(t, 0, n, d).h, 0, 0, -1, -1, Move::split};
    } else if (node.kind == graph::SPNode::Kind::parallel) {
      e = {parallel(t, 0, n, d).h, 0, 0, -1, -1, Move::split};
    }
    memo_.insert(k, e);
    return e;
  }

  Entry series(int t, int i, int n, int d) {
    const auto& children = tree_.nodes[t].children;
    const int m = static_cast<int>(children.size());
    if (i == m) return {0, -1, -1, -1, -1, Move::none};
    if (n < 1) return {};
    auto k = key(kSeries, t, i, n, d);
    if (const Entry* hit = memo_.find(k)) return *hit;
    Entry best;
    const auto& stats = row(t, i, children);
    for (int q = 0; q < static_cast<int>(stats.size()); ++q) {
      const Stats& s = stats[q];
      if (too_big(s)) break;
      int p = i + q;
      if (rep_) {
        auto [rest, r] = stage_then(s, n, d, 0, [&](int x) { return series(t, p + 1, x, d).h; });
        if (rest < kInf && rest + 1 < best.h) best = {rest + 1, p, r, -1, -1, Move::group};
        continue;
      }
      if (s.time > target_) continue;
      int rest = series(t, p + 1, n - 1, d).h;
      if (rest >= kInf || rest + 1 >= best.h) continue;
      if (fits(s, in_flight(d + rest + 1))) best = {rest + 1, p, -1, -1, -1, Move::group};
    }
    if (tree_.nodes[children[i]].kind != graph::SPNode::Kind::leaf) {
      // The child gets the devices the rest does not need for each depth the rest can reach.
      levels(0, n - 2, [&](int x) { return series(t, i + 1, x, d).h; }, [&](int x, int rest) {
        if (rest >= kInf || rest + 1 >= best.h) return false;
        int child = solve(children[i], n - x, d + rest).h;
        if (child < kInf && child + rest < best.h) best = {child + rest, i, n - x, -1, -1, Move::split};
        return true;
      });
    }
    // Fork: children i..q-1 and the head of one of parallel child q's two largest branches as
    // one stage; the rest of q starts after it (inside()).
    if (n >= 2 && best.h > 2) {  // a fork stage has at least one stage after it
      for (int q = i + 1; q < m && q - 1 - i < static_cast<int>(stats.size()); ++q) {
        if (too_big(stats[q - 1 - i])) break;
        if (!is_parallel(children[q])) continue;
        const auto& lead = sorted_[children[q]];
        for (std::size_t slot = 0; slot < 2; ++slot) {
          const auto& heads = fork_row(t, i, q, lead[slot]);
          for (int j = 0; j < static_cast<int>(heads.size()); ++j) {
            const Stats& s = heads[j];
            if (too_big(s)) break;
            if (rep_) {
              auto [rest, r] = stage_then(s, n, d, 1, [&](int x) { return inside(lead[slot], j + 1, x, d).h; });
              if (rest < kInf && rest + 1 < best.h) best = {rest + 1, q, j + 1, static_cast<int>(slot), r, Move::fork};
              continue;
            }
            if (!fits(s, in_flight(d + 2))) continue;  // not even with one stage after it
            int rest = inside(lead[slot], j + 1, n - 1, d).h;
            if (rest >= kInf || rest + 1 >= best.h) continue;
            if (fits(s, in_flight(d + rest + 1))) best = {rest + 1, q, j + 1, static_cast<int>(slot), -1, Move::fork};
          }
        }
      }
    }
    memo_.insert(k, best);
    return best;
  }

  // After a fork stage that holds the first k items of `branch` (one of the two largest
  // branches of its parallel node): the branch's remaining items, the other branches, and the
  // series children after the parallel node, on n devices with d stages after the enclosing
  // series node. The join (the first series child after the parallel node) either starts its own
  // stages (open), or shares a stage with the tail of the same branch (join) or of the other of
  // the two largest branches (cross), or with the fork branch's rest and the whole other one
  // (close).
  Entry inside(int branch, int k, int n, int d) {
    if (n < 1) return {};
    auto key_ = key(kInside, branch, k, n, d);
    if (const Entry* hit = memo_.find(key_)) return *hit;
    const int par = parent_[branch];
    const int t = parent_[par];
    const int q = slot_[par];
    const int m = static_cast<int>(tree_.nodes[t].children.size());
    const int length = static_cast<int>(items_[branch].size());
    const auto& lead = sorted_[par];
    const int other = lead[0] == branch ? lead[1] : lead[0];
    const int spare = lead.size() == 2 ? 0 : 1;  // devices the branches after the two largest need
    Entry best;
    // The series after the parallel node on n_r devices: only the least n_r of each depth it
    // reaches can be best (the rest of the devices go to the branches).
    auto after = [&](int from, int n_r) { return from == m ? 0 : series(t, from, n_r, d).h; };
    levels(q + 1 == m ? 0 : 1, q + 1 == m ? 0 : n - 1, [&](int x) { return after(q + 1, x); }, [&](int n_r, int dj) {
      if (dj >= kInf || dj + 1 >= best.h) return false;
      const int dd = cap(d + dj);
      const int left = n - n_r;
      if (k == length) {
        int h = others(branch, left, dd);
        if (h < kInf && h + dj < best.h) best = {h + dj, n_r, 0, -1, -1, Move::open};
      } else {
        auto [h, n_m] = balance(
            1, left - 1, [&](int x) { return series(branch, k, x, dd).h; },
            [&](int x) { return others(branch, left - x, dd); });
        if (h < kInf && h + dj < best.h) best = {h + dj, n_r, n_m, -1, -1, Move::open};
      }
      return true;
    });
    for (int tail : {branch, other}) {
      if (q + 1 == m || n < 2 || (tail == branch && k == length)) continue;
      // The join stage holds the tail of `tail` and children q+1..e; the stages of `tail`
      // before it run beside the other branches, which feed the join stage.
      // The join stage holds child q+1 alone or all the following children that fit (not every
      // count in between: each would be another copy of branch_to_join's states).
      const auto& tails = join_row(tail, static_cast<int>(items_[tail].size()) - 1);
      int e_last = q + 1;
      while (e_last + 1 < m && e_last + 1 - q - 1 < static_cast<int>(tails.size()) && !too_big(tails[e_last + 1 - q - 1])) ++e_last;
      for (int e = q + 1; e < m; e = (e == e_last ? m : e_last)) {
        if (e - q - 1 >= static_cast<int>(tails.size()) || too_big(tails[e - q - 1])) break;
        levels(e + 1 == m ? 0 : 1, e + 1 == m ? 0 : n - 2, [&](int x) { return after(e + 1, x); }, [&](int n_r, int rest) {
          if (rest >= kInf || rest + 2 >= best.h) return false;
          const int d2 = cap(d + rest);
          const int left = n - n_r;
          if (tail == branch) {
            auto [h, n_t] = balance(
                1, left - 1, [&](int x) { return branch_to_join(branch, k, x, d2, e).h; },
                [&](int x) { return others(branch, left - x, cap(d2 + 1)) + 1; });
            if (h < kInf && h + rest < best.h) best = {h + rest, e, n_r, n_t, -1, Move::join};
            return true;
          }
          // Three parts: the fork branch's rest, the other branch up to the join, the others.
          auto split = [&](int n_f, int f) {
            auto [h, n_t] = balance(
                1, left - n_f - spare, [&](int x) { return branch_to_join(other, 0, x, d2, e).h; },
                [&](int x) { return parallel(par, 2, left - n_f - x, cap(d2 + 1)).h + 1; });
            h = std::max(h, f);
            if (h < kInf && h + rest < best.h) best = {h + rest, e, n_r, n_t, n_f, Move::cross};
          };
          if (k == length) {
            split(0, 1);
          } else {
            levels(1, left - 1 - spare, [&](int x) { return series(branch, k, x, cap(d2 + 1)).h + 1; },
                   [&](int n_f, int f) {
                     if (f >= kInf || f + rest >= best.h) return false;
                     split(n_f, f);
                     return true;
                   });
          }
          return true;
        });
      }
    }
    if (q + 1 < m) {
      // The join stage holds the fork branch's rest, the whole other largest branch and children
      // q+1..e; only the smaller branches run between the fork and the join stage.
      const auto& joins = close_row(branch, k);
      for (int j = 0; j < static_cast<int>(joins.size()); ++j) {
        const Stats& s = joins[j];
        if (too_big(s)) break;
        if (!rep_ && s.time > target_) continue;
        const int e = q + 1 + j;
        levels(e + 1 == m ? 0 : 1, e + 1 == m ? 0 : n - 1 - spare, [&](int x) { return after(e + 1, x); },
               [&](int n_r, int rest) {
                 if (rest >= kInf || rest + 1 >= best.h) return false;
                 if (rep_) {
                   const int r = need(s, in_flight(d + rest + 1), n - n_r - spare);
                   if (r == 0) return true;
                   const int side = parallel(par, 2, n - n_r - r, cap(d + rest + 1)).h;
                   if (side < kInf && side + 1 + rest < best.h) best = {side + 1 + rest, e, n_r, r, -1, Move::close};
                   return true;
                 }
                 if (!fits(s, in_flight(d + rest + 1))) return true;
                 const int side = parallel(par, 2, n - n_r - 1, cap(d + rest + 1)).h;
                 if (side < kInf && side + 1 + rest < best.h) best = {side + 1 + rest, e, n_r, -1, -1, Move::close};
                 return true;
               });
      }
    }
    memo_.insert(key_, best);
    return best;
  }

  // Least depth of the branches of `branch`'s parallel node other than `branch` (one of the two
  // largest) on n devices.
  int others(int branch, int n, int d) {
    const int par = parent_[branch];
    if (sorted_[par][0] == branch) return parallel(par, 1, n, d).h;
    if (n < 1) return kInf;
    auto k = key(kOthers, par, 0, n, d);
    if (const Entry* hit = memo_.find(k)) return hit->h;
    const int spare = sorted_[par].size() == 2 ? 0 : 1;
    auto [h, n1] = balance(
        1, n - spare, [&](int x) { return solve(sorted_[par][0], x, d).h; },
        [&](int x) { return parallel(par, 2, n - x, d).h; });
    memo_.insert(k, {h, n1, -1, -1, -1, Move::split});
    return h;
  }

  // Items i.. of `branch` on n devices, its last stage also holding the series children
  // q+1..e after its parallel node (the join stage), with d stages after that stage.
  Entry branch_to_join(int branch, int i, int n, int d, int e) {
    if (n < 1) return {};
    const std::pair<std::uint64_t, std::uint64_t> k{key(kToJoin, branch, i, n, d), static_cast<std::uint64_t>(e)};
    if (const Entry* hit = join_memo_.find(k)) return *hit;
    const int q = slot_[parent_[branch]];
    const auto& items = items_[branch];
    const int length = static_cast<int>(items.size());
    Entry best;
    const auto& tails = join_row(branch, i);
    if (e - q - 1 < static_cast<int>(tails.size())) {
      if (!rep_ && fits(tails[e - q - 1], in_flight(d + 1))) best = {1, -1, -1, -1, -1, Move::join};
      if (rep_) {
        const int r = need(tails[e - q - 1], in_flight(d + 1), n);
        if (r > 0) best = {1, -1, r, -1, -1, Move::join};
      }
    }
    if (best.h > 1 && n >= 2 && i + 1 < length) {
      const auto& stats = row(branch, i, items);
      for (int g = 0; g < static_cast<int>(stats.size()) && i + g + 1 < length; ++g) {
        const Stats& s = stats[g];
        if (too_big(s)) break;
        if (rep_) {
          auto [rest, r] = stage_then(s, n, d, 0, [&](int x) { return branch_to_join(branch, i + g + 1, x, d, e).h; });
          if (rest < kInf && rest + 1 < best.h) best = {rest + 1, i + g, r, -1, -1, Move::group};
          continue;
        }
        if (s.time > target_) continue;
        int rest = branch_to_join(branch, i + g + 1, n - 1, d, e).h;
        if (rest >= kInf || rest + 1 >= best.h) continue;
        if (fits(s, in_flight(d + rest + 1))) best = {rest + 1, i + g, -1, -1, -1, Move::group};
      }
      if (tree_.nodes[items[i]].kind != graph::SPNode::Kind::leaf && i + 1 < length) {
        levels(1, n - 2, [&](int x) { return branch_to_join(branch, i + 1, x, d, e).h; }, [&](int x, int rest) {
          if (rest >= kInf || rest + 1 >= best.h) return false;
          int child = solve(items[i], n - x, d + rest).h;
          if (child < kInf && child + rest < best.h) best = {child + rest, i, n - x, -1, -1, Move::split};
          return true;
        });
      }
    }
    join_memo_.insert(k, best);
    return best;
  }

  Entry parallel(int t, int j, int n, int d) {
    const auto& branches = sorted_[t];
    const int count = static_cast<int>(branches.size());
    if (j == count) return {0, -1, -1, -1, -1, Move::none};
    if (n < 1) return {};
    auto k = key(kParallel, t, j, n, d);
    if (const Entry* hit = memo_.find(k)) return *hit;
    Entry best;
    const auto& stats = row(t, j, branches);
    for (int q = 0; q < static_cast<int>(stats.size()); ++q) {
      const Stats& s = stats[q];
      if (too_big(s)) break;
      if (rep_) {
        const int r = need(s, in_flight(d + 1), n);
        if (r == 0) continue;
        int rest = parallel(t, j + q + 1, n - r, d).h;
        int h = std::max(1, rest);
        if (rest < kInf && h < best.h) best = {h, j + q, r, -1, -1, Move::run};
        continue;
      }
      if (!fits(s, in_flight(d + 1))) continue;
      int rest = parallel(t, j + q + 1, n - 1, d).h;
      int h = std::max(1, rest);
      if (rest < kInf && h < best.h) best = {h, j + q, -1, -1, -1, Move::run};
    }
    auto [h, n1] = balance(
        2, n, [&](int x) { return solve(branches[j], x, d).h; },
        [&](int x) { return parallel(t, j + 1, n - x, d).h; });
    if (h < best.h) best = {h, j, n1, -1, -1, Move::split};
    memo_.insert(k, best);
    return best;
  }

  // A new stage label, recording its replica count (-1, as entries without one store: 1).
  int take(int& next, int replicas) {
    rebuilt_replicas_.push_back(std::max(1, replicas));
    return next++;
  }

  void label(int t, int stage, std::vector<int>& assignment) {
    for (graph::NodeId v : leaves_[t]) assignment[v] = stage;
  }

  void rebuild_solve(int t, int n, int d, std::vector<int>& assignment, int& next) {
    d = cap(d);
    Entry e = solve(t, n, d);
    if (e.move == Move::none) {
      label(t, take(next, e.b), assignment);
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
    if (e.move == Move::group) {
      int stage = take(next, e.b);
      for (int c = i; c <= e.a; ++c) label(children[c], stage, assignment);
      rebuild_series(t, e.a + 1, n - std::max(1, e.b), d, assignment, next);
    } else if (e.move == Move::split) {
      int rest = series(t, i + 1, n - e.b, d).h;
      rebuild_solve(children[i], e.b, d + rest, assignment, next);
      rebuild_series(t, i + 1, n - e.b, d, assignment, next);
    } else {
      const int branch = sorted_[children[e.a]][e.c];
      int stage = take(next, e.e);
      for (int c = i; c < e.a; ++c) label(children[c], stage, assignment);
      for (int c = 0; c < e.b; ++c) label(items_[branch][c], stage, assignment);
      rebuild_inside(branch, e.b, n - std::max(1, e.e), d, assignment, next);
    }
  }

  void rebuild_inside(int branch, int k, int n, int d, std::vector<int>& assignment, int& next) {
    const Entry e = inside(branch, k, n, d);
    const int par = parent_[branch];
    const int t = parent_[par];
    const int q = slot_[par];
    const int m = static_cast<int>(tree_.nodes[t].children.size());
    if (e.move == Move::open) {
      const int dj = q + 1 == m ? 0 : series(t, q + 1, e.a, d).h;
      if (e.b > 0) rebuild_series(branch, k, e.b, cap(d + dj), assignment, next);
      rebuild_others(branch, n - e.a - e.b, cap(d + dj), assignment, next);
      if (q + 1 < m) rebuild_series(t, q + 1, e.a, d, assignment, next);
      return;
    }
    const int rest = e.a + 1 == m ? 0 : series(t, e.a + 1, e.b, d).h;
    const int d2 = cap(d + rest);
    if (e.move == Move::close) {
      const auto& lead = sorted_[par];
      const int other = lead[0] == branch ? lead[1] : lead[0];
      const auto& children = tree_.nodes[t].children;
      int stage = take(next, e.c);
      for (std::size_t c = static_cast<std::size_t>(k); c < items_[branch].size(); ++c) label(items_[branch][c], stage, assignment);
      label(other, stage, assignment);
      for (int c = q + 1; c <= e.a; ++c) label(children[c], stage, assignment);
      rebuild_parallel(par, 2, n - e.b - std::max(1, e.c), cap(d2 + 1), assignment, next);
    } else if (e.move == Move::join) {
      rebuild_to_join(branch, k, e.c, d2, e.a, assignment, next);
      rebuild_others(branch, n - e.b - e.c, cap(d2 + 1), assignment, next);
    } else {
      const auto& lead = sorted_[par];
      const int other = lead[0] == branch ? lead[1] : lead[0];
      if (e.e > 0) rebuild_series(branch, k, e.e, cap(d2 + 1), assignment, next);
      rebuild_to_join(other, 0, e.c, d2, e.a, assignment, next);
      rebuild_parallel(par, 2, n - e.b - e.c - e.e, cap(d2 + 1), assignment, next);
    }
    if (e.a + 1 < m) rebuild_series(t, e.a + 1, e.b, d, assignment, next);
  }

  void rebuild_others(int branch, int n, int d, std::vector<int>& assignment, int& next) {
    const int par = parent_[branch];
    if (sorted_[par][0] == branch) {
      rebuild_parallel(par, 1, n, d, assignment, next);
      return;
    }
    others(branch, n, d);  // memoised: the split it chose
    const int n1 = memo_.find(key(kOthers, par, 0, n, d))->a;
    rebuild_solve(sorted_[par][0], n1, d, assignment, next);
    rebuild_parallel(par, 2, n - n1, d, assignment, next);
  }

  void rebuild_to_join(int branch, int i, int n, int d, int e, std::vector<int>& assignment, int& next) {
    const Entry r = branch_to_join(branch, i, n, d, e);
    const auto& items = items_[branch];
    if (r.move == Move::join) {
      const int par = parent_[branch];
      const auto& children = tree_.nodes[parent_[par]].children;
      int stage = take(next, r.b);
      for (std::size_t c = static_cast<std::size_t>(i); c < items.size(); ++c) label(items[c], stage, assignment);
      for (int c = slot_[par] + 1; c <= e; ++c) label(children[c], stage, assignment);
    } else if (r.move == Move::group) {
      int stage = take(next, r.b);
      for (int c = i; c <= r.a; ++c) label(items[c], stage, assignment);
      rebuild_to_join(branch, r.a + 1, n - std::max(1, r.b), d, e, assignment, next);
    } else {
      int rest = branch_to_join(branch, i + 1, n - r.b, d, e).h;
      rebuild_solve(items[i], r.b, d + rest, assignment, next);
      rebuild_to_join(branch, i + 1, n - r.b, d, e, assignment, next);
    }
  }

  void rebuild_parallel(int t, int j, int n, int d, std::vector<int>& assignment, int& next) {
    const auto& branches = sorted_[t];
    if (j == static_cast<int>(branches.size())) return;
    Entry e = parallel(t, j, n, d);
    if (e.move == Move::run) {
      int stage = take(next, e.b);
      for (int q = j; q <= e.a; ++q) label(branches[q], stage, assignment);
      rebuild_parallel(t, e.a + 1, n - std::max(1, e.b), d, assignment, next);
    } else {
      rebuild_solve(branches[j], e.b, d, assignment, next);
      rebuild_parallel(t, j + 1, n - e.b, d, assignment, next);
    }
  }

  const Problem& p_;
  const graph::SPTree& tree_;
  const ReplicaTable* rep_ = nullptr;  // set for replicated problems
  int num_levels_ = 1;                 // replica levels whose counts fit the device budget
  std::vector<double> arena_;          // per-level compute of every Stats (Stats::levels)
  std::vector<double> level_sums_;     // of the group being formed
  std::vector<int> rebuilt_replicas_;  // replica count per label of the last rebuild()
  std::vector<int> stamps_;
  int next_stamp_ = 0;
  int devices_ = 1;
  double target_ = 0.0;
  int probe_id_ = 0;                   // bumped with every target (Stats::probe)
  std::vector<std::vector<graph::NodeId>> leaves_;
  std::vector<Stats> whole_;
  std::vector<int> parent_, slot_;
  std::vector<std::vector<int>> sorted_;
  std::vector<std::vector<int>> items_;  // series items of each parallel node's two largest branches
  std::unordered_map<std::uint64_t, Row> rows_, fork_rows_, join_rows_, close_rows_;
  Memo<std::uint64_t> memo_;
  Memo<std::pair<std::uint64_t, std::uint64_t>> join_memo_;
};

}  // namespace

std::vector<ReplicatedAssignment> graphpipe_plans(const Problem& problem, const graph::SPTree& tree, double tolerance) {
  if (tree.root < 0) return {};
  return Planner(problem, tree).run(tolerance);
}

std::vector<std::vector<int>> graphpipe_assignments(const Problem& problem, const graph::SPTree& tree,
                                                    double tolerance) {
  std::vector<std::vector<int>> plans;
  for (ReplicatedAssignment& plan : graphpipe_plans(problem, tree, tolerance)) plans.push_back(std::move(plan.assignment));
  return plans;
}

std::optional<std::vector<int>> graphpipe_assignment(const Problem& problem, const graph::SPTree& tree,
                                                     double tolerance) {
  auto plans = graphpipe_assignments(problem, tree, tolerance);
  if (plans.empty()) return std::nullopt;
  return std::move(plans.front());
}

}  // namespace graphpipe::partition
