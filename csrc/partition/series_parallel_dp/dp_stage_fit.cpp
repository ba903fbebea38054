// The series-parallel DP's stage test (dp_solver.h): whether a stage meets the probe's target
// and fits in memory, and on how many replicas. The one place where plain and replicated
// problems differ: replicas_to_fit() answers 1 or 0 devices on a plain problem, the least
// replica count on a replicated one, and the recurrences use only it (and stage_then, built on it).
#include <bit>

#include "partition/recompute.h"
#include "partition/replica_allocation.h"
#include "partition/series_parallel_dp/dp_solver.h"

namespace graphpipe::partition::series_parallel_dp {

// Whether a stage of figures s meets the target and fits with `in_flight_count` micro-batches,
// recomputed where it fits only so (recompute.h; then its time has the forward once more).
// Monotone in in_flight_count, as the recurrences assume.
bool Solver::fits(const Stats& s, int in_flight_count) const {
  return stage_fits(s.time, s.forward, s.static_bytes, s.act_bytes, s.input_bytes, in_flight_count, p_.memory_limit,
                    target_);
}

int Solver::replicas_to_fit(const Stats& s, int in_flight_count, int n) const {
  if (rep_) return need(s, in_flight_count, n);
  return n >= 1 && fits(s, in_flight_count) ? 1 : 0;
}

// Replicated problems: the least replica count, at most n, with which a stage of figures s
// meets the target and fits with `in_flight_count` micro-batches, recomputed where the shared
// rule says (recompute.h; a replica holds its shard's activations and received tensors, and
// recomputed runs its shard's forward once more; replica_allocation.h says how a replica is
// timed); 0 when none does. Grows with in_flight_count (the rule is monotone in it).
int Solver::need(const Stats& s, int in_flight_count, int n) const {
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
    const double* times = level_times(s);
    for (int l = 0; l < num_levels_; ++l) {
      if (times[l] <= target_) mask |= std::uint64_t{1} << l;
      if (times[num_levels_ + l] <= target_) recomputed |= std::uint64_t{1} << l;
    }
    s.meets = mask;
    s.meets_recomputed = recomputed;
    s.probe = probe_id_;
  }
  // The scan above, over the levels that meet the target only (ascending): stage_fits with its
  // time test read from the masks.
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
double Solver::level_time(const Stats& s, int l) const {
  const double compute = l == 0 ? s.compute : arena_[s.levels + l];
  return replica_stage_time(p_, l, compute, s.time - s.compute, s.cross_bytes, s.params);
}

const double* Solver::level_times(const Stats& s) const {
  if (s.times < 0) {
    s.times = static_cast<std::int64_t>(level_times_.size());
    for (int l = 0; l < num_levels_; ++l) level_times_.push_back(level_time(s, l));
    for (int l = 0; l < num_levels_; ++l) {
      level_times_.push_back(level_times_[s.times + l] + StageMemory{0.0, true}.extra_seconds(level_forward(s, l)));
    }
  }
  return &level_times_[s.times];
}

double Solver::level_forward(const Stats& s, int l) const {
  return l == 0 ? s.forward : arena_[s.levels + num_levels_ + l];
}

}  // namespace graphpipe::partition::series_parallel_dp
