#include "planner/replica_refinement.h"

#include <algorithm>
#include <utility>

#include "planner/planner.h"

namespace graphpipe::planner {

namespace {

bool fits(const plan::Plan& plan) {
  return std::all_of(plan.stages.begin(), plan.stages.end(),
                     [&](const plan::Stage& s) { return s.memory_bytes <= plan.memory_limit_bytes; });
}

}  // namespace

Refinement refine_replicas(const partition::CandidateSet& set, std::size_t index, double step,
                           const cost::Devices& devices, schedule::Policy policy, const sim::SimOptions& options) {
  Refinement best{set.build(index), step, 0, 0};
  while (true) {
    bool grown = false;
    for (const auto& ranks : set.replica_growths(index, best.plan)) {
      plan::Plan plan = set.build(index, ranks);
      if (!fits(plan)) continue;
      const double tried = simulated_step(plan, devices, policy, options);
      ++best.simulated;
      if (tried < best.step * (1.0 - 1e-6)) {  // the fastest growth of the round
        best.plan = std::move(plan);
        best.step = tried;
        grown = true;
      }
    }
    if (!grown) break;
    ++best.rounds;
  }
  return best;
}

}  // namespace graphpipe::planner
