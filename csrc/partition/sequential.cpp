#include "partition/sequential.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "partition/group_stats.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Cuts the order into at most `units` contiguous chunks of about equal compute; returns the
// start position of each chunk plus the end.
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

}  // namespace

std::vector<int> sequential_assignment(const Problem& p) {
  const int n = static_cast<int>(p.num_nodes());
  const int max_k = std::max(1, std::min(p.max_stages, n));
  const int budget = std::max(16, static_cast<int>(std::sqrt(4e7 / max_k)));
  const std::vector<int> bounds = chunk_bounds(p, budget);
  const int units = static_cast<int>(bounds.size()) - 1;
  const int K = std::min(max_k, units);
  const auto M = p.num_micro_batches;
  auto in_flight = [&](int k) { return static_cast<int>(std::min<std::int64_t>(k, M)); };

  // f[k][j]: slowest stage of the best chain of exactly k stages covering units j..units-1.
  std::vector<std::vector<double>> f(K + 1, std::vector<double>(units + 1, kInf));
  std::vector<std::vector<int>> cut(K + 1, std::vector<int>(units + 1, -1));
  f[0][units] = 0.0;
  std::vector<int> stamps(p.num_nodes(), -1);
  int stamp = 0;
  // k = 1: the whole suffix as one stage, grown from the back.
  {
    GroupStats suffix(p, stamps, stamp++);
    for (int j = units - 1; j >= 0; --j) {
      for (int i = bounds[j]; i < bounds[j + 1]; ++i) suffix.add(p.order[i]);
      if (K >= 1 && suffix.memory(in_flight(1)) <= p.memory_limit) {
        f[1][j] = suffix.time();
        cut[1][j] = units;
      }
    }
  }
  // The stage counts k that the first segment j..e-1 may still improve. Once the segment's
  // compute reaches f[k][j] no longer segment can lower it (a chain's value is at least its
  // first stage's time, which is at least its compute; compute only grows with e and f[k][j]
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
      for (int k : open) {
        if (!(group.compute < f[k][j])) continue;
        open[kept++] = k;
        double rest = f[k - 1][e];
        if (rest == kInf) continue;
        if (group.memory(in_flight(k)) > p.memory_limit) continue;
        double value = std::max(group.time(), rest);
        if (value < f[k][j]) {
          f[k][j] = value;
          cut[k][j] = e;
        }
      }
      open.resize(kept);
    }
  }
  int best_k = -1;
  for (int k = 1; k <= K; ++k) {
    if (f[k][0] < kInf && (best_k < 0 || f[k][0] < f[best_k][0])) best_k = k;
  }
  if (best_k < 0) return {};
  std::vector<int> assignment(p.num_nodes(), 0);
  int j = 0, label = 0;
  for (int k = best_k; k >= 1; --k, ++label) {
    int e = cut[k][j];
    for (int i = bounds[j]; i < bounds[e]; ++i) assignment[p.order[i]] = label;
    j = e;
  }
  return assignment;
}

}  // namespace graphpipe::partition
