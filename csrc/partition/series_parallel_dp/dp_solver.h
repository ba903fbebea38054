// The series-parallel DP's solver (graphpipe_dp.h describes the algorithm), internal to this
// folder. Its parts live in their own files:
//   graphpipe_dp.cpp     construction, the search over targets, the public functions;
//   dp_rows.cpp          figures of stage unions (rows grown along a node's children);
//   dp_stage_fit.cpp     whether a stage meets the target and fits, and on how many replicas;
//   dp_recurrences.cpp   solve, series, parallel and others;
//   dp_fork_join.cpp     inside (after a fork stage) and to_join (a branch ending in the join);
//   dp_rebuild.cpp       the plan of the last target solved, from the memo.
// The recurrences are written once for plain and replicated problems: where they place a stage
// they ask replicas_to_fit() or stage_then() (dp_stage_fit.cpp), which answer 1 device or 0 on
// a plain problem and the least replica count on a replicated one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "graph/series_parallel.h"
#include "partition/problem.h"
#include "partition/replicas.h"
#include "partition/series_parallel_dp/dp_memo.h"
#include "partition/series_parallel_dp/dp_steps.h"
#include "partition/series_parallel_dp/graphpipe_dp.h"

namespace graphpipe::partition::series_parallel_dp {

// Rows of stage unions are grown past the target by this factor: the search probes larger
// targets later (galloping, the shallower plans), and a row grown far enough serves them
// without being grown again from its start. Entries past the target change nothing (every
// reader stops at the first union whose compute exceeds the target). 1.5 measured best on the
// 10,000-operator series-parallel benchmark graph (rows regrown ~2x less, DP ~15% faster).
inline constexpr double kGrowMargin = 1.5;

// How many of the nearest probes' depth memos on each side bound() prefetches a key's slot in.
inline constexpr std::size_t kPrefetched = 4;

// The figures of a group of operators as one stage.
struct Stats {
  double compute = 0.0, time = 0.0, static_bytes = 0.0, act_bytes = 0.0;
  // Forward seconds and received tensors' bytes: what activation recomputation runs again and
  // keeps (recompute.h).
  double forward = 0.0, input_bytes = 0.0;
  // Replicated problems only: parameter and crossing bytes, and where the group's compute at
  // every replica level starts in the solver's level arena, followed by its forward at every
  // level (-1: not replicated).
  double params = 0.0, cross_bytes = 0.0;
  std::int64_t levels = -1;
  // Replicated problems: bit l of `meets` says whether level l's replica meets the target of
  // probe `probe` (Solver::need), and of `meets_recomputed` whether it still does with its
  // forward run once more (recompute.h). Those tests depend on neither the devices nor the
  // in-flight count that need() varies, so they are made once per group, level and probe instead
  // of once per need() call; a new probe makes the masks again.
  mutable std::uint64_t meets = 0, meets_recomputed = 0;
  mutable int probe = -1;
  // Where the replica's time at every level, then that time recomputed, start in the solver's
  // level_times_ (-1: not yet timed). They depend on no target: a group is timed once however
  // many probes ask (the timing, sync estimate included, was a third of need()'s instructions).
  mutable std::int64_t times = -1;
};

// The fragments a memo key names (Solver::key).
enum Kind : std::uint64_t { kSolve = 0, kSeries = 1, kParallel = 2, kInside = 3, kToJoin = 4, kOthers = 5, kKinds = 6 };

class Solver {
 public:
  // shortcuts: whether too_few() rules fragments out, and whether memory_free_ drops d
  // (graphpipe_plans).
  Solver(const Problem& p, const graph::SPTree& tree, SearchShortcuts shortcuts = {});
  // The plans of the search with `root_devices` (1..devices()) at the root. Searches on several
  // budgets may run one after another on one Solver: the fragments' depths kept by each bound the
  // next one's probes.
  std::vector<ReplicatedAssignment> run(double tolerance, int root_devices);
  // The most devices a search may give the root: the problem's budget (at most 255).
  int devices() const { return devices_; }

