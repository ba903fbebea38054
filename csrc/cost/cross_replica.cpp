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
// kind, joined by the cross-replica link (explicit: with_link's).
Devices replica_ring(const CrossReplica& linked, const Devices& devices) {
  Devices ring = first_ranks(devices, 1);
  ring.count = linked.replicas;
  ring.collective_bandwidth_bytes_per_second = 0.0;  // the ring's link is the one given
  ring.collective_latency_seconds = 0.0;
  set_node_links(ring, 1, linked.link_bandwidth, linked.link_latency, linked.link_bandwidth, linked.link_latency);
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

CrossReplica with_link(const CrossReplica& cross_replica, const Devices& devices) {
  cross_replica.validate();
  CrossReplica linked = cross_replica;
  if (!cross_replica.enabled() || cross_replica.link_bandwidth > 0.0) return linked;
  if (devices.has_collective_link()) {
    linked.link_bandwidth = devices.collective_bandwidth_bytes_per_second;
    linked.link_latency = devices.collective_latency_seconds;
  } else {
    linked.link_bandwidth = devices.slowest_link_bandwidth();
    linked.link_latency = devices.slowest_link_latency();
  }
  if (linked.link_bandwidth <= 0.0) {
    throw PlanningError(
        "CrossReplica: a pipeline of one device, without a measured collective link, says "
        "nothing of the link between replicas; give CrossReplica.link_bandwidth");
  }
  return linked;
}

double cross_replica_seconds(const CrossReplica& cross_replica, const Devices& devices, double gradient_bytes) {
  const CrossReplica linked = with_link(cross_replica, devices);
  if (!linked.enabled()) return 0.0;
  const Devices ring = replica_ring(linked, devices);
  std::vector<int> group(static_cast<std::size_t>(linked.replicas));
  std::iota(group.begin(), group.end(), 0);
  return ring_all_reduce(ring, group, gradient_bytes).seconds + ring_all_reduce(ring, group, kLossBytes).seconds;
}

}  // namespace graphpipe::cost
