#include "cost/devices.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "cost/cost_model.h"

namespace graphpipe::cost {

namespace {

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

void require_positive(double value, const char* field) {
  if (!(value > 0.0) || !std::isfinite(value)) {
    throw PlanningError(std::string("devices.") + field + " must be a positive number, found " + number(value));
  }
}

// A figure that may be 0, whose 0 means `zero_means`.
void require_non_negative(double value, const char* field, const char* zero_means) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    throw PlanningError(std::string("devices.") + field + " must be a non-negative number (0: " + zero_means +
                        "), found " + number(value));
  }
}

// A count x count link matrix: bandwidths positive, latencies non-negative (the diagonal, a device
// talking to itself, is not read).
void check_link_matrix(const std::vector<std::vector<double>>& matrix, const char* field, int count, bool bandwidth) {
  if (static_cast<int>(matrix.size()) != count) {
    throw PlanningError(std::string("devices.") + field + " has " + std::to_string(matrix.size()) + " rows for " +
                        std::to_string(count) + " devices");
  }
  for (int a = 0; a < count; ++a) {
    if (static_cast<int>(matrix[a].size()) != count) {
      throw PlanningError(std::string("devices.") + field + "[" + std::to_string(a) + "] has " +
                          std::to_string(matrix[a].size()) + " entries for " + std::to_string(count) + " devices");
    }
    for (int b = 0; b < count; ++b) {
      if (a == b) continue;
      double v = matrix[a][b];
      bool ok = bandwidth ? (v > 0.0 && std::isfinite(v)) : (v >= 0.0 && std::isfinite(v));
      if (!ok) {
        throw PlanningError(std::string("devices.") + field + "[" + std::to_string(a) + "][" + std::to_string(b) +
                            "] must be " + (bandwidth ? "positive" : "non-negative") + ", found " + number(v));
      }
    }
  }
}

}  // namespace

double Devices::flops_for(graph::Precision precision) const {
  double rate = 0.0;
  if (precision == graph::Precision::bfloat16) rate = bfloat16_flops_per_second;
  if (precision == graph::Precision::float16) rate = float16_flops_per_second;
  return rate > 0.0 ? rate : flops_per_second;
}

double Devices::slowest_link_bandwidth() const {
  double slowest = std::numeric_limits<double>::infinity();
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      if (a != b) slowest = std::min(slowest, link_bandwidth[a][b]);
    }
  }
  return std::isinf(slowest) ? 0.0 : slowest;
}

double Devices::slowest_link_latency() const {
  double slowest = 0.0;
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      if (a != b) slowest = std::max(slowest, link_latency[a][b]);
    }
  }
  return slowest;
}

