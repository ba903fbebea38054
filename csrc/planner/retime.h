// Retiming: a plan priced again on a graph's current profile (or on another description of the
// same devices), with everything the plan decided left as it is.
//
// A plan's figures (each stage's forward, backward, I and W, transfer, memory and sync seconds,
// its bottleneck and predicted step) are the cost model's at the moment it was made. Where the
// operators are profiled again (graphpipe.profile beside the runs, benchmarks/profiles_beside.py)
// or the devices are described again, the question "what does this very plan cost now?" needs
// the plan's own decisions kept: its stages' operators and ranks, its micro-batching, schedule,
// sync method, optimizer, memory limit, fold and partitioner label, its chain flag. retime()
// evaluates the plan's assignment afresh with the one evaluator every partitioner ends with
// (partition::build_plan over partition/evaluate.h), at the plan's micro-batch size, and copies
// those decisions over. It is the re-pricing half of planning, without a search.
//
// The result's predicted_iteration_seconds is the closed form's (evaluate.h), as partition()
// returns it; simulate the plan (sim/simulator.h) for the simulated step.
//
// Errors (PlanningError, each naming the problem): a plan of another graph or that does not
// validate on it; a plan that uses more devices than `devices` describes; and a plan that the
// evaluation would change: a stage whose recomputation flips (the new description's memory
// differs), which would no longer be the same plan.
#pragma once

#include "cost/devices.h"
#include "graph/op_graph.h"
#include "plan/plan.h"

namespace graphpipe::planner {

plan::Plan retime(const plan::Plan& plan, const graph::OpGraph& graph, const cost::Devices& devices);

}  // namespace graphpipe::planner
