#include "partition/sequential/sequential_partitioner.h"

#include "partition/evaluate.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/pipedream.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

CandidatePlan SequentialPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  if (!problem.replicated()) return {sequential_assignment(problem), std::string(kName), {}, {}};
  // PipeDream's planner (pipedream.h): its chain for every device count up to the budget, and
  // plain data parallelism at every replica count; the shortest predicted step wins. Each list
  // only grows with the budget and each candidate's figures depend only on the devices it uses,
  // so more devices never give a slower plan.
  std::vector<CandidatePlan> candidates;
  for (ChainPlan& chain : pipedream_plans(problem)) {
    candidates.push_back({std::move(chain.assignment), std::string(kName), std::move(chain.replicas), {}});
  }
  auto [single, counts] = data_parallel_plan(problem);
  candidates.push_back({std::move(single), std::string(kName), std::move(counts), {}});
  std::size_t best = fastest_candidate(problem, candidates);
  // PipeDream's DP prices a stage's memory from its own operators, not the skip tensors the
  // chain relays through it (the evaluation charges those), so under a tight limit its chains
  // can all overflow by a relay's bytes. Then the replicated chain search, which grows each
  // stage's replicas and recomputation until the evaluated stage fits (sequential.h), joins them.
  // Only then: with a chain that fits, the list stays the one that never slows with more devices.
  const CandidatePlan& chosen = candidates[best];
  if (!evaluate(problem, chosen.assignment, chosen.replicas, chosen.devices).fits()) {
    auto [chain, replicas] = sequential_replicated(problem, request.options.tolerance);
    if (!chain.empty()) {
      candidates.push_back({std::move(chain), std::string(kName), std::move(replicas), {}});
      best = fastest_candidate(problem, candidates);
    }
  }
  return std::move(candidates[best]);
}

}  // namespace graphpipe::partition
