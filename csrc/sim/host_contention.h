// Contention for a host CPU that all ranks share: emulation runs more ranks than the machine has
// cores, and then the runtime's own CPU work (dispatching a forward or backward, moving a
// tensor through Gloo at both ends) slows down whenever more ranks need a core at once than
// there are cores. Emulated compute is a sleep and takes no core.
//
// The simulator models this as processor sharing: a rank with CPU work progresses at
// min(1, cores / ranks with CPU work) of a core. Processor sharing makes durations depend on
// what runs at the same time, so simulate() reaches it by a fixed point: replay the schedule,
// measure on that timeline each CPU task's mean number of busy ranks (this module), stretch the
// task by max(1, that / cores), replay again, until the stretches settle.
#pragma once

#include <vector>

namespace graphpipe::sim {

// CPU work of one task on the timeline: [start, end) on `rank`, and on `peer` too for a transfer
// (-1 otherwise).
struct CpuDemand {
  double start = 0.0, end = 0.0;
  int rank = 0;
  int peer = -1;
};

// For each demand, the mean number of ranks with CPU work over its interval, its own ranks
// included, a rank counted once however many of its demands overlap; 0 for an empty interval.
// O(D log D) for D demands.
std::vector<double> mean_busy_ranks(const std::vector<CpuDemand>& demands, int num_ranks);

}  // namespace graphpipe::sim
