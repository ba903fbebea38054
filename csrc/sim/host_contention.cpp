#include "sim/host_contention.h"

#include <algorithm>
#include <utility>

namespace graphpipe::sim {

std::vector<double> mean_busy_ranks(const std::vector<CpuDemand>& demands, int num_ranks) {
  // Each rank's busy time as disjoint intervals, then the number of busy ranks as a step
  // function with its running integral at every breakpoint.
  std::vector<std::vector<std::pair<double, double>>> busy(num_ranks);
  for (const CpuDemand& d : demands) {
    if (!(d.end > d.start)) continue;
    busy[d.rank].push_back({d.start, d.end});
    if (d.peer >= 0 && d.peer != d.rank) busy[d.peer].push_back({d.start, d.end});
  }
  std::vector<std::pair<double, int>> changes;
  for (auto& intervals : busy) {
    std::sort(intervals.begin(), intervals.end());
    for (std::size_t i = 0; i < intervals.size();) {
      double start = intervals[i].first, end = intervals[i].second;
      for (++i; i < intervals.size() && intervals[i].first <= end; ++i) end = std::max(end, intervals[i].second);
      changes.push_back({start, +1});
      changes.push_back({end, -1});
    }
  }
  std::sort(changes.begin(), changes.end());
  std::vector<double> at;        // breakpoints
  std::vector<double> integral;  // busy-rank seconds from the first breakpoint to each
  std::vector<int> count;        // busy ranks from each breakpoint to the next
  int busy_now = 0;
  for (const auto& [time, delta] : changes) {
    if (!at.empty() && time == at.back()) {
      busy_now += delta;
      count.back() = busy_now;
      continue;
    }
    integral.push_back(at.empty() ? 0.0 : integral.back() + count.back() * (time - at.back()));
    at.push_back(time);
    busy_now += delta;
    count.push_back(busy_now);
  }
  auto integral_to = [&](double t) {
    auto it = std::upper_bound(at.begin(), at.end(), t);
    if (it == at.begin()) return 0.0;
    const std::size_t k = static_cast<std::size_t>(it - at.begin()) - 1;
    return integral[k] + count[k] * (t - at[k]);
  };
  std::vector<double> mean(demands.size(), 0.0);
  for (std::size_t i = 0; i < demands.size(); ++i) {
    const CpuDemand& d = demands[i];
    if (d.end > d.start) mean[i] = (integral_to(d.end) - integral_to(d.start)) / (d.end - d.start);
  }
  return mean;
}

}  // namespace graphpipe::sim
