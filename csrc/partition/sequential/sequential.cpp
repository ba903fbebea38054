#include "partition/sequential/sequential.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "partition/evaluate.h"
#include "partition/group_stats.h"
#include "partition/recompute.h"
#include "partition/replica_allocation.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

std::vector<int> chunk_bounds(const Problem& p, int units) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<int> bounds{0};
  if (units >= n) {
    for (int i = 1; i <= n; ++i) bounds.push_back(i);
    return bounds;
  }
  const double total = p.total_compute();
  double acc = 0.0;
  for (int i = 0; i < n; ++i) {
    acc += p.compute[p.order[i]];
    int made = static_cast<int>(bounds.size()) - 1;
    int left_nodes = n - (i + 1);
    int left_chunks = units - made - 1;
    bool full = acc >= total * (made + 1) / units;
    if ((full || left_nodes == left_chunks) && left_chunks > 0 && left_nodes > 0) bounds.push_back(i + 1);
  }
  bounds.push_back(n);
  return bounds;
}

std::vector<int> sequential_assignment(const Problem& p) {
  const int n = static_cast<int>(p.num_nodes());
  const int max_k = std::max(1, std::min(p.max_stages, n));
  const int budget = std::max(16, static_cast<int>(std::sqrt(4e7 / max_k)));
  const std::vector<int> bounds = chunk_bounds(p, budget);
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
  int best_k = -1;
  for (int k = 1; k <= K; ++k) {
    if (f[0][k] < kInf && (best_k < 0 || f[0][k] < f[0][best_k])) best_k = k;
  }
  if (best_k < 0) return {};
  std::vector<int> assignment(p.num_nodes(), 0);
  int j = 0, label = 0;
  for (int k = best_k; k >= 1; --k, ++label) {
    int e = cut[j][k];
    for (int i = bounds[j]; i < bounds[e]; ++i) assignment[p.order[i]] = label;
    j = e;
  }
  return assignment;
}

namespace {

// Figures of every segment units[j..e) of the chunked order, shared by all probes.
struct Segment {
  double transfer = 0.0, cross_bytes = 0.0, params = 0.0, static_bytes = 0.0, act_bytes = 0.0;
  double input_bytes = 0.0;  // received tensors' bytes: what a recomputed replica keeps (recompute.h)
  std::size_t times = 0;  // where its replica_stage_time at each level starts in `times`
};

}  // namespace

