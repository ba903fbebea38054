// check_fits: whether a schedule was made for a plan. A schedule stands alone (it carries the
// stage ranks and edges it needs, schedule.h), so one read from a file, built by hand or made for
// another plan must be matched against the plan it is to run or be simulated with: the same
// stages, stage edges (same indices, same ends), micro-batch count, and each stage on the plan's
// ranks with the same lead. The simulator (sim/simulate.h) and the runtime
// (graphpipe.wrap(schedule=<Schedule>)) both ask this one check.
#pragma once

#include "plan/plan.h"
#include "schedule/schedule.h"

namespace graphpipe::schedule {

// Throws ScheduleError naming the first difference ("was it made for another plan?").
void check_fits(const Schedule& schedule, const plan::Plan& plan);

}  // namespace graphpipe::schedule
