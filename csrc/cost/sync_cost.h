// sync_cost: what keeping the replicas of a replicated stage in agreement costs per training
// step, for each sync method (cost/sync_method.h; docs/design.md, "Pricing the sync methods").
//
// What ONE replica does for one gradient bucket of n elements of e bytes (cost/gradient_buckets.h
// lays the buckets out as the runtime does; cost/sync_load.h sums what a bucket holds), on a
// stage of d replicas:
//
//   all_reduce  one all-reduce of n e bytes.
//   top_k       k = ceil(ratio x n) entries: one all-gather of their values and positions packed
//               together (k (e + p) bytes, p = 4 for int32 positions, 8 past 2^31 elements,
//               top_k_position_bytes); compute (memory bound): kTopKBucketPasses passes over the
//               bucket's n e bytes (error feedback's add, the magnitudes, the selection, the
//               residual's update, zeroing the result), the k selected entries written
//               (k (e + p)), and the d k gathered entries scatter-added
//               (read value and position, read-modify-write the dense entry: d k (3 e + p)), over
//               the device's memory bandwidth, plus kTopKBucketLaunches kernel launches.
//   power_sgd   the three all-reduces of torch's hook, in its order: the uncompressed tensors
//               (u e bytes), P (sum of rows x r' e) and Q (sum of cols x r' e), issued even when
//               empty (an empty one costs nothing here); compute: the matrices' (power_sgd.h),
//               plus kPowerSgdBucketPasses passes over the bucket (error feedback: add, keep a
//               copy, subtract) and 4 u e bytes (packing the uncompressed tensors and copying them
//               back), plus kPowerSgdBucketLaunches + one per uncompressed tensor launches.
//   local_sgd   nothing per bucket. On a step that averages, one all-reduce of the stage's
//               trained parameter bytes P (torch's average_parameters flattens every parameter
//               into one buffer) after the optimizer step, and kAverageTraffic x P bytes of memory
//               traffic (the flattening, the division, the copy back) plus one launch per tensor
//               and kAverageLaunches. Amortised: 1 / period of that per step.
//
// Every collective runs on the stage's ranks: all-reduces by best_all_reduce (or
// hierarchical_all_reduce when method.hierarchical), all-gathers by ring_all_gather (or
// hierarchical_all_gather), through a CollectivePricer so that the planner's inner loops can put
// their O(1) estimates in the place of the exact group (partition/replicas.h).
//
// SyncCost adds the buckets up in the order the runtime starts them, as if nothing overlapped
// (seconds = compute + communication). The simulator (sim/simulate.h) overlaps them with the
// last backward instead; the planner prices a stage's sync as one bucket holding all of its
// gradients (partition/evaluate.h), which leaves out the per-bucket latencies, as the planner's
// all-reduce always has. A stage of one replica costs nothing. Assumptions are listed in
// docs/design.md; PowerSGD is priced in its steady state (after start_powerSGD_iter, before
// which it is the plain all-reduce).
#pragma once

#include <vector>

#include "cost/all_reduce.h"
#include "cost/devices.h"
#include "cost/sync_load.h"
#include "cost/sync_method.h"
#include "graph/op_graph.h"

namespace graphpipe::cost {

// Documented constants of the compression compute (see above).
inline constexpr double kTopKBucketPasses = 12.0;  // 3 add + 2 magnitudes + 4 selection + 2 residual + 1 zero
inline constexpr double kTopKBucketLaunches = 8.0;
inline constexpr double kPowerSgdBucketPasses = 8.0;  // 3 add + 2 copy + 3 subtract
inline constexpr double kPowerSgdBucketLaunches = 6.0;
inline constexpr double kAverageTraffic = 6.0;  // 2 flatten + 2 divide + 2 copy back
inline constexpr double kAverageLaunches = 2.0;
// Top-k's positions travel packed after the values, as int32 where a bucket's positions fit
// (fewer than 2^31 elements), else int64: the runtime's hook (runtime/topk_hook.cpp) asks this
// function, so the price and the traffic agree by construction.
inline bool top_k_narrow_positions(double numel) { return numel <= 2147483647.0; }
inline double top_k_position_bytes(double numel) { return top_k_narrow_positions(numel) ? 4.0 : 8.0; }

// Prices the collectives of one stage's replicas.
class CollectivePricer {
 public:
  virtual ~CollectivePricer() = default;
  virtual int replicas() const = 0;
  virtual const Devices& devices() const = 0;
  // `bytes`: the input one replica hands over (the buffer for an all-reduce, its own part for
  // an all-gather).
  virtual AllReduceCost all_reduce(double bytes) const = 0;
  virtual AllReduceCost all_gather(double bytes) const = 0;
  // Input bytes one replica hands to the collectives of an all-reduce of `numel` elements of
  // `element_size` bytes: the buffer for a flat all-reduce; hierarchical_all_reduce_payload for
  // the hierarchical one.
  virtual double all_reduce_payload(double numel, double element_size) const { return numel * element_size; }
};

// The hierarchical all-reduce as the runtime runs it (runtime/hierarchical_hook.h) on `nodes`
// nodes of `local` replicas each: an all-to-all inside the node (local x c elements handed over,
// c = ceil(numel / local)), an all-reduce of the c-element chunk across nodes, an all-gather of
// it inside the node; a step is skipped where its group has one rank.
double hierarchical_all_reduce_payload(double numel, double element_size, int local, int nodes);

// The exact prices on a group of ranks of `devices` (the group is checked: PlanningError).
class GroupPricer final : public CollectivePricer {
 public:
  GroupPricer(const Devices& devices, std::vector<int> group, bool hierarchical);
  int replicas() const override { return static_cast<int>(group_.size()); }
  const Devices& devices() const override { return *devices_; }
  AllReduceCost all_reduce(double bytes) const override;
  AllReduceCost all_gather(double bytes) const override;
  double all_reduce_payload(double numel, double element_size) const override;

