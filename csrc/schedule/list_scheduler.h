// The list scheduler behind generate() (generate.h describes the policies and why the result is
// deadlock-free): every compute task of the stages' leads on one global timeline (stage costs
// from the plan, transfers instantaneous), each rank's program its part of one global sequence,
// a transfer's send and receive at the same position. The programs it returns are the leads'
// only (replicas and all-reduces are generate()'s), each ending with its optimizer step.
#pragma once

#include <vector>

#include "plan/plan.h"
#include "schedule/generate.h"
#include "schedule/schedule.h"

namespace graphpipe::schedule {

// `ranks_of`: stage_ranks(plan). Throws ScheduleError if a stage never reaches its optimizer step
// (a guard: the policies cannot stall).
Schedule list_schedule(const plan::Plan& plan, Policy policy, const std::vector<std::vector<int>>& ranks_of);

}  // namespace graphpipe::schedule
