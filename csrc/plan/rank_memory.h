// rank_memory: what one rank of a plan holds by the planner's memory model, and what is left of
// the plan's per-device limit. The headroom is the one figure the runtime may spend on memory the
// model does not count: receive buffers posted before their micro-batch is in flight
// (runtime/executor.h, ReceivePosting::whole_step), so that a plan made under a limit still runs
// under it.
#pragma once

#include "plan/plan.h"

namespace graphpipe::plan {

// The predicted peak of `rank`: the sum of memory_bytes over the stages it runs (a rank may hold
// several, each alone on it; a replicated stage counts one replica's). 0 for a rank without a
// stage, also one past num_devices (a plan on fewer devices than the job has ranks leaves the
// rest idle). Throws PlanningError for a negative rank.
double rank_memory_bytes(const Plan& plan, int rank);

// memory_limit_bytes - rank_memory_bytes(rank), never below 0; +infinity where the plan was made
// without a limit (memory_limit_bytes 0).
double rank_memory_headroom(const Plan& plan, int rank);

}  // namespace graphpipe::plan
