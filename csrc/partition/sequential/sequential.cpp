#include "partition/sequential/sequential.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "partition/evaluate.h"
#include "partition/group_stats.h"
#include "partition/recompute.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/chain_units.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A ceiling on the least slowest stage sequential_assignment's DP can reach: the value the DP
// gives one chain it weighs, `stages` segments of about equal compute along the units, each
// priced as the DP prices a first segment (grown from its start, its in-flight count by the
// stages from it to the end), the last one read from the k = 1 row (grown from the back, as
// there). kInf when a segment does not fit. Every chain at most this slow has no segment whose
// compute exceeds it, so the DP need not grow a segment past it (see the loop over e below).
double equal_compute_chain(const Problem& p, const std::vector<int>& bounds, int stages,
                           const std::vector<std::vector<double>>& f, std::vector<int>& stamps, int& stamp) {
  const int units = static_cast<int>(bounds.size()) - 1;
  if (stages < 2 || stages > units) return kInf;
  std::vector<double> unit_compute(units, 0.0);
  double total = 0.0;
  for (int u = 0; u < units; ++u) {
    for (int i = bounds[u]; i < bounds[u + 1]; ++i) unit_compute[u] += p.compute[p.order[i]];
    total += unit_compute[u];
  }
  // The segments, by the rule that cut the units themselves.
  const std::vector<int> segments = equal_weight_cuts(unit_compute, total, stages);
  double slowest = 0.0;
  for (int made = 0; made + 1 < stages; ++made) {
    GroupStats group(p, stamps, stamp++);
    for (int i = bounds[segments[made]]; i < bounds[segments[made + 1]]; ++i) group.add(p.order[i]);
    const int in_flight = static_cast<int>(std::min<std::int64_t>(stages - made, p.num_micro_batches));
    const StageMemory m = group.memory(in_flight, p.memory_limit);
    if (m.bytes > p.memory_limit) return kInf;
    slowest = std::max(slowest, group.time() + m.extra_seconds(group.forward));
  }
  return std::max(slowest, f[segments[stages - 1]][1]);
}

// The most stages a chain under `cap` may have: at least one, at most one an operator.
int chain_stages(const Problem& p, int cap) { return std::max(1, std::min(cap, static_cast<int>(p.num_nodes()))); }

// No chain at most as slow as a chain the DP weighs has a segment of more compute than that (a
// segment's time is at least its compute), and the plan is such a chain: segments past it are
// not grown. The margin covers rounding in the transfer sums, so that every chain at most that
// slow (the plan's cut among equally fast ones too) is still weighed as before. With several
// caps, the largest of their ceilings: the table then holds, for every cap, every entry that
// cap's own ceiling keeps, with the same value and cut (entries at most a ceiling are exact under
// any larger one), and the others above it, where no cap's plan lies. f's k = 1 row must be set.
double segment_ceiling(const Problem& p, const std::vector<int>& bounds, const std::vector<int>& stage_caps,
                       const std::vector<std::vector<double>>& f, std::vector<int>& stamps, int& stamp) {
  const int units = static_cast<int>(bounds.size()) - 1;
  double ceiling = 0.0;
  for (int cap : stage_caps) {
    const int k_cap = std::min(chain_stages(p, cap), units);
    if (k_cap >= 2) ceiling = std::max(ceiling, equal_compute_chain(p, bounds, k_cap, f, stamps, stamp) * (1.0 + 1e-6));
  }
  return ceiling;
}

// The assignment of the fastest chain of at most `most` stages in sequential_assignment's table
// (f[0][k] the slowest stage of the best chain of k stages, cut[j][k] where its first segment
// from unit j ends): among equally fast chains the one of fewest stages. Empty when no chain fits.
std::vector<int> fastest_chain(const Problem& p, const std::vector<int>& bounds,
                               const std::vector<std::vector<double>>& f, const std::vector<std::vector<int>>& cut,
                               int most) {
  int best_k = -1;
  for (int k = 1; k <= most && k < static_cast<int>(f[0].size()); ++k) {
    if (f[0][k] < kInf && (best_k < 0 || f[0][k] < f[0][best_k])) best_k = k;
  }
  if (best_k < 0) return {};
  std::vector<int> assignment(p.num_nodes(), 0);
  int j = 0, label = 0;
  for (int k = best_k; k >= 1; --k, ++label) {
    const int e = cut[j][k];
    for (int i = bounds[j]; i < bounds[e]; ++i) assignment[p.order[i]] = label;
    j = e;
  }
  return assignment;
}

}  // namespace

