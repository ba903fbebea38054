#include "planner/default_search.h"

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "cost/cross_replica.h"
#include "partition/manual/manual_partitioner.h"
#include "partition/registry.h"
#include "planner/folded_search.h"

namespace graphpipe::planner {

namespace {

int plan_devices(const plan::Plan& plan) {
  int used = 0;
  for (const plan::Stage& stage : plan.stages) used += static_cast<int>(stage.devices.size());
  return used;
}

// The search with `replicate` not given: replicas allowed with the widened budgets, and the plan
// without replicas where the replicated planning refuses.
PlannerResult replicas_optional(const graph::OpGraph& graph, const cost::Devices& devices, partition::Options options,
                                const PlannerOptions& search) {
  options.replicate = true;
  try {
    return plan_by_simulation(graph, devices, options, widened_search(search));
  } catch (const PlanningError&) {
    options.replicate = false;
    return plan_by_simulation(graph, devices, options, search);
  }
}

// Plain data parallelism on the first `replicas` ranks: every operator in one stage (the manual
// partitioner's mapping "" -> 0), that stage on those ranks.
PlannerResult data_parallel(const graph::OpGraph& graph, const cost::Devices& devices, partition::Options options,
                            const PlannerOptions& search, int replicas) {
  options.partitioner = std::string(partition::ManualPartitioner::kName);
  options.manual = {{"", 0}};
  std::vector<int> ranks(static_cast<std::size_t>(replicas));
  for (int r = 0; r < replicas; ++r) ranks[static_cast<std::size_t>(r)] = r;
  options.stage_devices = {{0, std::move(ranks)}};
  options.replicate = false;
  options.max_stages = 0;
  return plan_by_simulation(graph, devices, options, search);
}

// A baseline's plan replaces the chosen one where it simulates strictly faster (relative 1e-12:
// a tie keeps the graph partitioner's plan) and uses at least min_devices; the counts add up.
void offer(PlannerResult baseline, const std::string& what, const PlannerOptions& search, PlannerResult& result) {
  result.candidates += baseline.candidates;
  result.simulated += baseline.simulated;
  result.growth_simulated += baseline.growth_simulated;
  const double step = baseline.plan.predicted_iteration_seconds;
  if (step >= result.plan.predicted_iteration_seconds * (1.0 - 1e-12) ||
      plan_devices(baseline.plan) < search.min_devices) {
    return;
  }
  log::info("planner: " + what + " simulates faster (" + std::to_string(step) + " s, against " +
            std::to_string(result.plan.predicted_iteration_seconds) + " s) and is the plan");
  result.plan = std::move(baseline.plan);
  result.closed_form = baseline.closed_form;
}

// Weighs the baselines' plans beside the chosen one (default_search.h): each baseline
// partitioner's own default search, and plain data parallelism on every power-of-two count of
// the first ranks. A baseline that cannot plan (nothing fits, say) is passed over.
void weigh_baselines(const graph::OpGraph& graph, const cost::Devices& devices, const partition::Options& options,
                     const PlannerOptions& search, PlannerResult& result) {
  for (const std::string& name : partition::baseline_names()) {
    partition::Options baseline = options;
    baseline.partitioner = name;
    try {
      offer(replicas_optional(graph, devices, baseline, search), name + "+dp", search, result);
    } catch (const PlanningError& e) {
      log::debug("planner: no " + name + " plan to weigh: " + e.what());
    }
  }
  for (int replicas = 1; replicas <= devices.count; replicas *= 2) {
    try {
      offer(data_parallel(graph, devices, options, search, replicas), "data parallelism on " + std::to_string(replicas),
            search, result);
    } catch (const PlanningError& e) {
      log::debug("planner: no data parallelism on " + std::to_string(replicas) + " devices: " + e.what());
    }
  }
}

// Weighs the partitioner's plans folded onto the devices, j stages per device for j = 2 up to
// search.stages_per_rank (folded_search.h), beside the chosen one.
void weigh_folded(const graph::OpGraph& graph, const cost::Devices& devices, const partition::Options& options,
                  const PlannerOptions& search, PlannerResult& result) {
  for (int k = 2; k <= search.stages_per_rank; ++k) {
    for (Fold fold : {Fold::v, Fold::looping}) {
      auto folded = folded_plan(graph, devices, options, search, fold, k);
      if (!folded) continue;
      const std::string what = folded->plan.partitioner;
      offer(std::move(*folded), what, search, result);
    }
  }
}

}  // namespace

PlannerOptions widened_search(PlannerOptions search) {
  search.plain_budget_limit = 0;
  search.plain_every_up_to = 16;
  search.grow_replicas = true;
  return search;
}

PlannerResult plan_with_replication(const graph::OpGraph& graph, const cost::Devices& devices,
                                    partition::Options options, const PlannerOptions& given,
                                    std::optional<bool> replicate) {
  // One link for the replicas across every search below (plan_by_simulation says why).
  PlannerOptions search = given;
  search.sim.cross_replica = cost::with_link(given.sim.cross_replica, devices);
  if (search.stages_per_rank < 1) {
    throw PlanningError("stages_per_rank must be at least 1, got " + std::to_string(search.stages_per_rank));
  }
  if (partition::places_by_user(options.partitioner)) {
    options.replicate = replicate.value_or(false);
    return plan_by_simulation(graph, devices, options, search);
  }
  PlannerResult result;
  if (replicate.has_value()) {
    options.replicate = *replicate;
    result = plan_by_simulation(graph, devices, options, search);
  } else {
    result = replicas_optional(graph, devices, options, search);
    // The default partitioner only: a partitioner asked for by name (metis, a baseline) is its
    // own search alone, which is what comparing partitioners measures.
    if (options.partitioner == partition::Options{}.partitioner) {
      weigh_baselines(graph, devices, options, search, result);
    }
  }
  weigh_folded(graph, devices, options, search, result);
  return result;
}

}  // namespace graphpipe::planner
