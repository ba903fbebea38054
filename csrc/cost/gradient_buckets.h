// gradient_buckets: how the gradients of a replicated stage are grouped for their sync.
//
// The runtime (runtime/gradient_buckets.h) sums a replicated stage's gradients in buckets of
// about kDefaultBucketBytes, filled with parameters in reverse registration order (roughly the
// order the backward produces their gradients, as DDP does), and starts each bucket's sum as
// soon as the last backward has produced all of its gradients; the simulator prices the same
// buckets. A small first-to-last size keeps the overlap: with one large bucket nothing could
// start before the backward ends. 1 MiB is DDP's first-bucket size.
//
// bucket_layout() is the one layout rule: the runtime lays out its tensors with it, and the cost
// model prices what each bucket holds with it (top-k's k and PowerSGD's factors depend on bucket
// contents; gradient_buckets() for parameter shapes). The parameters are walked from last to
// first, skipping those that are not trained; each (dtype, device) has one open bucket; a
// parameter goes into its open bucket unless that bucket already holds bucket_bytes or more, in
// which case it opens a new one (so a bucket passes the cap by its last parameter, and a
// parameter larger than the cap is a bucket of its own); a cap <= 0 puts all of a (dtype,
// device)'s parameters in one bucket. Buckets are listed in the order they were opened, which is
// the order the runtime starts them in. O(P log P) for P parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::cost {

inline constexpr double kDefaultBucketBytes = 1024.0 * 1024.0;

// How many buckets of at most `cap` bytes hold `bytes` of gradients (at least one when there
// is anything to sum). The simulator's figure for a stage whose parameter shapes are unknown.
inline int bucket_count(double bytes, double cap = kDefaultBucketBytes) {
  if (bytes <= 0.0) return 0;
  if (cap <= 0.0) return 1;
  return std::max(1, static_cast<int>(std::ceil(bytes / cap)));
}

struct GradientBucket {
  std::string dtype;
  int element_size = 4;
  std::int64_t numel = 0;
  std::vector<int> parameters;  // indices into the parameter list, in the bucket's order
  double bytes() const { return static_cast<double>(numel) * element_size; }
};

// One parameter as the layout sees it. Parameters of different dtypes or devices never share a
// bucket (the planner, which does not place tensors, leaves device empty).
struct BucketEntry {
  std::string dtype;
  std::string device;
  int element_size = 4;
  std::int64_t numel = 0;
  bool trained = true;
};

// The buckets of `parameters` (in the stage module's registration order); GradientBucket::dtype
// is the bucket's entries' dtype, GradientBucket::parameters index `parameters`.
std::vector<GradientBucket> bucket_layout(const std::vector<BucketEntry>& parameters, double bucket_bytes);

// The runtime's buckets of `parameters` (in the stage module's registration order).
std::vector<GradientBucket> gradient_buckets(const std::vector<graph::ParamShape>& parameters,
                                             double bucket_bytes = kDefaultBucketBytes);

}  // namespace graphpipe::cost