std::vector<int> equal_weight_cuts(const std::vector<double>& weights, double total, int parts) {
  const int n = static_cast<int>(weights.size());
  std::vector<int> bounds{0};
  if (parts >= n) {
    for (int i = 1; i <= n; ++i) bounds.push_back(i);
    return bounds;
  }
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += weights[i];
    const int made = static_cast<int>(bounds.size()) - 1;
    const int left_items = n - (i + 1);
    const int left_parts = parts - made - 1;
    const bool full = acc >= total * (made + 1) / parts;
    if ((full || left_items == left_parts) && left_parts > 0 && left_items > 0) bounds.push_back(i + 1);
  }
  bounds.push_back(n);
  return bounds;
}

std::vector<int> chunk_bounds(const Problem& p, int units) {
  std::vector<double> weights(p.order.size());
  for (std::size_t i = 0; i < p.order.size(); ++i) weights[i] = p.compute[p.order[i]];
  return equal_weight_cuts(weights, p.total_compute(), units);
}

int chain_unit_budget(int stages) { return std::max(16, static_cast<int>(std::sqrt(4e7 / std::max(1, stages)))); }

std::vector<int> sequential_assignment(const Problem& p) { return sequential_assignments(p, {p.max_stages}).front(); }

std::vector<std::vector<int>> sequential_assignments(const Problem& p, const std::vector<int>& stage_caps) {
  const int max_k = chain_stages(p, *std::max_element(stage_caps.begin(), stage_caps.end()));
  const std::vector<int> bounds = chunk_bounds(p, chain_unit_budget(max_k));
  const int units = static_cast<int>(bounds.size()) - 1;
  const int K = std::min(max_k, units);
  const auto M = p.num_micro_batches;
  auto in_flight = [&](int k) { return static_cast<int>(std::min<std::int64_t>(k, M)); };

  // f[j][k]: slowest stage of the best chain of exactly k stages covering units j..units-1 (rows
  // by unit: the loop over k reads f[j][.] and f[e][.] contiguously).
  std::vector<std::vector<double>> f(units + 1, std::vector<double>(K + 1, kInf));
  std::vector<std::vector<int>> cut(units + 1, std::vector<int>(K + 1, -1));
  f[units][0] = 0.0;
  std::vector<int> stamps(p.num_nodes(), -1);
  int stamp = 0;
  // k = 1: the whole suffix as one stage, grown from the back.
  {
    GroupStats suffix(p, stamps, stamp++);
    for (int j = units - 1; j >= 0; --j) {
      for (int i = bounds[j]; i < bounds[j + 1]; ++i) suffix.add(p.order[i]);
      const StageMemory m = suffix.memory(in_flight(1), p.memory_limit);
      if (K >= 1 && m.bytes <= p.memory_limit) {
        f[j][1] = suffix.time() + m.extra_seconds(suffix.forward);
        cut[j][1] = units;
      }
    }
  }
  const double ceiling = segment_ceiling(p, bounds, stage_caps, f, stamps, stamp);
  // The stage counts k that the first segment j..e-1 may still improve. Once the segment's
  // compute reaches f[j][k] no longer segment can lower it (a chain's value is at least its
  // first stage's time, which is at least its compute; compute only grows with e and f[j][k]
  // only falls), so k is dropped for good: the inner loop runs over the few k whose best chain
  // is still slower than the segment, instead of all of them for every e.
  std::vector<int> open;
  open.reserve(K);
  for (int j = units - 1; j >= 0; --j) {
    const int k_hi = std::min(K, units - j);
    if (k_hi < 2) continue;
    open.clear();
    for (int k = 2; k <= k_hi; ++k) open.push_back(k);
    GroupStats group(p, stamps, stamp++);
    for (int e = j + 1; e < units && !open.empty(); ++e) {
      for (int i = bounds[e - 1]; i < bounds[e]; ++i) group.add(p.order[i]);
      if (group.static_bytes > p.memory_limit) break;  // grows with e: no longer segment fits
      if (group.compute > ceiling) break;              // grows with e too: no such segment wins
      std::size_t kept = 0;
      double* here = f[j].data();
      const double* after = f[e].data();
      for (int k : open) {
        if (!(group.compute < here[k])) continue;
        open[kept++] = k;
        double rest = after[k - 1];
        if (rest == kInf) continue;
        // Recomputed where it fits only so (recompute.h): slower, never below its compute.
        const StageMemory m = group.memory(in_flight(k), p.memory_limit);
        if (m.bytes > p.memory_limit) continue;
        double value = std::max(group.time() + m.extra_seconds(group.forward), rest);
        if (value < here[k]) {
          here[k] = value;
          cut[j][k] = e;
        }
      }
      open.resize(kept);
    }
  }
  std::vector<std::vector<int>> chains;
  chains.reserve(stage_caps.size());
  for (int cap : stage_caps) chains.push_back(fastest_chain(p, bounds, f, cut, std::min(chain_stages(p, cap), units)));
  return chains;
}

