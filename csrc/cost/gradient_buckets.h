// gradient_buckets: how the gradients of a replicated stage are grouped for their sync.
//
// The runtime (runtime/gradient_buckets.h) sums a replicated stage's gradients in buckets,
// filled with parameters in reverse registration order (roughly the order the backward produces
// their gradients, as DDP does), and starts each bucket's sum as soon as the last backward has
// produced all of its gradients; the simulator prices the same buckets. The sizes are DDP's
// (torch.nn.parallel.DistributedDataParallel after its first iteration): a small first bucket,
// kFirstBucketBytes (1 MiB, torch's dist._DEFAULT_FIRST_BUCKET_BYTES), so that a sum starts
// early in the backward, then buckets of bucket_bytes, by default kDefaultBucketBytes (25 MiB,
// DDP's bucket_cap_mb). Why not small buckets throughout: every collective has a fixed cost, and
// on Gloo CPU ranks, where the collectives' threads share the cores with the backward, 1 MiB
// buckets throughout measured 5-9% slower steps than DDP's sizes (docs/results.md, "Gradient
// buckets of DDP's sizes").
//
// bucket_layout() is the one layout rule: the runtime lays out its tensors with it, and the cost
// model prices what each bucket holds with it (top-k's k and PowerSGD's factors depend on bucket
// contents; gradient_buckets() for parameter shapes). The parameters are walked from last to
// first, skipping those that are not trained; each (dtype, device) has one open bucket; a
// parameter goes into its open bucket unless that bucket already holds its cap or more, in
// which case it opens a new one (so a bucket passes the cap by its last parameter, and a
// parameter larger than the cap is a bucket of its own). The cap of a (dtype, device)'s first
// bucket is first_bucket_cap(bucket_bytes), of the others bucket_bytes; a cap <= 0 puts all of a
// (dtype, device)'s parameters in one bucket. Buckets are listed in the order they were opened, which is
// the order the runtime starts them in. O(P log P) for P parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::cost {

inline constexpr double kDefaultBucketBytes = 25.0 * 1024.0 * 1024.0;
inline constexpr double kFirstBucketBytes = 1024.0 * 1024.0;

// The cap of the first bucket when the others' is `cap`: DDP's first-bucket size, or `cap` when
// that is smaller (or <= 0: one bucket).
inline double first_bucket_cap(double cap) { return cap <= 0.0 ? cap : std::min(kFirstBucketBytes, cap); }

// The sizes of the buckets that hold `bytes` of gradients whose parameter shapes are unknown, in
// start order: a first bucket of up to first_bucket_cap(cap), then the rest in equal buckets of
// at most `cap` (none when there is nothing to sum; one when cap <= 0). The simulator's and the
// planner's figure for a stage without parameter shapes.
inline std::vector<double> bucket_sizes(double bytes, double cap = kDefaultBucketBytes) {
  if (bytes <= 0.0) return {};
  if (cap <= 0.0) return {bytes};
  const double first = std::min(bytes, first_bucket_cap(cap));
  std::vector<double> sizes{first};
  const double rest = bytes - first;
  const int k = static_cast<int>(std::ceil(rest / cap));
  for (int i = 0; i < k; ++i) sizes.push_back(rest / k);
  return sizes;
}

// When each bucket's sum runs, the one timing rule the simulator (its all_reduce and compress
// tasks) and the planner's closed form (exposed_sync_seconds) share. The last backward makes the
// gradients final at an even pace over the bytes, from `backward_start` to `backward_end`:
// bucket k is ready once the buckets up to it are produced (with no bytes at all, at the end).
// A bucket that is compressed (compress_seconds[k] > 0) is compressed after the previous one's
// compression, and its collectives run after the previous bucket's, for comm_seconds[k].
// `bytes`, `compress_seconds` and `comm_seconds` are per bucket, in start order, of one length.
struct BucketSpan {
  double ready = 0.0;
  double compress_start = 0.0, compress_end = 0.0;  // equal to ready when not compressed
  double start = 0.0, end = 0.0;                    // its collectives
};
std::vector<BucketSpan> bucket_spans(double backward_start, double backward_end, const std::vector<double>& bytes,
                                     const std::vector<double>& compress_seconds,
                                     const std::vector<double>& comm_seconds);

// What the rank loses to its buckets' collectives running beside its compute, which goes on
// until `compute_end` (the last backward's end): `loss` (Devices::collective_overlap_loss) times
// the collectives' seconds before it. The simulator pushes the rank's end of the sum back by it
// (sim/simulate.h), the closed form below adds it: the one rule for both. 0 where loss is 0.
double overlap_loss_seconds(const std::vector<BucketSpan>& spans, double compute_end, double loss);

// How far past the end of a backward of `backward` seconds the sum of buckets of `sizes` bytes
// ends (bucket_spans), when each bucket takes its share of `all_reduce` seconds by its bytes,
// plus what the collectives beside the backward cost it (overlap_loss_seconds with `overlap_loss`).
// With no buckets (or no bytes), all of it; never less than the last bucket's share.
double exposed_sync_seconds(double all_reduce, double backward, const std::vector<double>& sizes,
                            double overlap_loss = 0.0);

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