 private:
  struct Row {
    std::vector<Stats> stats;
    bool computed = false;
    bool complete = false;
    double limit = 0.0;
  };
  using Rows = std::unordered_map<std::uint64_t, Row>;

  // ---- search over targets (graphpipe_dp.cpp) ----
  // The least depth at `target` (kInf: infeasible), solving it the first time (rebuilding its
  // plan there only when the search is exact; run() rebuilds the picks of a bounded search).
  int probe(double target);
  // The least feasible target within the tolerance; nullopt when nothing fits at any target.
  std::optional<double> least_target(double tolerance);
  // `least` then, for each shallower depth that can pay off, the least target reaching it.
  std::vector<double> shallower_targets(double least, double tolerance);
  // Which depths bound a probe's fragments (bound()).
  enum class Bounds {
    none,        // an exact probe: every fragment searched
    neighbours,  // the depths at the probed targets on either side (and this probe's are kept)
    own,         // a target probed already: its own depths first, then those; nothing kept
  };
  // Solves `target` from a fresh memo (none, neighbours). With bounds, fragments whose least
  // depth the depths pin down are not searched again (bound()); their memo entries then hold no
  // first move, which the rebuild searches for where the plan needs one (with_move()).
  bool feasible(double target, Bounds bounds);
  // The plan at `target`, probed already: solved again with Bounds::own, which pin every fragment
  // its probe solved, and rebuilt, the rebuild searching the path's fragments for their first
  // moves under the same bounds. Its replica counts in rebuilt_replicas_.
  std::vector<int> rebuild_pinned(double target);
  // target_ set, the memos emptied, the root solved; whether it has a plan.
  bool solve_fresh(double target);
  // lower_ and upper_ as `bounds` gives them for `target`, while it lives: one probe's searches,
  // or a pinned rebuild's solve and rebuild.
  class BoundsInForce {
   public:
    BoundsInForce(Solver& solver, double target, Bounds bounds);
    ~BoundsInForce();
    BoundsInForce(const BoundsInForce&) = delete;
    BoundsInForce& operator=(const BoundsInForce&) = delete;

