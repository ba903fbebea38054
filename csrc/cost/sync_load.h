// SyncLoad: what a set of gradient tensors (one tensor, a gradient bucket, a whole stage) asks of
// a sync method, as sums over the tensors, so that loads of disjoint sets add up. The pricing
// (cost/sync_cost.h) turns a bucket's load into collectives and compression compute.
//
// Every method needs the bucket's elements and bytes (top-k's k = ceil(ratio x elements) is taken
// per bucket); PowerSGD also needs its split of the tensors into compressed and uncompressed
// ones (cost/power_sgd.h), and the compressed matrices' compute on the given devices, which is a
// sum over matrices because each is compressed on its own. Frozen parameters (requires_grad
// false) have no gradient and load nothing, as the runtime's buckets skip them.
#pragma once

#include <vector>

#include "cost/devices.h"
#include "cost/sync_method.h"
#include "graph/op_graph.h"

namespace graphpipe::cost {

struct SyncLoad {
  double numel = 0.0;  // gradient elements
  double bytes = 0.0;  // their bytes
  double tensors = 0.0;
  // PowerSGD (filled only for power_sgd): elements and tensors all-reduced as they are, elements
  // of the factors P and Q, and the compute of compressing and rebuilding the matrices.
  double uncompressed_numel = 0.0;
  double uncompressed_tensors = 0.0;
  double p_numel = 0.0;
  double q_numel = 0.0;
  double compress_seconds = 0.0;

  // Bytes per element (the bucket's dtype; a mix averages); 4 for an empty load.
  double element_size() const { return numel > 0.0 ? bytes / numel : 4.0; }
  SyncLoad& operator+=(const SyncLoad& other);
  // Every sum times `factor` (the planner's estimate for a part of the graph, replicas.h).
  SyncLoad scaled(double factor) const;
};

// One parameter's gradient. `devices` prices PowerSGD's compression compute.
SyncLoad tensor_load(const SyncMethod& method, const graph::ParamShape& tensor, const Devices& devices);
// A gradient of `bytes` whose shape is unknown: one flat float32 tensor (graphs traced before
// parameter shapes were recorded). PowerSGD cannot be priced without shapes: callers refuse it.
SyncLoad flat_load(double bytes);

}  // namespace graphpipe::cost
