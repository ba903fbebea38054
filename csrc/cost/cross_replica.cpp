#include "cost/cross_replica.h"

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/all_reduce.h"

namespace graphpipe::cost {

namespace {

// The loss's all-reduce: one float64.
constexpr double kLossBytes = 8.0;

void require_figure(const char* field, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    throw PlanningError(std::string("CrossReplica.") + field + " must be a finite number >= 0, got " +
                        std::to_string(value));
  }
}

// The replicas' ring as a description of its own: R devices, one per node, of the pipeline's
// kind, joined by the cross-replica link.
Devices replica_ring(const CrossReplica& cross_replica, const Devices& devices) {
  Devices ring = first_ranks(devices, 1);
  ring.count = cross_replica.replicas;
  double bandwidth = cross_replica.link_bandwidth, latency = cross_replica.link_latency;
  if (bandwidth > 0.0) {
    // A link of its own: the pipeline's measured collective figures describe another ring.
    ring.collective_bandwidth_bytes_per_second = 0.0;
    ring.collective_latency_seconds = 0.0;
  } else if (!devices.has_collective_link()) {
    bandwidth = devices.slowest_link_bandwidth();
    latency = devices.slowest_link_latency();
    if (bandwidth <= 0.0) {
      throw PlanningError(
          "CrossReplica: a pipeline of one device, without a measured collective link, says "
          "nothing of the link between replicas; give CrossReplica.link_bandwidth");
    }
  } else {
    bandwidth = devices.collective_bandwidth_bytes_per_second;  // not read: the collective figures price the ring
  }
  set_node_links(ring, 1, bandwidth, latency, bandwidth, latency);
  return ring;
}

}  // namespace

void CrossReplica::validate() const {
  if (replicas < 1) throw PlanningError("CrossReplica.replicas must be at least 1, got " + std::to_string(replicas));
  require_figure("link_bandwidth", link_bandwidth);
  require_figure("link_latency", link_latency);
  require_figure("coordination_seconds", coordination_seconds);
  if (link_latency > 0.0 && link_bandwidth <= 0.0) {
    throw PlanningError(
        "CrossReplica.link_latency is given without link_bandwidth: give both, or neither to take "
        "the devices' link");
  }
}

double cross_replica_seconds(const CrossReplica& cross_replica, const Devices& devices, double gradient_bytes) {
  cross_replica.validate();
  if (!cross_replica.enabled()) return 0.0;
  const Devices ring = replica_ring(cross_replica, devices);
  std::vector<int> group(static_cast<std::size_t>(cross_replica.replicas));
  std::iota(group.begin(), group.end(), 0);
  return ring_all_reduce(ring, group, gradient_bytes).seconds + ring_all_reduce(ring, group, kLossBytes).seconds;
}

}  // namespace graphpipe::cost
