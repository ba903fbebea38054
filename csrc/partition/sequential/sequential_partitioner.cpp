#include "partition/sequential/sequential_partitioner.h"

#include "partition/evaluate.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/pipedream.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

CandidatePlan SequentialPartitioner::plan(const PartitionRequest&, const Problem& problem) {
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
  return std::move(candidates[fastest_candidate(problem, candidates)]);
}

}  // namespace graphpipe::partition
