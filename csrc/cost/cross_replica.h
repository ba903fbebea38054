// cross_replica: what a fault-tolerant step adds to a pipeline's step (graphpipe.fault_tolerant,
// docs/design.md §7.7), for the simulator (sim/cross_replica_tail.h) and so for the planner.
//
// R replicas of the whole pipeline train together; after its pipeline step, every rank averages
// its stages' gradients with the same rank of the other replicas (one torchft all-reduce of the
// flattened gradients, and one of the loss: 8 bytes), then the replicas agree that the step
// lands (torchft's quorum before the step, its commit vote after, and graphpipe's check that the
// averaged gradients are finite), and only then does any rank step its optimizer. So a rank's
// cost grows with its stages' parameter bytes: a plan whose ranks each hold a share of the
// parameters pays less than data parallelism, whose every rank all-reduces all of them.
//
// The all-reduce runs as a ring over the R replicas (cost/all_reduce.h ring_all_reduce), one
// device per node, on the link `link_bandwidth` / `link_latency` describes: the link between the
// same rank of two replicas. Not given (0), the pipeline's own devices describe it (with_link):
// their measured collective link where given (graphpipe/calibration.py; replicas on the
// calibrated machine), else their slowest point-to-point link. The floating-point buffers the
// runtime averages too are not priced (a plan holds no buffer bytes per stage; BatchNorm's are
// small beside the gradients). `coordination_seconds` is the quorum, the
// vote and the finiteness check of one step together: round trips to torchft's lighthouse and
// stores that no device figure describes, so the caller gives it (benchmarks/
// fault_tolerance_bench.py measures it); 0 leaves it out.
#pragma once

#include "cost/devices.h"

namespace graphpipe::cost {

struct CrossReplica {
  int replicas = 1;                   // R; 1: not fault tolerant, nothing is added
  double link_bandwidth = 0.0;        // bytes per second between replicas; 0: the devices' link
  double link_latency = 0.0;          // seconds; only with link_bandwidth
  double coordination_seconds = 0.0;  // quorum + commit vote + finiteness check, per step

  bool enabled() const { return replicas > 1; }
  // replicas >= 1; link figures >= 0 and finite, a latency only with a bandwidth;
  // coordination_seconds >= 0 and finite. PlanningError naming the field otherwise.
  void validate() const;
};

// `cross_replica` with its link made explicit (link_bandwidth > 0) from `devices` where not
// given. The planner resolves it once from the whole description before its search, so that
// every candidate is priced on the same link whatever devices it uses (a description's first
// ranks have another slowest link, or none). PlanningError when replicas > 1 and neither gives a
// link (one device without a measured collective link).
CrossReplica with_link(const CrossReplica& cross_replica, const Devices& devices);

// Seconds one rank's average takes per step: the ring all-reduce of `gradient_bytes` and that of
// the 8-byte loss over the replicas, one after the other (Gloo runs a group's collectives in
// order), on with_link's link. 0 for one replica.
double cross_replica_seconds(const CrossReplica& cross_replica, const Devices& devices, double gradient_bytes);

}  // namespace graphpipe::cost
