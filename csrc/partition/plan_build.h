// Plan building: the one function every partitioner ends with. From a node -> stage label
// assignment it renumbers stages topologically, collects each stage's operators (in operator
// topological order), stage edges with the operator edges they carry, predicted times and
// memory (partition/evaluate.h), depth and bottleneck, gives each stage its ranks (stage s on
// device s when every stage has one; place_stages in placement.h, or the caller's lists, for
// replicated stages), and checks the result with validate_plan. O(V + E + S log S).
#pragma once

#include <string>
#include <vector>

#include "cost/devices.h"
#include "partition/evaluate.h"
#include "partition/problem.h"
#include "plan/plan.h"

namespace graphpipe::partition {

// Throws PlanningError when the stage graph of the assignment has a cycle (naming the stages
// by their operators) or when the assignment uses more stages (or replicas) than devices.
// `replicas` and `devices` are by input label, as evaluate() takes them.
plan::Plan build_plan(const Problem& problem, const std::vector<int>& assignment, const std::string& partitioner,
                      const std::vector<int>& replicas = {}, const std::vector<std::vector<int>>& devices = {});

// Records `devices` as the description the plan is for (Plan::num_devices, device_nodes): what
// build_plan does, and what a plan made on the first ranks of a larger description needs to be
// that plan on the larger one (planner/planner.cpp).
void record_devices(plan::Plan& plan, const cost::Devices& devices);

}  // namespace graphpipe::partition
