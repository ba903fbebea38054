#include "planner/default_search.h"

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "cost/cross_replica.h"
#include "partition/manual/manual_partitioner.h"
#include "partition/partitioner.h"
#include "partition/plan_build.h"
#include "partition/registry.h"
#include "planner/folded_search.h"
#include "schedule/generate.h"

namespace graphpipe::planner {

namespace {

// The search with `replicate` not given: replicas allowed with the widened budgets, and the plan
// without replicas where the replicated planning refuses.
PlannerResult replicas_optional(const graph::OpGraph& graph, const cost::Devices& devices, partition::Options options,
                                const PlannerOptions& search) {
  options.replicate = true;
  try {
    return plan_by_simulation(graph, devices, options, widened_search(search));
  } catch (const NoPlanBelow&) {
    throw;  // nothing could beat search.to_beat: not a refusal to replicate
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

// A floor on the simulated step of every plan on the devices of `devices` (a budget's first
// ranks), with replicas where `replicated` (data parallelism on them) or without (however many
// stages each device holds: a fold): every device runs its stages' work for each micro-batch,
// so the busiest does at least the devices' share of it (candidate_floor's zero-bubble form,
// which counts devices, not stages, and holds whatever schedule runs: a fold may run a split
// backward whatever options.zero_bubble says). Zero where it cannot be found: the plans are
// then weighed.
double floor_on(const graph::OpGraph& graph, const cost::Devices& devices, partition::Options options,
                bool replicated) {
  options.zero_bubble = true;
  options.replicate = replicated;
  options.max_stages = devices.count;
  options.manual.clear();
  options.stage_devices.clear();
  try {
    return partition::candidate_floor(graph, devices, options);
  } catch (const PlanningError&) {
    return 0.0;
  }
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
  // Each search is told the step to beat (PlannerOptions::to_beat): only a faster plan is taken.
  PlannerOptions beat = search;
  for (const std::string& name : partition::baseline_names()) {
    partition::Options baseline = options;
    baseline.partitioner = name;
    beat.to_beat = result.plan.predicted_iteration_seconds;
    try {
      offer(replicas_optional(graph, devices, baseline, beat), name + "+dp", search, result);
    } catch (const PlanningError& e) {
      log::debug("planner: no " + name + " plan to weigh: " + e.what());
    }
  }
  for (int replicas = 1; replicas <= devices.count; replicas *= 2) {
    beat.to_beat = result.plan.predicted_iteration_seconds;
    // Data parallelism on the first r ranks is a plan on those ranks: where their floor is above
    // the step to beat it cannot be taken, and is not searched (MMT at paper size onto 64 V100s:
    // 1 to 16 replicas).
    const double floor = floor_on(graph, cost::first_ranks(devices, replicas), options, true);
    if (floor > beat.to_beat * (1.0 + 1e-9)) {
      log::debug("planner: no data parallelism on " + std::to_string(replicas) + " devices can beat " +
                 std::to_string(beat.to_beat) + " s (their floor is " + std::to_string(floor) + " s)");
      continue;
    }
    try {
      offer(data_parallel(graph, devices, options, beat, replicas), "data parallelism on " + std::to_string(replicas),
            search, result);
    } catch (const PlanningError& e) {
      log::debug("planner: no data parallelism on " + std::to_string(replicas) + " devices: " + e.what());
    }
  }
}

// The fold budgets (PlannerOptions::fold_budget_limit): the powers of two from 2 up to the device
// count and at most the limit. One device folding two stages onto itself only adds transfers.
std::vector<int> fold_budgets(int count, int limit) {
  std::vector<int> budgets;
  for (int b = 2; b <= count && (limit <= 0 || b <= limit); b *= 2) budgets.push_back(b);
  return budgets;
}

// Weighs the partitioner's plans folded j stages per device (j = 2 up to search.stages_per_rank;
// folded_search.h), in each of search.folds, on the first b ranks for every fold budget b, beside the
// chosen one. A budget whose floor is above the chosen plan's step is passed over (none of its
// folds could be taken); a plan folded on the first b ranks is the same plan on the whole
// description, and is simulated there again.
void weigh_folded(const graph::OpGraph& graph, const cost::Devices& devices, const partition::Options& options,
                  const PlannerOptions& search, PlannerResult& result) {
  const int most = search.stages_per_rank.value_or(1);
  if (most < 2) return;
  PlannerOptions beat = search;
  for (int budget : fold_budgets(devices.count, search.fold_budget_limit)) {
    const cost::Devices first = cost::first_ranks(devices, budget);
    const double floor = floor_on(graph, first, options, false);
    if (floor > result.plan.predicted_iteration_seconds * (1.0 + 1e-9)) {
      log::debug("planner: no plan folded onto " + std::to_string(budget) + " devices can beat " +
                 std::to_string(result.plan.predicted_iteration_seconds) + " s (their floor is " +
                 std::to_string(floor) + " s)");
      continue;
    }
    for (int k = 2; k <= most; ++k) {
      for (plan::Fold fold : search.folds) {
        beat.to_beat = result.plan.predicted_iteration_seconds;
        std::optional<PlannerResult> folded;
        try {
          folded = folded_plan(graph, first, options, beat, fold, k);
        } catch (const PlanningError& e) {
          log::debug("planner: no plan folded onto " + std::to_string(budget) + " devices: " + e.what());
        }
        if (!folded) continue;
        if (budget < devices.count) {
          const schedule::Policy policy = schedule::parse_policy(folded->plan.schedule);
          partition::record_devices(folded->plan, devices);
          folded->plan.predicted_iteration_seconds = simulated_step(folded->plan, devices, policy, search.sim);
        }
        const std::string what = folded->plan.partitioner;
        offer(std::move(*folded), what, search, result);
      }
    }
  }
}

}  // namespace

int stages_per_rank_for(const PlannerOptions& search, const partition::Options& options,
                        std::optional<bool> replicate) {
  if (search.stages_per_rank) return *search.stages_per_rank;
  const bool default_search = !replicate.has_value() && options.partitioner == partition::Options{}.partitioner;
  return default_search ? 2 : 1;
}

PlannerOptions widened_search(PlannerOptions search) {
  search.plain_budget_limit = 16;
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
  if (search.stages_per_rank && *search.stages_per_rank < 1) {
    throw PlanningError("stages_per_rank must be at least 1, got " + std::to_string(*search.stages_per_rank));
  }
  search.stages_per_rank = stages_per_rank_for(search, options, replicate);
  if (search.folds.empty()) throw PlanningError("no fold to weigh: name 'v' or 'looping', or leave the fold unset");
  if (search.folds != plan::all_folds() && *search.stages_per_rank < 2) {
    // A fold named where no plan is folded would be ignored: say so instead.
    throw PlanningError("a fold was named but this search puts one stage per device (stages_per_rank " +
                        std::to_string(*search.stages_per_rank) +
                        "; unset, it is 2 only in the default search: the default partitioner with replicate "
                        "unset): pass stages_per_rank=2 or more to fold");
  }
  if (search.fold_budget_limit < 0) {
    throw PlanningError("fold_budget_limit must be a device count (0: no limit), got " +
                        std::to_string(search.fold_budget_limit));
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
