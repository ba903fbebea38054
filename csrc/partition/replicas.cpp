#include "partition/replicas.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "cost/all_gather.h"
#include "cost/all_reduce.h"

namespace graphpipe::partition {

ReplicaTable::ReplicaTable(const cost::CostModel& model, std::int64_t micro_batch, int max_devices) {
  const graph::OpGraph& g = model.graph();
  max_replicas_ = static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(max_devices, micro_batch)));
  level_of_.assign(max_replicas_ + 1, 0);
  for (int d = 1; d <= max_replicas_; ++d) {
    const std::int64_t rows = shard_rows(micro_batch, d);
    if (rows_.empty() || rows != rows_.back()) {
      replicas_.push_back(d);
      rows_.push_back(rows);
    }
    level_of_[d] = static_cast<int>(rows_.size()) - 1;
  }
  const std::size_t n = g.num_nodes();
  forward_.assign(rows_.size(), std::vector<double>(n));
  backward_.assign(rows_.size(), std::vector<double>(n));
  input_.assign(rows_.size(), std::vector<double>(n));
  weight_.assign(rows_.size(), std::vector<double>(n));
  for (std::size_t l = 0; l < rows_.size(); ++l) {
    for (std::size_t v = 0; v < n; ++v) {
      auto id = static_cast<graph::NodeId>(v);
      forward_[l][v] = model.forward_seconds(id, rows_[l]);
      backward_[l][v] = model.backward_seconds(id, rows_[l]);
      input_[l][v] = model.backward_input_seconds(id, rows_[l]);
      weight_[l][v] = model.backward_weight_seconds(id, rows_[l]);
    }
  }
  // Each algorithm's cost is a sum of per-step maxima of affine functions of the bytes, so it is
  // convex and piecewise affine; the max of its chords' lines through (small, 2 small) and
  // (large, 2 large) equals it at both ends and bounds it from above in between only when one
  // piece dominates. The planner's loops need an O(1) figure; the plan's own figure is exact.
  const double small = 1024.0, large = 1024.0 * 1024.0 * 1024.0;
  all_reduce_.assign(max_replicas_ + 1, {});
  all_gather_.assign(max_replicas_ + 1, {});
  const cost::Devices& devices = model.devices();
  link_bandwidth_ = devices.slowest_link_bandwidth();
  for (int d = 2; d <= std::min(max_replicas_, devices.count); ++d) {
    std::vector<int> group(d);
    std::iota(group.begin(), group.end(), 0);
    auto lines = [&](auto algorithm, std::vector<Line>& out) {
      for (double x : {small, large}) {
        const double a = algorithm(devices, group, x).seconds, b = algorithm(devices, group, 2.0 * x).seconds;
        const double slope = (b - a) / x;
        out.push_back({a - slope * x, slope});
      }
    };
    lines(&cost::ring_all_reduce, all_reduce_[d]);
    lines(&cost::hierarchical_all_reduce, all_reduce_[d]);
    lines(&cost::ring_all_gather, all_gather_[d]);
    lines(&cost::hierarchical_all_gather, all_gather_[d]);
  }
}

double ReplicaTable::chords(const std::vector<Line>& lines, std::size_t first, std::size_t last, double bytes) {
  double best = std::numeric_limits<double>::infinity();
  for (std::size_t i = first; i + 1 < last; i += 2) {
    const double a = lines[i].fixed + lines[i].per_byte * bytes;
    const double b = lines[i + 1].fixed + lines[i + 1].per_byte * bytes;
    best = std::min(best, std::max(a, b));
  }
  return std::max(0.0, best);
}

double ReplicaTable::all_reduce_estimate(int d, double bytes, bool hierarchical) const {
  if (d <= 1 || bytes <= 0.0) return 0.0;
  return chords(all_reduce_[d], hierarchical ? 2 : 0, all_reduce_[d].size(), bytes);
}

double ReplicaTable::all_gather_estimate(int d, double bytes, bool hierarchical) const {
  if (d <= 1 || bytes <= 0.0) return 0.0;
  const auto& lines = all_gather_[d];
  return hierarchical ? chords(lines, 2, lines.size(), bytes)
                      : chords(lines, 0, std::min<std::size_t>(2, lines.size()), bytes);
}

cost::AllReduceCost EstimatePricer::all_reduce(double bytes) const {
  cost::AllReduceCost c;
  c.seconds = table_->all_reduce_estimate(replicas_, bytes, hierarchical_);
  return c;
}

cost::AllReduceCost EstimatePricer::all_gather(double bytes) const {
  cost::AllReduceCost c;
  c.seconds = table_->all_gather_estimate(replicas_, bytes, hierarchical_);
  return c;
}

double ReplicaTable::all_reduce_estimate(int d, double bytes) const { return all_reduce_estimate(d, bytes, false); }

}  // namespace graphpipe::partition