 private:
  const Devices* devices_;
  std::vector<int> group_;
  bool hierarchical_;
};

// One bucket's work on one replica (for local_sgd: one averaging of the load, not amortised).
struct BucketCost {
  double payload_bytes = 0.0;     // input bytes handed to collectives
  double collectives = 0.0;       // collectives issued
  double compute_seconds = 0.0;   // compression and decompression (local SGD: the averaging's copies)
  double comm_seconds = 0.0;      // the collectives, one after another
  double intra_node_bytes = 0.0;  // bytes this replica sends over intra-node links
  double inter_node_bytes = 0.0;  // and over inter-node links
  double seconds() const { return compute_seconds + comm_seconds; }
};

// One bucket's price: the kind's SyncKindModel::price_bucket (cost/sync_kinds.cpp holds the
// arithmetic above, one class per kind); nothing for fewer than two replicas or an empty bucket.
BucketCost price_bucket(const SyncMethod& method, const SyncLoad& bucket, const CollectivePricer& pricer);

struct SyncCost {
  std::vector<BucketCost> buckets;  // gradient methods: per bucket, in start order; local_sgd: the averaging
  // Per step, per replica (local_sgd: amortised over the period).
  double payload_bytes = 0.0;
  double collectives = 0.0;
  double compute_seconds = 0.0;
  double comm_seconds = 0.0;
  double intra_node_bytes_per_device = 0.0;
  double inter_node_bytes_per_device = 0.0;
  // local_sgd: on a step that averages (period x the figures above); other methods: every step.
  double sync_step_payload_bytes = 0.0;
  double sync_step_seconds = 0.0;
  double seconds() const { return compute_seconds + comm_seconds; }
};

// The method's cost for a stage whose gradients fill `buckets` (local_sgd: their sum is averaged
// as one buffer). Validates the method (PlanningError).
SyncCost price_sync(const SyncMethod& method, const std::vector<SyncLoad>& buckets, const CollectivePricer& pricer);

// The share of the cost of a step that averages (local_sgd: 1 / period) or of every step (1).
double amortisation(const SyncMethod& method);

// price_sync(method, {load}, pricer).seconds() without the bucket list, for the planner's inner
// loops (the method is not validated again).
double single_bucket_seconds(const SyncMethod& method, const SyncLoad& load, const CollectivePricer& pricer);

// The loads of a stage's gradient buckets: `parameters` in the stage module's order laid out as
// the runtime does (gradient_buckets.h). Without shapes (`parameters` empty), `param_bytes` in
// the flat buckets of bucket_sizes (gradient_buckets.h); PowerSGD then throws
// PlanningError (it prices by shape; re-trace the model). `devices` prices PowerSGD's compute.
std::vector<SyncLoad> stage_bucket_loads(const SyncMethod& method, const std::vector<graph::ParamShape>& parameters,
                                         double param_bytes, double bucket_bytes, const Devices& devices);

// price_sync of a stage's buckets on its ranks `group`.
SyncCost stage_sync_cost(const SyncMethod& method, const Devices& devices, const std::vector<int>& group,
                         const std::vector<graph::ParamShape>& parameters, double param_bytes, double bucket_bytes);

// Bytes one replica hands to the sync's collectives per step (what the runtime's counting process
// group measures): price_sync's payload_bytes on `replicas` devices, amortised over the period
// for local_sgd, or on a step that averages with sync_step. No devices are needed: the payload
// does not depend on them. 0 for fewer than two replicas.
// `replicas_per_node` (0: all on one node) matters only to a hierarchical method.
double sync_payload_bytes(const SyncMethod& method, const std::vector<graph::ParamShape>& parameters,
                          double param_bytes, double bucket_bytes, int replicas, bool sync_step = false,
                          int replicas_per_node = 0);

}  // namespace graphpipe::cost
