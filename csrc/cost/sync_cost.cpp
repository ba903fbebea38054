#include "cost/sync_cost.h"

#include <cmath>

#include "common/error.h"
#include "cost/all_gather.h"
#include "cost/gradient_buckets.h"
#include "cost/rings.h"
#include "cost/sync_kind.h"

namespace graphpipe::cost {

GroupPricer::GroupPricer(const Devices& devices, std::vector<int> group, bool hierarchical)
    : devices_(&devices), group_(std::move(group)), hierarchical_(hierarchical) {}

AllReduceCost GroupPricer::all_reduce(double bytes) const {
  return hierarchical_ ? hierarchical_all_reduce(*devices_, group_, bytes) : best_all_reduce(*devices_, group_, bytes);
}

double hierarchical_all_reduce_payload(double numel, double element_size, int local, int nodes) {
  if (local < 1 || nodes < 1) throw PlanningError("hierarchical all-reduce: a group needs nodes with replicas");
  const double c = std::ceil(numel / local);
  const double elements = (local > 1 ? local * c + c : 0.0) + (nodes > 1 ? c : 0.0);
  return elements * element_size;
}

double GroupPricer::all_reduce_payload(double numel, double element_size) const {
  if (!hierarchical_) return numel * element_size;
  const auto nodes = by_node(*devices_, group_);
  // Unequal nodes: the runtime refuses them; the flat all-reduce is what a plan could run.
  if (!equal_nodes(nodes)) return numel * element_size;
  return hierarchical_all_reduce_payload(numel, element_size, static_cast<int>(nodes.begin()->second.size()),
                                         static_cast<int>(nodes.size()));
}

AllReduceCost GroupPricer::all_gather(double bytes) const {
  return hierarchical_ ? hierarchical_all_gather(*devices_, group_, bytes) : ring_all_gather(*devices_, group_, bytes);
}

BucketCost price_bucket(const SyncMethod& method, const SyncLoad& load, const CollectivePricer& pricer) {
  if (pricer.replicas() < 2 || load.tensors <= 0.0) return {};
  return sync_kind_model(method.kind).price_bucket(method, load, pricer);
}

double amortisation(const SyncMethod& method) { return method.local_updates() ? 1.0 / method.period : 1.0; }

double single_bucket_seconds(const SyncMethod& method, const SyncLoad& load, const CollectivePricer& pricer) {
  if (pricer.replicas() < 2) return 0.0;
  return amortisation(method) * price_bucket(method, load, pricer).seconds();
}

SyncCost price_sync(const SyncMethod& method, const std::vector<SyncLoad>& buckets, const CollectivePricer& pricer) {
  method.validate();
  SyncCost cost;
  if (pricer.replicas() < 2) return cost;
  const double weight = amortisation(method);
  if (method.local_updates()) {
    SyncLoad all;
    for (const SyncLoad& b : buckets) all += b;
    cost.buckets.push_back(price_bucket(method, all, pricer));
  } else {
    cost.buckets.reserve(buckets.size());
    for (const SyncLoad& b : buckets) cost.buckets.push_back(price_bucket(method, b, pricer));
  }
  for (const BucketCost& b : cost.buckets) {
    cost.sync_step_payload_bytes += b.payload_bytes;
    cost.sync_step_seconds += b.seconds();
    cost.payload_bytes += weight * b.payload_bytes;
    cost.collectives += weight * b.collectives;
    cost.compute_seconds += weight * b.compute_seconds;
    cost.comm_seconds += weight * b.comm_seconds;
    cost.intra_node_bytes_per_device += weight * b.intra_node_bytes;
    cost.inter_node_bytes_per_device += weight * b.inter_node_bytes;
  }
  return cost;
}

std::vector<SyncLoad> stage_bucket_loads(const SyncMethod& method, const std::vector<graph::ParamShape>& parameters,
                                         double param_bytes, double bucket_bytes, const Devices& devices) {
  std::vector<SyncLoad> loads;
  if (parameters.empty()) {
    if (param_bytes > 0.0 && method.kind == SyncKind::power_sgd) {
      throw PlanningError("PowerSGD is priced by the shapes of the parameters, and this stage's " +
                          std::to_string(static_cast<long long>(param_bytes)) +
                          " parameter bytes come without them (a graph traced before shapes were recorded, or a "
                          "hand-made plan): trace the model again with graphpipe.trace");
    }
    for (double bytes : bucket_sizes(param_bytes, bucket_bytes)) loads.push_back(flat_load(bytes));
    return loads;
  }
  for (const GradientBucket& b : gradient_buckets(parameters, bucket_bytes)) {
    SyncLoad load;
    for (int p : b.parameters) load += tensor_load(method, parameters[p], devices);
    loads.push_back(load);
  }
  return loads;
}

SyncCost stage_sync_cost(const SyncMethod& method, const Devices& devices, const std::vector<int>& group,
                         const std::vector<graph::ParamShape>& parameters, double param_bytes, double bucket_bytes) {
  method.validate();
  const GroupPricer pricer(devices, group, method.hierarchical);
  if (group.size() < 2) return {};
  return price_sync(method, stage_bucket_loads(method, parameters, param_bytes, bucket_bytes, devices), pricer);
}

namespace {

// Prices every collective at nothing: for the payload alone.
class PayloadPricer final : public CollectivePricer {
 public:
  PayloadPricer(int replicas, bool hierarchical, int per_node)
      : replicas_(replicas), hierarchical_(hierarchical), per_node_(per_node) {
    devices_.count = replicas;
  }
  int replicas() const override { return replicas_; }
  const Devices& devices() const override { return devices_; }
  AllReduceCost all_reduce(double) const override { return {}; }
  AllReduceCost all_gather(double) const override { return {}; }
  double all_reduce_payload(double numel, double element_size) const override {
    const int local = per_node_ > 0 ? std::min(per_node_, replicas_) : replicas_;
    if (!hierarchical_ || replicas_ % local != 0) return numel * element_size;
    return hierarchical_all_reduce_payload(numel, element_size, local, replicas_ / local);
  }

 private:
  int replicas_;
  bool hierarchical_;
  int per_node_;
  Devices devices_;  // no throughput or bandwidth: compute prices at 0
};

}  // namespace

double sync_payload_bytes(const SyncMethod& method, const std::vector<graph::ParamShape>& parameters,
                          double param_bytes, double bucket_bytes, int replicas, bool sync_step,
                          int replicas_per_node) {
  method.validate();
  if (replicas < 2) return 0.0;
  const PayloadPricer pricer(replicas, method.hierarchical, replicas_per_node);
  const SyncCost cost =
      price_sync(method, stage_bucket_loads(method, parameters, param_bytes, bucket_bytes, pricer.devices()), pricer);
  return sync_step ? cost.sync_step_payload_bytes : cost.payload_bytes;
}

}  // namespace graphpipe::cost