   private:
    Solver& solver_;
  };
  // The least depths of every fragment solved at the probed targets (the memo of each probe
  // without its moves).
  struct Depths {
    Memo<std::uint64_t, int> main;
    Memo<std::pair<std::uint64_t, std::uint64_t>, int> join;
  };
  // Depth never grows with the target, so a fragment's depth at the target being solved lies
  // between its depths at the nearest probed targets above it (lower_: lower bounds) and below
  // it (upper_: upper bounds) that solved it: a bounded probe solves only the fragments its
  // pinned ones do not cover, so the nearest probe may not have the fragment, and a farther one
  // still bounds it (MMT at paper size on 64 V100s, replicated, micro-batch 8: 0.71 s of DP
  // against 0.95 s with the nearest alone). Sets `low` and `high` to those (1 and kInf where unknown), and
  // returns whether they pin the depth down (equal, or the larger target has no plan either).
  // A search for the fragment may then start from high + 1 as its best so far and stop at a
  // move reaching low: the least depth, and its first move, are the same.
  // `hashed`: the key's hash (Memo::hash), its slots in the nearest memos fetched already
  // (prefetch_bounds()).
  template <class Key, class Table>
  bool bound(const Key& key, std::size_t hashed, Table Depths::*table, int& low, int& high) const {
    low = 1;  // every fragment memoised has at least one stage
    high = kInf;
    for (const Depths* above : lower_) {
      if (const int* d = (above->*table).find(key, hashed)) {
        low = std::max(low, *d);
        break;
      }
    }
    if (low >= kInf) return true;
    for (const Depths* below : upper_) {
      if (const int* d = (below->*table).find(key, hashed)) {
        high = *d;
        break;
      }
    }
    return low == high;
  }
  // The key's slots in this probe's memo and in the nearest probes' depth memos on both sides are
  // fetched at once before any is read: most look-ups end there, and each would otherwise wait for
  // memory in turn (the DP's time goes mostly to look-ups that miss the cache).
  template <class Key, class Table>
  void prefetch_bounds(const Memo<Key, Entry>& memo, std::size_t hashed, Table Depths::*table) const {
    memo.prefetch(hashed);
    for (std::size_t i = 0; i < kPrefetched && i < lower_.size(); ++i) (lower_[i]->*table).prefetch(hashed);
    for (std::size_t i = 0; i < kPrefetched && i < upper_.size(); ++i) (upper_[i]->*table).prefetch(hashed);
  }
  // Where every memoised recurrence starts: the fragment's entry when the memo has it, or the
  // depth its bounds pin it to (memoised without a move); nullopt when it must be searched, with
  // `low` and `high` set for that search. unpin_once_ (set by with_move()) makes the first
  // fragment to start here searched for its move whatever its bounds pin (its sub-fragments
  // may stay pinned).
  template <class Key, class Table>
  std::optional<Entry> settled(Memo<Key, Entry>& memo, const Key& key, Table Depths::*table, int& low, int& high) {
    const bool unpin = std::exchange(unpin_once_, false);
    const std::size_t hashed = Memo<Key, Entry>::hash(key);
    prefetch_bounds(memo, hashed, table);
    if (const Entry* hit = memo.find(key, hashed); hit != nullptr && !(unpin && pinned(*hit))) return *hit;
    if (bound(key, hashed, table, low, high) && !unpin) {
      memo.insert(key, {low, Nothing{}});
      return Entry{low, Nothing{}};
    }
    return std::nullopt;
  }
  // A memoised depth without a move: bound() pinned it.
  static bool pinned(const Entry& e) { return e.depth < kInf && std::holds_alternative<Nothing>(e.step); }
  // The rebuild's look-up: `ask()`, the fragment's recurrence; where its entry was pinned, the
  // fragment is asked again with unpin_once_, so that it is searched for its first move.
  template <class Ask>
  Entry with_move(Ask ask) {
    Entry e = ask();
    if (pinned(e)) {
      unpin_once_ = true;
      e = ask();
      unpin_once_ = false;
    }
    return e;
  }

  // path_, suffix_path_ and item_path_, made once (graphpipe_dp.cpp).
  void paths();

  // ---- rows (dp_rows.cpp) ----
  Stats group(const std::vector<graph::NodeId>& nodes);
  void add_levels(graph::NodeId v);
  std::int64_t store_levels();
  const Row* cached(const Rows& rows, std::uint64_t key) const;
  const std::vector<Stats>& grow(Rows& rows, std::uint64_t key, const std::vector<int>& fixed, std::size_t fixed_begin,
                                 std::size_t fixed_end, const std::vector<int>& items, std::size_t start);
  const std::vector<Stats>& row(int t, int start, const std::vector<int>& items);
  const std::vector<Stats>& fork_row(int t, int i, int q, int branch);
  const std::vector<Stats>& join_row(int branch, int k);
  const std::vector<Stats>& close_row(int branch, int k);

  // ---- stage fit (dp_stage_fit.cpp) ----
  int in_flight(int depth) const { return static_cast<int>(std::min<std::int64_t>(depth, p_.num_micro_batches)); }
  double least_compute(const Stats& s) const { return rep_ ? arena_[s.levels + num_levels_ - 1] : s.compute; }
  bool fits(const Stats& s, int in_flight_count) const;
  bool too_big(const Stats& s) const { return least_compute(s) > target_ || s.static_bytes > p_.memory_limit; }
  int need(const Stats& s, int in_flight_count, int n) const;
  double level_time(const Stats& s, int l) const;
  double level_forward(const Stats& s, int l) const;
  // Stats::times: s's level times, made the first time they are asked for.
  const double* level_times(const Stats& s) const;
  int replicas_to_fit(const Stats& s, int in_flight_count, int n) const;
  // A stage of figures s with `after` stages at least after it (inside the enclosing fragment),
  // then the rest on the devices it leaves, rest(devices) giving the rest's depth. Returns (rest's
  // depth, the stage's replicas), the least replicas whose devices leave the rest a depth at
  // which the stage still fits in memory; (kInf, 0) when none does. More replicas leave the rest
  // fewer devices, so the least that fits is the best. On a plain problem: one device, when the
  // stage fits with the rest's depth after it.
  template <class Rest>
  std::pair<int, int> stage_then(const Stats& s, int n, int d, int after, Rest rest) {
    int r = replicas_to_fit(s, in_flight(d + after + 1), n);
    while (r > 0) {
      const int h = rest(n - r);
      if (h >= kInf) return {kInf, 0};
      const int wider = replicas_to_fit(s, in_flight(d + h + 1), n);
      if (wider == r) return {h, r};
      r = wider;
    }
    return {kInf, 0};
  }

