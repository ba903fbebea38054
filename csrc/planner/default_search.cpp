#include "planner/default_search.h"

#include "common/error.h"
#include "partition/registry.h"

namespace graphpipe::planner {

PlannerOptions widened_search(PlannerOptions search) {
  search.plain_budget_limit = 0;
  search.plain_every_up_to = 16;
  search.grow_replicas = true;
  return search;
}

PlannerResult plan_with_replication(const graph::OpGraph& graph, const cost::Devices& devices,
                                    partition::Options options, const PlannerOptions& search,
                                    std::optional<bool> replicate) {
  if (replicate.has_value() || partition::places_by_user(options.partitioner)) {
    options.replicate = replicate.value_or(false);
    return plan_by_simulation(graph, devices, options, search);
  }
  options.replicate = true;
  try {
    return plan_by_simulation(graph, devices, options, widened_search(search));
  } catch (const PlanningError&) {
    options.replicate = false;
    return plan_by_simulation(graph, devices, options, search);
  }
}

}  // namespace graphpipe::planner