namespace {

constexpr int kNone = 1 << 29;

// The search sequential_replicated runs: over the chunked order's prefix sums and segment
// figures (ChainUnits, shared by all probes), the device-count DP one probe of a target time T
// runs, the binary search over T, and the choice among the stage counts of the last feasible probe.
class ReplicatedChainSearch {
 public:
  explicit ReplicatedChainSearch(const Problem& p)
      : p_(p),
        table_(*p.replicas),
        chain_(p, budget(p)),
        units_(chain_.units()),
        K_(std::min(std::max(1, std::min(p.max_stages, static_cast<int>(p.num_nodes()))), units_)),
        levels_(chain_.levels()),
        usable_(chain_.usable_levels()) {
    segment_times();
    // Rows by unit, so that the inner loop over k reads and writes contiguous memory.
    dev_.assign(units_ + 1, std::vector<int>(K_ + 1, kNone));
    cut_ = lev_ = dev_;
    k_lo_.resize(units_ + 1);
    k_hi_.resize(units_ + 1);
  }

  std::pair<std::vector<int>, std::vector<int>> run(double tolerance) {
    if (!bisect(tolerance)) return {};
    return best_chain();
  }

 private:
  static int budget(const Problem& p) {
    const int max_k = std::max(1, std::min(p.max_stages, static_cast<int>(p.num_nodes())));
    return std::max(16, static_cast<int>(std::sqrt(4e6 / max_k)));
  }
  int in_flight(int k) const { return static_cast<int>(std::min<std::int64_t>(k, p_.num_micro_batches)); }

  double stage_time(int j, int e, int l) const {
    const UnitSegment& s = chain_.segment(j, e);
    return replica_stage_time(p_, l, chain_.compute(l, j, e), s.transfer, s.cross_bytes, s.params);
  }

  // Each segment's time at every level (replica_stage_time, an all-reduce estimate each), which
  // no probe's target changes: computed once here, when that takes at most 64 MB (it does unless
  // max_stages is far below the device count), so that the probes only compare.
  void segment_times() {
    const std::size_t count = chain_.segments() * static_cast<std::size_t>(usable_);
    if (count > (std::size_t{8} << 20)) return;
    times_.resize(count);
    for (int j = 0; j < units_; ++j) {
      for (int e = j + 1; e <= chain_.reach(j); ++e) {
        for (int l = 0; l < usable_; ++l) times_[time_index(j, e, l)] = stage_time(j, e, l);
      }
    }
  }

  // Where segment j..e-1's time at level l lies in times_.
  std::size_t time_index(int j, int e, int l) const {
    return chain_.index(j, e) * static_cast<std::size_t>(usable_) + static_cast<std::size_t>(l);
  }

  // Whether segment j..e-1 at level l meets `target` and fits with `flight` micro-batches, its
  // replicas recomputed where the shared rule says (recompute.h: each holds its shard's
  // activations and received tensors, and runs its shard's forward once more). Monotone in flight.
  bool fits(int j, int e, int l, double target, int flight) const {
    const UnitSegment& s = chain_.segment(j, e);
    const double fraction = chain_.row_fraction(l);
    // Most levels that fail, fail on memory: tell so before loading the segment's times.
    if (stage_memory(s.static_bytes, s.act_bytes * fraction, s.input_bytes * fraction, flight, p_.memory_limit).bytes >
        p_.memory_limit) {
      return false;
    }
    return stage_fits(times_.empty() ? stage_time(j, e, l) : times_[time_index(j, e, l)], chain_.forward(l, j, e),
                      s.static_bytes, s.act_bytes * fraction, s.input_bytes * fraction, flight, p_.memory_limit,
                      target);
  }

  // Least level of segment j..e-1 meeting `target` and fitting with `flight` micro-batches; -1: none.
  int least_level(int j, int e, double target, int flight) const {
    for (int l = 0; l < usable_; ++l) {
      if (fits(j, e, l, target, flight)) return l;
    }
    return -1;
  }

  // dev_[j][k]: fewest devices for units j.. in exactly k stages; cut_ and lev_ to rebuild. The
  // stage counts k with dev_[j][k] < kNone lie in [k_lo_[j], k_hi_[j]] (empty when lo > hi): the
  // loop over k for a first segment j..e-1 visits only those the rest from e can take.
  bool feasible(double target) {
    for (auto& row : dev_) std::fill(row.begin(), row.end(), kNone);
    dev_[units_][0] = 0;
    k_lo_[units_] = k_hi_[units_] = 0;
    for (int j = units_ - 1; j >= 0; --j) {
      k_lo_[j] = K_ + 1;
      k_hi_[j] = 0;
      const int reach = chain_.reach(j);
      for (int e = j + 1; e <= reach; ++e) {
        // The least compute the segment can reach only grows with e: past the target, stop.
        if (chain_.compute(levels_ - 1, j, e) > target) break;
        first_segment(j, e, target);
      }
    }
    for (int k = 1; k <= K_; ++k) {
      if (dev_[0][k] <= p_.device_budget) return true;
    }
    return false;
  }

