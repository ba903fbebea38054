// The sync kinds the cost model prices, one class each, and their registry (cost/sync_kind.h).
// The arithmetic of each price is documented in cost/sync_cost.h.
#include <cmath>
#include <sstream>

#include "common/error.h"
#include "cost/power_sgd.h"
#include "cost/sync_kind.h"

namespace graphpipe::cost {

namespace {

std::string text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Memory-bound work: `bytes` of traffic over the memory bandwidth, plus `launches` kernels.
double memory_seconds(const Devices& devices, double bytes, double launches) {
  const double traffic = devices.memory_bandwidth > 0.0 ? bytes / devices.memory_bandwidth : 0.0;
  return traffic + launches * devices.op_overhead_seconds;
}

// One collective of `payload` input bytes, priced as `collective`, added to a bucket's cost.
void add(BucketCost& cost, const AllReduceCost& collective, double payload) {
  cost.payload_bytes += payload;
  cost.collectives += 1.0;
  cost.comm_seconds += collective.seconds;
  cost.intra_node_bytes += collective.intra_node_bytes_per_device;
  cost.inter_node_bytes += collective.inter_node_bytes_per_device;
}

// Every step, each gradient bucket summed by one all-reduce.
class AllReduceKind final : public SyncKindModel {
 public:
  std::string_view name() const override { return "all_reduce"; }
  std::vector<std::string_view> aliases() const override { return {"allreduce"}; }
  bool plain_all_reduce() const override { return true; }
  BucketCost price_bucket(const SyncMethod&, const SyncLoad& load, const CollectivePricer& pricer) const override {
    BucketCost cost;
    add(cost, pricer.all_reduce(load.bytes), pricer.all_reduce_payload(load.numel, load.element_size()));
    return cost;
  }
};

// Every `period` steps, the parameters averaged by one all-reduce after the optimizer step.
class LocalSgdKind final : public SyncKindModel {
 public:
  std::string_view name() const override { return "local_sgd"; }
  std::vector<std::string_view> aliases() const override { return {"localsgd"}; }
  bool local_updates() const override { return true; }
  void validate(const SyncMethod& m, const std::string& what) const override {
    if (!(m.period >= 1.0) || !std::isfinite(m.period)) {
      throw PlanningError(what + "period must be a finite number of steps >= 1, got " + std::to_string(m.period));
    }
  }
  std::vector<SyncArgument> arguments(const SyncMethod& m) const override { return {{"period", text(m.period)}}; }
  BucketCost price_bucket(const SyncMethod&, const SyncLoad& load, const CollectivePricer& pricer) const override {
    BucketCost cost;
    add(cost, pricer.all_reduce(load.bytes), load.bytes);
    cost.compute_seconds =
        memory_seconds(pricer.devices(), kAverageTraffic * load.bytes, kAverageLaunches + load.tensors);
    return cost;
  }
};

// Every step, each bucket's k largest entries and their positions all-gathered.
class TopKKind final : public SyncKindModel {
 public:
  std::string_view name() const override { return "top_k"; }
  std::vector<std::string_view> aliases() const override { return {"topk"}; }
  void validate(const SyncMethod& m, const std::string& what) const override {
    if (!(m.ratio > 0.0 && m.ratio <= 1.0)) {
      throw PlanningError(what + "ratio must be in (0, 1], got " + std::to_string(m.ratio));
    }
  }
  std::vector<SyncArgument> arguments(const SyncMethod& m) const override { return {{"ratio", text(m.ratio)}}; }
  BucketCost price_bucket(const SyncMethod& m, const SyncLoad& load, const CollectivePricer& pricer) const override {
    BucketCost cost;
    const double e = load.element_size();
    const double d = static_cast<double>(pricer.replicas());
    // As the runtime computes it: k = ceil(ratio x n) (at least one entry of a non-empty bucket).
    const double k = std::ceil(m.ratio * load.numel);
    // Values and positions packed into one all-gather per bucket.
    const double position = top_k_position_bytes(load.numel);
    add(cost, pricer.all_gather(k * (e + position)), k * (e + position));
    const double traffic = kTopKBucketPasses * load.bytes + k * (e + position) + d * k * (3.0 * e + position);
    cost.compute_seconds = memory_seconds(pricer.devices(), traffic, kTopKBucketLaunches);
    return cost;
  }
};

// Every step, torch's PowerSGD hook: low-rank factors of the matrices worth compressing.
class PowerSgdKind final : public SyncKindModel {
 public:
  std::string_view name() const override { return "power_sgd"; }
  std::vector<std::string_view> aliases() const override { return {"powersgd"}; }
  bool needs_shapes() const override { return true; }
  void validate(const SyncMethod& m, const std::string& what) const override {
    if (m.rank < 1) throw PlanningError(what + "rank must be at least 1, got " + std::to_string(m.rank));
    if (!(m.min_compression_rate > 0.0) || !std::isfinite(m.min_compression_rate)) {
      throw PlanningError(what + "min_compression_rate must be a positive number, got " +
                          std::to_string(m.min_compression_rate));
    }
  }
  std::vector<SyncArgument> arguments(const SyncMethod& m) const override {
    // torch's default rate (PowerSGDState) is left out of the summary.
    return {{"rank", std::to_string(m.rank)},
            {"min_compression_rate", text(m.min_compression_rate), m.min_compression_rate != 2.0}};
  }
  void add_tensor_load(const SyncMethod& m, const graph::ParamShape& tensor, const Devices& devices,
                       SyncLoad& load) const override {
    const PowerSgdMatrix matrix = power_sgd_matrix(tensor.shape, m.rank, m.min_compression_rate);
    if (matrix.compressed) {
      load.p_numel += static_cast<double>(matrix.p_numel());
      load.q_numel += static_cast<double>(matrix.q_numel());
      load.compress_seconds += power_sgd_matrix_seconds(matrix, tensor.element_size, devices);
    } else {
      load.uncompressed_numel += static_cast<double>(tensor.numel());
      load.uncompressed_tensors += 1.0;
    }
  }
  BucketCost price_bucket(const SyncMethod&, const SyncLoad& load, const CollectivePricer& pricer) const override {
    BucketCost cost;
    const double e = load.element_size();
    const double u = load.uncompressed_numel * e, p = load.p_numel * e, q = load.q_numel * e;
    add(cost, pricer.all_reduce(u), u);
    add(cost, pricer.all_reduce(p), p);
    add(cost, pricer.all_reduce(q), q);
    cost.compute_seconds =
        load.compress_seconds + memory_seconds(pricer.devices(), kPowerSgdBucketPasses * load.bytes + 4.0 * u,
                                               kPowerSgdBucketLaunches + load.uncompressed_tensors);
    return cost;
  }
};

}  // namespace

void SyncKindModel::validate(const SyncMethod&, const std::string&) const {}

std::vector<SyncArgument> SyncKindModel::arguments(const SyncMethod&) const { return {}; }

void SyncKindModel::add_tensor_load(const SyncMethod&, const graph::ParamShape&, const Devices&, SyncLoad&) const {}

const SyncKindModel& sync_kind_model(SyncKind kind) {
  static const AllReduceKind all_reduce;
  static const LocalSgdKind local_sgd;
  static const TopKKind top_k;
  static const PowerSgdKind power_sgd;
  switch (kind) {
    case SyncKind::all_reduce:
      return all_reduce;
    case SyncKind::local_sgd:
      return local_sgd;
    case SyncKind::top_k:
      return top_k;
    case SyncKind::power_sgd:
      return power_sgd;
    case SyncKind::end:
      break;
  }
  throw PlanningError("sync method kind " + std::to_string(static_cast<int>(kind)) + " is not a kind");
}

std::vector<SyncKind> all_sync_kinds() {
  std::vector<SyncKind> kinds;
  kinds.reserve(static_cast<std::size_t>(SyncKind::end));
  for (int k = 0; k < static_cast<int>(SyncKind::end); ++k) kinds.push_back(static_cast<SyncKind>(k));
  return kinds;
}

}  // namespace graphpipe::cost