  // ---- recurrences (dp_recurrences.cpp, dp_fork_join.cpp) ----
  int cap(int d) const {
    return static_cast<int>(std::min<std::int64_t>(d, std::min<std::int64_t>(p_.num_micro_batches, 255)));
  }
  static std::uint64_t key(Kind kind, int t, int i, int n, int d) {
    return (((static_cast<std::uint64_t>(t) * kKinds + kind) << 38) | (static_cast<std::uint64_t>(i) << 16) |
            (static_cast<std::uint64_t>(n) << 8) | static_cast<std::uint64_t>(d));
  }
  bool is_parallel(int t) const { return tree_.nodes[t].kind == graph::SPNode::Kind::parallel; }
  bool is_leaf(int t) const { return tree_.nodes[t].kind == graph::SPNode::Kind::leaf; }
  // The other one of the two largest branches of `branch`'s parallel node.
  int other_lead(int branch) const {
    const auto& lead = sorted_[parent_[branch]];
    return lead[0] == branch ? lead[1] : lead[0];
  }

  // min over x in [lo, hi] of max(f(x), g(x)) and its x, for f non-increasing and g
  // non-decreasing in x (two parts sharing devices: more for one is fewer for the other, and
  // depth never grows with devices), by bisection on the crossing: O(log(hi - lo)) calls.
  template <class F, class G>
  static std::pair<int, int> balance(int lo, int hi, F f, G g) {
    if (lo > hi) return {kInf, -1};
    int a = lo, b = hi;
    while (a < b) {
      int mid = a + (b - a) / 2;
      if (f(mid) <= g(mid))
        b = mid;
      else
        a = mid + 1;
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
        if (f(mid) <= v)
          b = mid;
        else
          a = mid + 1;
      }
      if (!visit(a, v)) return;
      r = a - 1;
    }
  }

