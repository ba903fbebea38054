#include "planner/planner.h"

#include <algorithm>
#include <memory>
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

namespace {

// The candidates of one partitioner run: those it made for one schedule, with or without
// replicas.
struct Pool {
  std::unique_ptr<partition::CandidateSet> set;
  schedule::Policy policy;
};

// One candidate of one pool: what the branch and bound orders.
struct Entry {
  std::size_t pool = 0;
  std::size_t index = 0;
  double bound = 0.0;
};

int devices_used(const CandidatePlan& c) {
  const int k = c.assignment.empty() ? 0 : *std::max_element(c.assignment.begin(), c.assignment.end()) + 1;
  return c.replicas.empty() ? k : std::accumulate(c.replicas.begin(), c.replicas.end(), 0);
}

// The device budgets at which the plans without replicas are made: the powers of two up to the
// device count, and at most kPlainBudgetLimit. Not every count: the partitioners' plain searches
// are not monotone in the budget, and a list that holds, for n devices, the plain plans of each
// budget on this ladder only grows with n, which keeps the planner never worse with more
// devices. The limit bounds planning time: the plain series-parallel DP onto 64 stages takes
// about 12 s on MMT at paper size (the replicated search, which covers large budgets with its
// replicas, about 5 s), onto 8 stages 0.4 s.
constexpr int kPlainBudgetLimit = 8;

std::vector<int> plain_budgets(int count, int max_stages) {
  std::vector<int> budgets;
  const int top = std::min(max_stages > 0 ? std::min(count, max_stages) : count, kPlainBudgetLimit);
  for (int b = 1; b <= top; b *= 2) budgets.push_back(b);
  return budgets;
}

// The pools the planner draws from: per policy, the partitioner's candidates for it, and where
// replicas are allowed, its one-device-per-stage candidates too, at each budget of
// plain_budgets (where it can make any: with more stages than operators it cannot).
std::vector<Pool> make_pools(const graph::OpGraph& graph, const cost::Devices& devices,
                             const partition::Options& options, const PlannerOptions& planner) {
  const bool plain_too = options.replicate && options.partitioner != "manual" && options.stage_devices.empty();
  std::vector<Pool> pools;
  for (schedule::Policy policy : planner.policies) {
    partition::Options wide = options;
    wide.every_candidate = true;
    wide.zero_bubble = policy == schedule::Policy::zb_graph;
    if (plain_too) {  // first, so that a tie leaves devices idle rather than replicate for nothing
      partition::Options plain = wide;
      plain.replicate = false;
      for (int budget : plain_budgets(devices.count, options.max_stages)) {
        plain.max_stages = budget;
        try {
          pools.push_back({std::make_unique<partition::CandidateSet>(graph, devices, plain), policy});
        } catch (const PlanningError& e) {
          log::debug("planner: no plan without replicas on " + std::to_string(budget) + " devices: " + e.what());
        }
      }
    }
    pools.push_back({std::make_unique<partition::CandidateSet>(graph, devices, wide), policy});
  }
  return pools;
}

}  // namespace

double simulated_step(const plan::Plan& plan, const cost::Devices& devices, schedule::Policy policy,
                      const sim::SimOptions& options) {
  const schedule::Schedule schedule = schedule::generate(plan, policy);
  return sim::simulate(plan, schedule, devices, options).amortized_iteration_seconds;
}

PlannerResult plan_by_simulation(const graph::OpGraph& graph, const cost::Devices& devices,
                                 const partition::Options& options, const PlannerOptions& planner) {
  if (planner.policies.empty()) throw PlanningError("the planner needs at least one schedule to plan for");
  const std::vector<Pool> pools = make_pools(graph, devices, options, planner);

  // Simulations in order of the bound; a stable sort keeps the listing order among equal bounds,
  // and the tie rule below keeps it among equal steps. A split backward's weight halves may run
  // after everything else: under zb_graph only the compute bound holds.
  std::vector<Entry> order;
  std::size_t fitting = 0;
  for (std::size_t p = 0; p < pools.size(); ++p) {
    const auto& candidates = pools[p].set->candidates();
    fitting += candidates.size();
    const bool split = pools[p].policy == schedule::Policy::zb_graph;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (devices_used(candidates[i].layout) < planner.min_devices) continue;
      order.push_back({p, i, split ? candidates[i].compute_bound : candidates[i].pipeline_bound});
    }
  }
  if (fitting == 0) {  // raises partition()'s error, which says why nothing fits
    partition::Options first = options;
    first.zero_bubble = planner.policies.front() == schedule::Policy::zb_graph;
    return {partition::partition(graph, devices, first), 0.0, 0, 0};
  }
  if (order.empty()) {
    throw PlanningError("no " + options.partitioner + " plan that fits in memory uses at least " +
                        std::to_string(planner.min_devices) + " devices (of " + std::to_string(devices.count) +
                        "); plan with fewer devices or replicate=True");
  }
  std::stable_sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) { return a.bound < b.bound; });
  std::optional<plan::Plan> best;
  std::optional<Entry> best_entry;
  std::size_t simulated = 0;
  double best_step = 0.0;
  auto listed_before = [](const Entry& a, const Entry& b) {
    return a.pool < b.pool || (a.pool == b.pool && a.index < b.index);
  };
  for (const Entry& e : order) {
    if (best && e.bound > best_step * (1.0 + 1e-12)) break;
    plan::Plan plan = pools[e.pool].set->build(e.index);
    const double step = simulated_step(plan, devices, pools[e.pool].policy, planner.sim);
    ++simulated;
    const bool faster = step < best_step * (1.0 - 1e-12);
    const bool tie = !faster && step <= best_step * (1.0 + 1e-12) && listed_before(e, *best_entry);
    if (!best || faster || tie) {
      plan.schedule = std::string(schedule::policy_name(pools[e.pool].policy));
      best = std::move(plan);
      best_entry = e;
      best_step = step;
    }
  }
  const auto& chosen = pools[best_entry->pool].set->candidates()[best_entry->index];
  PlannerResult result{std::move(*best), chosen.predicted_step, fitting, simulated};
  result.plan.predicted_iteration_seconds = best_step;
  log::info("planner: simulated " + std::to_string(simulated) + " of " + std::to_string(fitting) + " candidates; " +
            result.plan.partitioner + ", " + std::to_string(result.plan.stages.size()) + " stages, micro-batch " +
            std::to_string(result.plan.micro_batch_size) + ", schedule " + result.plan.schedule);
  return result;
}

}  // namespace graphpipe::planner
