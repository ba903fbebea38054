// gradient_buckets: how the gradients of a replicated stage are grouped for their all-reduce.
//
// The runtime (runtime/gradient_buckets.h) sums a replicated stage's gradients in buckets of
// about kDefaultBucketBytes, filled with parameters in reverse registration order (roughly the
// order the backward produces their gradients, as DDP does), and starts each bucket's sum as
// soon as the last backward has produced all of its gradients; the simulator prices the same
// buckets. A small first-to-last size keeps the overlap: with one large bucket nothing could
// start before the backward ends. 1 MiB is DDP's first-bucket size.
#pragma once

#include <algorithm>
#include <cmath>

namespace graphpipe::cost {

inline constexpr double kDefaultBucketBytes = 1024.0 * 1024.0;

// How many buckets of at most `cap` bytes hold `bytes` of gradients (at least one when there
// is anything to sum; a single parameter larger than the cap is its own bucket in the runtime).
inline int bucket_count(double bytes, double cap = kDefaultBucketBytes) {
  if (bytes <= 0.0) return 0;
  if (cap <= 0.0) return 1;
  return std::max(1, static_cast<int>(std::ceil(bytes / cap)));
}

}  // namespace graphpipe::cost
