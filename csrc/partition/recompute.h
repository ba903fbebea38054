// Activation recomputation: the one rule that decides whether a stage runs recomputed, and what
// it then needs. The evaluation (evaluate.cpp, which every candidate plan goes through) and the
// DPs that prune stages by memory before evaluation (graphpipe_dp, sequential, downset) all call
// it, so a DP's estimate of a stage and that stage's evaluated figures agree.
//
// A stage holding `in_flight` micro-batches needs static + activation x in_flight bytes
// (cost::CostModel::stage_memory), activation being one micro-batch's, received tensors
// included. Recomputed, it keeps only the tensors it receives for each micro-batch in flight and
// holds one micro-batch's activations while its forward runs again inside its backward:
// static + input x in_flight + activation bytes, for one more forward of time (charged to its
// backward, and to the half of a split backward that first uses the activations,
// backward_halves.h). Recomputation is chosen exactly when the stage does not fit the limit
// otherwise and recomputing needs less memory: a stage that fits never pays the extra forward,
// which keeps every plan that fitted before unchanged. At one micro-batch in flight it never
// needs less; for more it does unless all the stage's activations are received tensors.
//
// Both the need and the extra time only grow with in_flight, so "fits within a time target at
// in_flight micro-batches" stays monotone in in_flight, which the DPs' pruning relies on.
#pragma once

#include "cost/cost_model.h"

namespace graphpipe::partition {

struct StageMemory {
  double bytes = 0.0;      // what the stage holds as it will run
  bool recompute = false;  // whether its forward runs again in its backward
  // The time the stage runs beyond its forward, backward and transfers: one more forward when
  // recomputed.
  double extra_seconds(double forward_seconds) const { return recompute ? forward_seconds : 0.0; }
};

// The stage's memory with `in_flight` micro-batches under the per-device `limit` (<= 0: no
// limit, never recomputed). Inline: the DPs call it in their innermost loops.
inline StageMemory stage_memory(double static_bytes, double activation_bytes, double input_bytes, int in_flight,
                                double limit) {
  StageMemory m{cost::CostModel::stage_memory(static_bytes, activation_bytes, in_flight), false};
  if (limit > 0.0 && m.bytes > limit) {
    const double kept = static_bytes + input_bytes * in_flight + activation_bytes;
    if (kept < m.bytes) m = {kept, true};
  }
  return m;
}

// Whether a stage of `seconds` (forward + backward + transfers) and these bytes meets the time
// `target` and fits the limit at `in_flight` micro-batches, recomputed where the rule above says.
inline bool stage_fits(double seconds, double forward_seconds, double static_bytes, double activation_bytes,
                       double input_bytes, int in_flight, double limit, double target) {
  const StageMemory m = stage_memory(static_bytes, activation_bytes, input_bytes, in_flight, limit);
  return m.bytes <= limit && seconds + m.extra_seconds(forward_seconds) <= target;
}

}  // namespace graphpipe::partition
