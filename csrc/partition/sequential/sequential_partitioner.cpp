#include "partition/sequential/sequential_partitioner.h"

#include "partition/replica_allocation.h"
#include "partition/sequential/pipedream.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

std::vector<CandidatePlan> SequentialPartitioner::candidates(const PartitionRequest& request, const Problem& problem) {
  if (!problem.replicated()) return {{sequential_assignment(problem), std::string(kName), {}, {}}};
  // PipeDream's planner (pipedream.h): its chain for every device count up to the budget, and
  // plain data parallelism at every replica count. Each list only grows with the budget and
  // each candidate's figures depend only on the devices it uses, so more devices never give a
  // slower plan.
  // (Each chain placed on the first ranks it uses: placed_on_first_ranks, pipedream.h.)
  std::vector<CandidatePlan> candidates;
  for (ChainPlan& chain : pipedream_plans(problem)) {
    std::vector<std::vector<int>> devices = placed_on_first_ranks(problem, chain);
    candidates.push_back(
        {std::move(chain.assignment), std::string(kName), std::move(chain.replicas), std::move(devices)});
  }
  if (request.options.every_candidate) {
    for (std::vector<int>& counts : data_parallel_counts(problem))
      candidates.push_back({std::vector<int>(problem.num_nodes(), 0), std::string(kName), std::move(counts), {}});
  } else {
    auto [single, counts] = data_parallel_plan(problem);
    candidates.push_back({std::move(single), std::string(kName), std::move(counts), {}});
  }
  return candidates;
}

CandidatePlan SequentialPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  std::vector<CandidatePlan> all = candidates(request, problem);
  if (all.size() == 1) return std::move(all.front());
  return std::move(all[fastest_candidate(problem, all)]);
}

}  // namespace graphpipe::partition