void Devices::validate() const {
  if (count < 1) {
    throw PlanningError("devices.count must be at least 1, found " + std::to_string(count) +
                        ": a plan needs a device to run on");
  }
  require_positive(memory_bytes, "memory_bytes");
  require_positive(flops_per_second, "flops_per_second");
  require_non_negative(bfloat16_flops_per_second, "bfloat16_flops_per_second", "the float32 rate");
  require_non_negative(float16_flops_per_second, "float16_flops_per_second", "the float32 rate");
  require_positive(memory_bandwidth, "memory_bandwidth");
  require_positive(relative_speed, "relative_speed");
  if (!(instruction_overhead_seconds >= 0.0) || !(step_overhead_seconds >= 0.0)) {
    throw PlanningError("devices.instruction_overhead_seconds and step_overhead_seconds must not be negative, found " +
                        number(instruction_overhead_seconds) + " and " + number(step_overhead_seconds));
  }
  for (const auto& [optimizer, seconds] : optimizer_tensor_seconds) {
    // One entry per optimizer as plans name it: an "adamw" entry beside "adam" would be two prices
    // for what the cost model prices as one optimizer.
    if (to_string(parse_optimizer(optimizer)) != optimizer) {
      throw PlanningError("devices.optimizer_tensor_seconds: '" + optimizer + "' is priced as '" +
                          to_string(parse_optimizer(optimizer)) + "'; key its price so");
    }
    require_non_negative(seconds, ("optimizer_tensor_seconds['" + optimizer + "']").c_str(), "not measured");
  }
  if (!(collective_latency_seconds >= 0.0) || !std::isfinite(collective_latency_seconds) ||
      !(collective_bandwidth_bytes_per_second >= 0.0) || !std::isfinite(collective_bandwidth_bytes_per_second)) {
    throw PlanningError(
        "devices.collective_latency_seconds and collective_bandwidth_bytes_per_second must be "
        "non-negative numbers (0: not given), found " +
        number(collective_latency_seconds) + " and " + number(collective_bandwidth_bytes_per_second));
  }
  require_non_negative(collective_overlap_loss, "collective_overlap_loss", "collectives overlap compute for free");
  require_non_negative(rank_skew_fraction, "rank_skew_fraction", "the ranks keep in step");
  if (collective_latency_seconds > 0.0 && !has_collective_link()) {
    throw PlanningError("devices.collective_latency_seconds is " + number(collective_latency_seconds) +
                        " but collective_bandwidth_bytes_per_second is not given: a collective ring step needs both");
  }
  if (extra_tensor_seconds && (!(*extra_tensor_seconds >= 0.0) || !std::isfinite(*extra_tensor_seconds))) {
    throw PlanningError("devices.extra_tensor_seconds must be a non-negative number (or unset), found " +
                        number(*extra_tensor_seconds));
  }
  if (!(op_overhead_seconds >= 0.0)) {
    throw PlanningError("devices.op_overhead_seconds must not be negative, found " + number(op_overhead_seconds));
  }
  check_link_matrix(link_bandwidth, "link_bandwidth", count, true);
  check_link_matrix(link_latency, "link_latency", count, false);
  if (!node.empty()) {
    if (static_cast<int>(node.size()) != count) {
      throw PlanningError("devices.node has " + std::to_string(node.size()) + " entries for " + std::to_string(count) +
                          " devices");
    }
    for (int d = 0; d < count; ++d) {
      if (node[d] < 0) {
        throw PlanningError("devices.node[" + std::to_string(d) + "] must not be negative, found " +
                            std::to_string(node[d]));
      }
    }
  }
}

Devices first_ranks(const Devices& devices, int count) {
  if (count < 1 || count > devices.count) {
    throw PlanningError("first_ranks: " + std::to_string(count) + " ranks of a description of " +
                        std::to_string(devices.count));
  }
  Devices first = devices;
  first.count = count;
  const auto n = static_cast<std::size_t>(count);
  if (first.node.size() > n) first.node.resize(n);
  for (auto* links : {&first.link_bandwidth, &first.link_latency}) {
    if (links->size() > n) links->resize(n);
    for (auto& row : *links) {
      if (row.size() > n) row.resize(n);
    }
  }
  return first;
}

void set_node_links(Devices& devices, int per_node, double intra_bandwidth, double intra_latency,
                    double inter_bandwidth, double inter_latency) {
  if (per_node < 1) throw PlanningError("devices per node must be at least 1, found " + std::to_string(per_node));
  const int n = std::max(devices.count, 0);
  devices.link_bandwidth.assign(n, std::vector<double>(n, intra_bandwidth));
  devices.link_latency.assign(n, std::vector<double>(n, 0.0));
  devices.node.assign(n, 0);
  for (int a = 0; a < n; ++a) devices.node[a] = a / per_node;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      bool same_node = a / per_node == b / per_node;
      devices.link_bandwidth[a][b] = same_node ? intra_bandwidth : inter_bandwidth;
      devices.link_latency[a][b] = same_node ? intra_latency : inter_latency;
    }
  }
}

}  // namespace graphpipe::cost
