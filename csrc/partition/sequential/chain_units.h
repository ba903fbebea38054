// ChainUnits: the figures of a topological order cut into units (chunk_bounds, sequential.h) that
// PipeDream's planner (pipedream.h) reads, priced as the evaluation prices a chain's stage.
//
//   - per replica level (replicas.h), the prefix sums of compute and forward (what a recomputed
//     replica runs again) over the units, so that a segment's is a difference; level 0 is the
//     problem's own figures, as evaluate() takes them (the table's level 0 is the same cost
//     model at the same rows, so the two agree);
//   - for every segment units[j..e), its GroupStats figures (group_stats.h), grown from each j
//     until the segment's static memory alone overflows the memory limit: static memory only
//     grows with e, so no longer segment from j fits either; on a chain (Problem::chain), with
//     the tensors it relays (produced before j, consumed at e or later) added as the evaluation
//     charges them: received and sent on (two crossings each) and held as activations and as
//     received bytes (what recomputation keeps);
//   - the levels whose replica counts fit the device budget, and each one's row fraction (what a
//     replica's activations and received bytes scale by).
// Building it is O(levels x V + U x (V + E)) for U units.
#pragma once

#include <cstddef>
#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

// A segment units[j..e) of the order: what its stage time and memory need, whatever its level.
struct UnitSegment {
  double transfer = 0.0, cross_bytes = 0.0, params = 0.0, static_bytes = 0.0, act_bytes = 0.0;
  double input_bytes = 0.0;  // received tensors' bytes: what a recomputed replica keeps (recompute.h)
  int crossings = 0;         // edges with exactly one end inside (each pays a link latency)
};

class ChainUnits {
 public:
  // problem.order cut into at most `max_units` units; needs problem.replicated(). `relays`
  // false leaves a chain's relays out of the segments (PipeDream's own pricing, which knows no
  // skip tensors).
  ChainUnits(const Problem& problem, int max_units, bool relays = true);

  int units() const { return units_; }
  // The order position where unit u starts, u = 0..units() (the last: the order's length).
  int bound(int u) const { return bounds_[u]; }
  int levels() const { return static_cast<int>(compute_.size()); }
  // The levels 0..usable_levels()-1 have replica counts within the device budget.
  int usable_levels() const { return usable_; }
  double row_fraction(int level) const { return fraction_[level]; }

  // Compute and forward seconds of units j..e-1 at `level`.
  double compute(int level, int j, int e) const { return compute_[level][e] - compute_[level][j]; }
  double forward(int level, int j, int e) const { return forward_[level][e] - forward_[level][j]; }
  // Compute of the whole order at `level`.
  double total_compute(int level) const { return compute_[level][units_]; }

  // The segments from j that fit are units j..e-1 for e = j + 1 .. reach(j).
  int reach(int j) const { return j + static_cast<int>(seg_[j].size()); }
  const UnitSegment& segment(int j, int e) const { return seg_[j][e - j - 1]; }
  // Segments numbered 0..segments()-1, by j and then e: for tables with one entry per segment.
  std::size_t index(int j, int e) const { return first_[j] + static_cast<std::size_t>(e - j - 1); }
  std::size_t segments() const { return first_[units_]; }

 private:
  struct Relay {
    double bytes = 0.0;
    int edges = 0;
  };
  void prefix_sums(const Problem& p);
  // [j][e]: the operator edges a chain relays through a segment units[j..e) (none off a chain).
  std::vector<std::vector<Relay>> relays(const Problem& p) const;
  void grow_segments(const Problem& p, bool relays);

  std::vector<int> bounds_;
  int units_ = 0, usable_ = 0;
  std::vector<std::vector<double>> compute_, forward_;  // [level][u]: units [0, u)
  std::vector<std::vector<UnitSegment>> seg_;           // seg_[j][e - j - 1]
  std::vector<std::size_t> first_;                      // index(j, j + 1), then the count
  std::vector<double> fraction_;                        // by usable level
};

}  // namespace graphpipe::partition