  // Relaxes dev_[j][k] over the chains whose first stage is segment j..e-1.
  void first_segment(int j, int e, double target) {
    int* here = dev_[j].data();
    const int* after = dev_[e].data();
    const UnitSegment& s = chain_.segment(j, e);
    int base = -1;  // least level at one micro-batch in flight: more in flight only need more
    // k = 1 only for the last segment (e == units), k >= 2 only before it.
    const int k_first = std::max(e == units_ ? 1 : 2, k_lo_[e] + 1);
    const int k_last = std::min({K_, units_ - j, e == units_ ? 1 : k_hi_[e] + 1});
    for (int k = k_first; k <= k_last; ++k) {
      const int rest = after[k - 1];
      if (rest >= kNone) continue;
      if (base < 0) {
        base = least_level(j, e, target, in_flight(1));
        if (base < 0) return;
      }
      int l = base;
      // Level `base` met the target at one micro-batch in flight; at k it still does unless
      // it no longer fits or must recompute (one more forward): then scan again.
      const double fraction = chain_.row_fraction(l);
      const StageMemory m =
          stage_memory(s.static_bytes, s.act_bytes * fraction, s.input_bytes * fraction, in_flight(k), p_.memory_limit);
      if (m.bytes > p_.memory_limit || m.recompute) {
        l = least_level(j, e, target, in_flight(k));
        if (l < 0) return;  // more micro-batches in flight for larger k: none fits either
      }
      const int total = rest + table_.replicas(l);
      if (total < here[k]) {
        here[k] = total;
        cut_[j][k] = e;
        lev_[j][k] = l;
        k_lo_[j] = std::min(k_lo_[j], k);
        k_hi_[j] = std::max(k_hi_[j], k);
      }
    }
  }

  // Bounds on T: the whole order on one device's time (memory permitting), and the total
  // compute spread over every device; then bisection to `tolerance`. Leaves dev_ the DP of the
  // least feasible T found; false when none is (T past 1e12 s).
  bool bisect(double tolerance) {
    const UnitSegment all = chain_.reach(0) == units_ ? chain_.segment(0, units_) : UnitSegment{};
    double hi = chain_.total_compute(0) + all.transfer + 1.0;
    for (int l = 0; l < levels_; ++l)
      hi = std::max(hi, replica_stage_time(p_, l, chain_.total_compute(l), all.transfer, all.cross_bytes, all.params));
    double lo = chain_.total_compute(0) / std::max(1, p_.device_budget);
    while (!feasible(hi)) {
      hi *= 2.0;
      if (hi > 1e12) return false;
    }
    if (feasible(lo)) hi = lo;
    while (hi > lo * (1.0 + tolerance)) {
      const double mid = 0.5 * (lo + hi);
      if (feasible(mid))
        hi = mid;
      else
        lo = mid;
    }
    feasible(hi);
    return true;
  }

  // Of the stage counts within the device budget, the chain of shortest predicted step.
  std::pair<std::vector<int>, std::vector<int>> best_chain() const {
    std::pair<std::vector<int>, std::vector<int>> best;
    double best_step = 0.0, best_bottleneck = 0.0;
    for (int k = 1; k <= K_; ++k) {
      if (dev_[0][k] > p_.device_budget) continue;
      std::vector<int> assignment(p_.num_nodes(), 0), replicas;
      int j = 0;
      for (int left = k; left >= 1; --left) {
        const int e = cut_[j][left];
        for (int i = chain_.bound(j); i < chain_.bound(e); ++i) assignment[p_.order[i]] = k - left;
        replicas.push_back(table_.replicas(lev_[j][left]));
        j = e;
      }
      Evaluation ev = evaluate(p_, assignment, replicas);
      const double step = ev.iteration_seconds(p_);
      if (!ev.fits()) continue;
      if (best.first.empty() || predicted_faster(step, ev.bottleneck, best_step, best_bottleneck)) {
        best = {std::move(assignment), std::move(replicas)};
        best_step = step;
        best_bottleneck = ev.bottleneck;
      }
    }
    return best;
  }

  const Problem& p_;
  const ReplicaTable& table_;
  const ChainUnits chain_;  // the chunked order's prefix sums and segment figures
  const int units_, K_, levels_;
  const int usable_;           // the levels whose replica counts fit the device budget
  std::vector<double> times_;  // by time_index, when segment_times() keeps them
  std::vector<std::vector<int>> dev_, cut_, lev_;
  std::vector<int> k_lo_, k_hi_;
};

}  // namespace

std::pair<std::vector<int>, std::vector<int>> sequential_replicated(const Problem& p, double tolerance) {
  return ReplicatedChainSearch(p).run(tolerance);
}

}  // namespace graphpipe::partition
