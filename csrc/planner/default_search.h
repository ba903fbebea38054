// default_search: how graphpipe.plan's `replicate` chooses the search, defined once for every
// front door (graphpipe.plan, graphpipe.wrap, the command line; the binding's
// plan_by_simulation(replicate=None)).
//
//   replicate false   plans without replicas, with the PlannerOptions as given;
//   replicate true    replicas allowed, with the PlannerOptions as given (the plain budgets: every
//                     power of two up to 8, planner.h);
//   not given         replicas allowed with the widened search (widened_search): the plans
//                     without replicas weighed on every count of devices up to 16 and every
//                     power of two up to the device count, and replicas granted by simulation,
//                     so that the planner's list for more devices holds every candidate of the
//                     list for fewer and the default never returns a slower plan for more devices
//                     (planner.h). Where the replicated planning refuses, the plan without
//                     replicas stands. A partitioner that places by the user (manual) runs as
//                     asked: without replicas beyond those its stage_devices give.
//
// Before, the default was the faster of the plan without replicas on every device and the plan
// with them; the plain searches are not monotone in the device count, and DLRM at paper size
// got a plan 23% slower on 8 V100s than on 7.
#pragma once

#include <optional>

#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "planner/planner.h"

namespace graphpipe::planner {

// `search` with the default's budgets: plain_budget_limit 0 (up to the device count),
// plain_every_up_to 16, grow_replicas.
PlannerOptions widened_search(PlannerOptions search);

// The plan as `replicate` says (above); `options.replicate` is set here.
PlannerResult plan_with_replication(const graph::OpGraph& graph, const cost::Devices& devices,
                                    partition::Options options, const PlannerOptions& search,
                                    std::optional<bool> replicate);

}  // namespace graphpipe::planner
