#include "planner/planner.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "partition/partitioner.h"
#include "schedule/schedule.h"

namespace graphpipe::planner {

using partition::CandidatePlan;

double simulated_step(const plan::Plan& plan, const cost::Devices& devices, const PlannerOptions& planner) {
  const schedule::Schedule schedule = schedule::generate(plan, planner.policy);
  return sim::simulate(plan, schedule, devices, planner.sim).amortized_iteration_seconds;
}

PlannerResult plan_by_simulation(const graph::OpGraph& graph, const cost::Devices& devices,
                                 const partition::Options& options, const PlannerOptions& planner) {
  partition::Options wide = options;
  wide.every_candidate = true;
  const partition::CandidateSet set(graph, devices, wide);
  const auto& candidates = set.candidates();
  if (candidates.empty()) return {partition::partition(graph, devices, options), 0.0, 0, 0};  // raises its error

  // Simulations in order of the bound; a stable sort keeps partition()'s preference among equal
  // bounds, and the tie rule below keeps it among equal steps.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const CandidatePlan& c = candidates[i].layout;
    const int k = c.assignment.empty() ? 0 : *std::max_element(c.assignment.begin(), c.assignment.end()) + 1;
    const int used = c.replicas.empty() ? k : std::accumulate(c.replicas.begin(), c.replicas.end(), 0);
    if (used >= planner.min_devices) order.push_back(i);
  }
  if (order.empty()) {
    throw PlanningError("no " + options.partitioner + " plan that fits in memory uses at least " +
                        std::to_string(planner.min_devices) + " devices (of " + std::to_string(devices.count) +
                        "); plan with fewer devices or replicate=True");
  }
  // A split backward's weight halves may run after everything else: only the compute bound.
  const bool split = planner.policy == schedule::Policy::zb_graph;
  auto bound = [&](std::size_t i) { return split ? candidates[i].compute_bound : candidates[i].pipeline_bound; };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bound(a) < bound(b); });
  std::optional<plan::Plan> best;
  std::size_t best_index = 0, simulated = 0;
  double best_step = 0.0;
  for (std::size_t i : order) {
    if (best && bound(i) > best_step * (1.0 + 1e-12)) break;
    plan::Plan plan = set.build(i);
    const double step = simulated_step(plan, devices, planner);
    ++simulated;
    const bool faster = step < best_step * (1.0 - 1e-12);
    const bool tie = !faster && step <= best_step * (1.0 + 1e-12) && i < best_index;
    if (!best || faster || tie) {
      best = std::move(plan);
      best_index = i;
      best_step = step;
    }
  }
  PlannerResult result{std::move(*best), candidates[best_index].predicted_step, candidates.size(), simulated};
  result.plan.predicted_iteration_seconds = best_step;
  log::info("planner: simulated " + std::to_string(simulated) + " of " + std::to_string(candidates.size()) +
            " candidates; " + result.plan.partitioner + ", " + std::to_string(result.plan.stages.size()) +
            " stages, micro-batch " + std::to_string(result.plan.micro_batch_size));
  return result;
}

}  // namespace graphpipe::planner