  // Whether a fragment of `work` device-seconds (work_: the least any replica count gives its
  // operators) cannot meet the target on n devices: every stage's time per micro-batch is at
  // least its operators' compute on one replica, and a stage of r replicas spends r devices, so
  // the fragment's stages need at least work / target devices. Such a fragment is infeasible
  // without being searched: at low targets (the first probes of each search) most of the device
  // splits that balance() and levels() try leave one part too few devices, and each was searched
  // down to its leaves to find no plan. The margin keeps a fragment that exactly fills its
  // devices (its work summed in another order) from being ruled out by rounding.
  bool too_few(double work, int n) const {
    return device_floor_ && work > static_cast<double>(n) * target_ * (1.0 + 1e-9);
  }
  // The least n that is not too_few for `work`: the recurrences search device splits only where
  // each part gets at least that many (outside, one part has no plan, and the part searched
  // first was searched for nothing).
  int least_devices(double work) const {
    if (!device_floor_) return 0;
    int n = static_cast<int>(std::max(0.0, std::floor(work / (target_ * (1.0 + 1e-9)))));
    while (too_few(work, n)) ++n;
    return n;
  }
  // The least depth of a fragment holding a path of operators whose least compute (path_) sums
  // to `path`: the path's operators lie in a chain of stages (stages are convex), and each stage
  // meets the target with at least their least compute in it, so the chain has at least
  // path / target stages. A move that this puts at or below the best so far is skipped
  // unsearched: only a strictly shallower move replaces the best, so the least depth and its
  // first move are the same. At generous targets rows are long, and most of a scan's moves
  // leave a rest too long to beat the best (MMT at paper size onto 64 V100s, replicated).
  int path_depth(double path) const { return path_depth_at(path, target_); }
  // The same at another target than the one being solved (shallower_targets()).
  int path_depth_at(double path, double target) const {
    if (!path_floor_ || !(path > 0.0)) return 0;
    // The margin keeps a path summed in another order than its stages, or taken as a difference
    // of suffix sums, from rounding above them.
    const double stages = std::ceil(path * (1.0 - 1e-6) / target);
    return stages >= kInf ? kInf : static_cast<int>(stages);
  }
  // Of the branches of `branch`'s parallel node other than `branch` (one of the two largest).
  double others_work(int branch) const {
    const int par = parent_[branch];
    const auto& lead = sorted_[par];
    return lead[0] == branch ? suffix_work_[par][1] : work_[lead[0]] + suffix_work_[par][2];
  }
  // Of the fragment after a fork stage holding `branch`'s first k items (inside()).
  double inside_work(int branch, int k) const {
    const int par = parent_[branch];
    return item_work_[branch][k] + others_work(branch) + suffix_work_[parent_[par]][slot_[par] + 1];
  }
  // Of items i.. of `branch` and the series children after its parallel node up to e.
  double to_join_work(int branch, int i, int e) const {
    const int par = parent_[branch];
    const auto& after = suffix_work_[parent_[par]];
    return item_work_[branch][i] + (after[slot_[par] + 1] - after[e + 1]);
  }

  // A fragment's memo key. Sets d to the d its recursion goes on with, which the key holds: 0
  // where the fragment lies in a subtree `owner` where memory never binds (memory_free_), since
  // the stages after it cannot change what fits there; unchanged elsewhere. Every recurrence and
  // rebuild makes its key here, so none can key a fragment by a d it does not recurse with.
  std::uint64_t fragment(Kind kind, int owner, int t, int i, int n, int& d) const {
    if (memory_free_[owner]) d = 0;
    return key(kind, t, i, n, d);
  }

  Entry solve(int t, int n, int d);
  Entry series(int t, int i, int n, int d);
  void series_groups(int t, int i, int n, int d, const std::vector<Stats>& stats, int low, Entry& best);
  void series_split(int t, int i, int n, int d, Entry& best);
  void series_forks(int t, int i, int n, int d, const std::vector<Stats>& stats, int low, Entry& best);
  Entry parallel(int t, int j, int n, int d);
  int others(int branch, int n, int d);
  Entry inside(int branch, int k, int n, int d);
  void inside_open(int branch, int k, int n, int d, Entry& best);
  void inside_join(int branch, int tail, int k, int n, int d, Entry& best);
  void inside_close(int branch, int k, int n, int d, Entry& best);
  Entry branch_to_join(int branch, int i, int n, int d, int e);

  // ---- rebuild (dp_rebuild.cpp) ----
  // The plan of the target last solved (feasible() true), from its memo; its replica counts by
  // label in rebuilt_replicas_.
  std::vector<int> rebuild();
  int take(int& next, int replicas);
  void label(int t, int stage, std::vector<int>& assignment) const;
  void rebuild_solve(int t, int n, int d, std::vector<int>& assignment, int& next);
  void rebuild_series(int t, int i, int n, int d, std::vector<int>& assignment, int& next);
  void rebuild_inside(int branch, int k, int n, int d, std::vector<int>& assignment, int& next);
  void rebuild_others(int branch, int n, int d, std::vector<int>& assignment, int& next);
  void rebuild_to_join(int branch, int i, int n, int d, int e, std::vector<int>& assignment, int& next);
  void rebuild_parallel(int t, int j, int n, int d, std::vector<int>& assignment, int& next);

