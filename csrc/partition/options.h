// Options: what a caller asks of partition() (partitioner.h). Every partitioner reads the same
// Options, so switching partitioners never means switching argument sets; fields a partitioner
// has no use for (the seed for "sequential", the mapping for "graphpipe") are ignored.
#pragma once

#include <cstdint>
#include <string>

#include "cost/cost_model.h"
#include "cost/in_flight.h"
#include "partition/manual.h"

namespace graphpipe::partition {

struct Options {
  std::string partitioner = "graphpipe";  // a name from partitioner_names() (registry.h)
  std::int64_t batch_size = 0;          // 0: the graph's trace_batch_size
  std::int64_t micro_batch_size = 0;    // 0: chosen (or from num_micro_batches)
  std::int64_t num_micro_batches = 0;   // 0: chosen
  double memory_limit = 0.0;            // bytes per device; 0: Devices::memory_bytes
  cost::Optimizer optimizer = cost::Optimizer::adam;
  ManualMapping manual;                 // for "manual"
  int max_stages = 0;                   // 0: one per device
  double tolerance = 1e-3;              // graphpipe's binary search, relative
  int seed = 0;                         // METIS seed
  bool refine = true;                   // boundary refinement for graphpipe and metis
  cost::InFlightRule in_flight;         // empty: 1F1B depth rule
};

}  // namespace graphpipe::partition