std::pair<std::vector<int>, std::vector<int>> sequential_replicated(const Problem& p, double tolerance) {
  const ReplicaTable& table = *p.replicas;
  const int n = static_cast<int>(p.num_nodes());
  const int max_k = std::max(1, std::min(p.max_stages, n));
  const int budget = std::max(16, static_cast<int>(std::sqrt(4e6 / max_k)));
  const std::vector<int> bounds = chunk_bounds(p, budget);
  const int units = static_cast<int>(bounds.size()) - 1;
  const int K = std::min(max_k, units);
  const int levels = table.num_levels();
  const auto M = p.num_micro_batches;
  auto in_flight = [&](int k) { return static_cast<int>(std::min<std::int64_t>(k, M)); };
  // Compute and forward of units [0, u) at each level: a segment's is a difference. The forward
  // is what a recomputed replica runs again (level 0 as evaluate() takes it: the problem's own).
  std::vector<std::vector<double>> prefix(levels, std::vector<double>(units + 1, 0.0)), forward = prefix;
  for (int l = 0; l < levels; ++l) {
    for (int u = 0; u < units; ++u) {
      double c = 0.0, f = 0.0;
      for (int i = bounds[u]; i < bounds[u + 1]; ++i) {
        c += table.compute(l, p.order[i]);
        f += l == 0 ? p.forward[p.order[i]] : table.forward(l, p.order[i]);
      }
      prefix[l][u + 1] = prefix[l][u] + c;
      forward[l][u + 1] = forward[l][u] + f;
    }
  }
  // seg[j][e - j - 1] for segment j..e-1, grown until its static memory alone overflows.
  int usable = 0;  // the levels whose replica counts fit the device budget
  while (usable < levels && table.replicas(usable) <= p.device_budget) ++usable;
  std::vector<std::vector<Segment>> seg(units);
  std::size_t count = 0;
  {
    std::vector<int> stamps(p.num_nodes(), -1);
    for (int j = 0; j < units; ++j) {
      GroupStats g(p, stamps, j);
      for (int e = j + 1; e <= units; ++e) {
        for (int i = bounds[e - 1]; i < bounds[e]; ++i) g.add(p.order[i]);
        if (g.static_bytes > p.memory_limit) break;
        seg[j].push_back({g.transfer, g.cross_bytes, g.params, g.static_bytes, g.act_bytes, g.input_bytes, count});
        count += static_cast<std::size_t>(usable);
      }
    }
  }
  // Each segment's time at every level (replica_stage_time, an all-reduce estimate each), which
  // no probe's target changes: computed once here, when that takes at most 64 MB (it does unless
  // max_stages is far below the device count), so that the probes only compare.
  auto stage_time = [&](int j, int e, int l) {
    const Segment& s = seg[j][e - j - 1];
    return replica_stage_time(p, l, prefix[l][e] - prefix[l][j], s.transfer, s.cross_bytes, s.params);
  };
  std::vector<double> times;
  if (count <= (std::size_t{8} << 20)) {
    times.resize(count);
    for (int j = 0; j < units; ++j) {
      for (int e = j + 1; e <= j + static_cast<int>(seg[j].size()); ++e) {
        for (int l = 0; l < usable; ++l) times[seg[j][e - j - 1].times + l] = stage_time(j, e, l);
      }
    }
  }
  std::vector<double> fraction(usable);
  for (int l = 0; l < usable; ++l) fraction[l] = table.row_fraction(l);
  // Whether segment j..e-1 at level l meets `target` and fits with `flight` micro-batches, its
  // replicas recomputed where the shared rule says (recompute.h: each holds its shard's
  // activations and received tensors, and runs its shard's forward once more). Monotone in flight.
  auto fits = [&](int j, int e, int l, double target, int flight) {
    const Segment& s = seg[j][e - j - 1];
    // Most levels that fail, fail on memory: tell so before loading the segment's times.
    if (stage_memory(s.static_bytes, s.act_bytes * fraction[l], s.input_bytes * fraction[l], flight, p.memory_limit)
            .bytes > p.memory_limit) {
      return false;
    }
    return stage_fits(times.empty() ? stage_time(j, e, l) : times[s.times + l], forward[l][e] - forward[l][j],
                      s.static_bytes, s.act_bytes * fraction[l], s.input_bytes * fraction[l], flight, p.memory_limit,
                      target);
  };
  // Least level of segment j..e-1 meeting `target` and fitting with `flight` micro-batches; -1: none.
  auto least_level = [&](int j, int e, double target, int flight) {
    for (int l = 0; l < usable; ++l) {
      if (fits(j, e, l, target, flight)) return l;
    }
    return -1;
  };
  constexpr int kNone = 1 << 29;
  // dev[j][k]: fewest devices for units j.. in exactly k stages; cut and level to rebuild. Rows
  // by unit, so that the inner loop over k reads and writes contiguous memory.
  std::vector<std::vector<int>> dev(units + 1, std::vector<int>(K + 1, kNone)), cut = dev, lev = dev;
  // The stage counts k with dev[j][k] < kNone lie in [k_lo[j], k_hi[j]] (empty when lo > hi): the
  // loop over k for a first segment j..e-1 visits only those the rest from e can take.
  std::vector<int> k_lo(units + 1), k_hi(units + 1);
  auto feasible = [&](double target) {
    for (auto& row : dev) std::fill(row.begin(), row.end(), kNone);
    dev[units][0] = 0;
    k_lo[units] = k_hi[units] = 0;
    for (int j = units - 1; j >= 0; --j) {
      k_lo[j] = K + 1;
      k_hi[j] = 0;
      const int reach = j + static_cast<int>(seg[j].size());
      int* here = dev[j].data();
      for (int e = j + 1; e <= reach; ++e) {
        // The least compute the segment can reach only grows with e: past the target, stop.
        if (prefix[levels - 1][e] - prefix[levels - 1][j] > target) break;
        const int* after = dev[e].data();
        const Segment& s = seg[j][e - j - 1];
        int base = -1;  // least level at one micro-batch in flight: more in flight only need more
        // k = 1 only for the last segment (e == units), k >= 2 only before it.
        const int k_first = std::max(e == units ? 1 : 2, k_lo[e] + 1);
        const int k_last = std::min({K, units - j, e == units ? 1 : k_hi[e] + 1});
        for (int k = k_first; k <= k_last; ++k) {
          const int rest = after[k - 1];
          if (rest >= kNone) continue;
          if (base < 0) {
            base = least_level(j, e, target, in_flight(1));
            if (base < 0) break;
          }
          int l = base;
          // Level `base` met the target at one micro-batch in flight; at k it still does unless
          // it no longer fits or must recompute (one more forward): then scan again.
          const StageMemory m = stage_memory(s.static_bytes, s.act_bytes * fraction[l], s.input_bytes * fraction[l],
                                             in_flight(k), p.memory_limit);
          if (m.bytes > p.memory_limit || m.recompute) {
            l = least_level(j, e, target, in_flight(k));
            if (l < 0) break;  // more micro-batches in flight for larger k: none fits either
          }
          const int total = rest + table.replicas(l);
          if (total < here[k]) {
            here[k] = total;
            cut[j][k] = e;
            lev[j][k] = l;
            k_lo[j] = std::min(k_lo[j], k);
            k_hi[j] = std::max(k_hi[j], k);
          }
        }
      }
    }
    for (int k = 1; k <= K; ++k) {
      if (dev[0][k] <= p.device_budget) return true;
    }
    return false;
  };
  // Bounds on T: the whole order on one device's time (memory permitting), and the total
  // compute spread over every device.
  double hi = 0.0;
  {
    const Segment& all = seg[0].size() == static_cast<std::size_t>(units) ? seg[0][units - 1] : Segment{};
    hi = prefix[0][units] + all.transfer + 1.0;
    for (int l = 0; l < levels; ++l) hi = std::max(hi, replica_stage_time(p, l, prefix[l][units], all.transfer, all.cross_bytes, all.params));
  }
  double lo = prefix[0][units] / std::max(1, p.device_budget);
  while (!feasible(hi)) {
    hi *= 2.0;
    if (hi > 1e12) return {};
  }
  if (feasible(lo)) hi = lo;
  while (hi > lo * (1.0 + tolerance)) {
    const double mid = 0.5 * (lo + hi);
    if (feasible(mid)) hi = mid; else lo = mid;
  }
  feasible(hi);
  std::pair<std::vector<int>, std::vector<int>> best;
  double best_step = 0.0, best_bottleneck = 0.0;
  for (int k = 1; k <= K; ++k) {
    if (dev[0][k] > p.device_budget) continue;
    std::vector<int> assignment(p.num_nodes(), 0), replicas;
    int j = 0;
    for (int left = k; left >= 1; --left) {
      const int e = cut[j][left];
      for (int i = bounds[j]; i < bounds[e]; ++i) assignment[p.order[i]] = k - left;
      replicas.push_back(table.replicas(lev[j][left]));
      j = e;
    }
    Evaluation ev = evaluate(p, assignment, replicas);
    const double step = ev.iteration_seconds(p);
    if (!ev.fits()) continue;
    if (best.first.empty() || predicted_faster(step, ev.bottleneck, best_step, best_bottleneck)) {
      best = {std::move(assignment), std::move(replicas)};
      best_step = step;
      best_bottleneck = ev.bottleneck;
    }
  }
  return best;
}

}  // namespace graphpipe::partition