  const Problem& p_;
  const graph::SPTree& tree_;
  const ReplicaTable* rep_ = nullptr;        // set for replicated problems
  int num_levels_ = 1;                       // replica levels whose counts fit the device budget
  std::vector<double> arena_;                // per-level compute of every Stats (Stats::levels)
  mutable std::vector<double> level_times_;  // per-level time of the Stats timed (Stats::times)
  std::vector<double> level_sums_;           // of the group being formed
  std::vector<int> rebuilt_replicas_;        // replica count per label of the last rebuild()
  std::vector<int> stamps_;
  int next_stamp_ = 0;
  int devices_ = 1;       // the problem's budget: the floors below are made for it
  int root_devices_ = 1;  // the budget of the search under way (run())
  int root_levels_ = 1;   // replica levels whose counts fit root_devices_
  double target_ = 0.0;
  int probe_id_ = 0;  // bumped with every target (Stats::probe)
  std::vector<std::vector<graph::NodeId>> leaves_;
  std::vector<Stats> whole_;
  std::vector<int> parent_, slot_;
  std::vector<std::vector<int>> sorted_;
  std::vector<std::vector<int>> items_;  // series items of each parallel node's two largest branches
  // Device-seconds per micro-batch (too_few), of its operators' operator_work (step_bound.h,
  // over the replica counts within the budget): of each subtree; of each series node's child
  // suffixes i.. (index i, the last entry 0), each parallel node's sorted branch suffixes j.. and
  // each lead branch's item suffixes k.. .
  std::vector<double> work_;
  std::vector<std::vector<double>> suffix_work_;
  std::vector<std::vector<double>> item_work_;  // of items_[b]'s suffixes k.., as suffix_work_
  // The longest path of least compute (an operator's least over the replica levels within the
  // budget) through each subtree: a series node's is its children's summed (every operator of a
  // child reaches every one of the next, graph/series_parallel.h), a parallel node's its
  // branches' longest. Of each series node's child suffixes i.. (the last entry 0) and each lead
  // branch's item suffixes k.. too (path_depth()).
  std::vector<double> path_;
  std::vector<std::vector<double>> suffix_path_, item_path_;
  // Whether every stage made of operators of subtree t fits the memory limit, unrecomputed, with
  // as many micro-batches in flight as a stage can hold (M): the subtree's static bytes plus M x
  // (its operators' activations and every tensor its operators receive) are within the limit. A
  // stage's bytes only grow with the micro-batches in flight, and a stage inside the subtree holds
  // at most those, so there the depth after a fragment (d) changes nothing but the memo key: it
  // is taken as 0, and the states that differed only in d are one. Such subtrees are the small
  // ones, and most states are theirs.
  std::vector<char> memory_free_;
  bool device_floor_ = true;
  Rows rows_, fork_rows_, join_rows_, close_rows_;
  Memo<std::uint64_t, Entry> memo_;
  Memo<std::pair<std::uint64_t, std::uint64_t>, Entry> join_memo_;
  // The search (probe()): the least depth at each probed target (kInf: infeasible; depth never
  // grows with the target), and the plan and replica counts of the targets rebuilt: every
  // feasible one when the search is exact (while its memo is live), else the picks (run()).
  std::map<double, int> seen_;
  std::map<double, std::vector<int>> plan_at_, replicas_at_;
  int probes_ = 0;
  // The depths of every fragment at each probed target (feasible() with exact false), and those
  // bounding the target being solved (bound()): lower_ at the larger targets, upper_ at the
  // smaller ones, nearest first; empty when there is none or the search is exact.
  std::map<double, Depths> depths_;
  std::vector<const Depths*> lower_;
  std::vector<const Depths*> upper_;
  // Whether probes take their bounds from the neighbouring probes (run() turns it off and
  // searches again should an exact solve ever disagree with a bounded one).
  bool bounded_ = true;
  // Whether run() rebuilds the picks from their own probes' depths (Bounds::own) rather than
  // solving them again exactly (SearchShortcuts::pinned_rebuild).
  bool pinned_rebuild_ = true;
  bool unpin_once_ = false;  // see settled()
  bool path_floor_ = true;   // whether path_depth() bounds moves (SearchShortcuts::path_floor)
};

}  // namespace graphpipe::partition::series_parallel_dp
