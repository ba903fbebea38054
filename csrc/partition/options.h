// Options: what a caller asks of partition() (partitioner.h). Every partitioner reads the same
// Options, so switching partitioners never means switching argument sets; fields a partitioner
// has no use for (the seed for "sequential", the mapping for "graphpipe") are ignored.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "cost/gradient_buckets.h"
#include "cost/in_flight.h"
#include "cost/sync_method.h"
#include "partition/manual/manual.h"

namespace graphpipe::partition {

struct Options {
  std::string partitioner = "graphpipe";  // a name from partitioner_names() (registry.h)
  std::int64_t batch_size = 0;            // 0: the graph's trace_batch_size
  std::int64_t micro_batch_size = 0;      // 0: chosen (or from num_micro_batches)
  std::int64_t num_micro_batches = 0;     // 0: chosen
  double memory_limit = 0.0;              // bytes per device; 0: Devices::memory_bytes
  cost::Optimizer optimizer = cost::Optimizer::adam;
  ManualMapping manual;          // for "manual"
  int max_stages = 0;            // 0: one per device
  double tolerance = 1e-3;       // graphpipe's binary search, relative
  int seed = 0;                  // METIS seed
  bool refine = true;            // boundary refinement for graphpipe and metis
  cost::InFlightRule in_flight;  // empty: 1F1B depth rule
  // The plan will run under the zero-bubble schedule (zb_graph, schedule/generate.h): the
  // predicted step counts ZB-H1's shorter fill and drain (Evaluation::iteration_seconds), so
  // the partitioners weigh depth against it.
  bool zero_bubble = false;
  // Let stages run as several data-parallel replicas (docs/design.md, "Replicated stages in the
  // planner"): every partitioner then chooses replica counts too, all stages' devices together
  // at most the device count. Off: one device per stage, the plans of before.
  bool replicate = false;
  // How replicated stages synchronise (cost/sync_method.h): the planner charges each replicated
  // stage this method's cost per step (docs/design.md, "Pricing the sync methods"), so a cheaper
  // method makes more replicas worth their devices. Ignored for stages of one device.
  cost::SyncMethod sync;
  // The replicated stages' gradient bucket cap (cost/gradient_buckets.h; wrap's bucket_bytes): the
  // closed form's exposed sync (evaluate.h) follows those buckets' ready times. The planner sets
  // it from sim::SimOptions::bucket_bytes, so that both price the buckets the runtime will fill.
  double bucket_bytes = cost::kDefaultBucketBytes;
  // For "manual": the ranks of some stages (stage -> device ids); a stage not named gets one
  // device, the lowest one no stage names. Implies replicated stages for the stages named.
  std::map<int, std::vector<int>> stage_devices;
  // Every candidate, not only those that can win on the closed form: with replication, the
  // partitioners also list each greedy replica allocation's intermediate states and plain data
  // parallelism at every replica count (partition_candidates, partitioner.h). The planner that
  // ranks candidates by simulation (planner/planner.h) asks for it, so that its list for a
  // budget holds every plan of its list for a smaller one, whatever the simulator says of them.
  bool every_candidate = false;
};

}  // namespace graphpipe::partition
