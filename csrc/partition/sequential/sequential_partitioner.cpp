#include "partition/sequential/sequential_partitioner.h"

#include "partition/evaluate.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

CandidatePlan SequentialPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  if (!problem.replicated()) return {sequential_assignment(problem), std::string(kName), {}, {}};
  // PipeDream-style: the chain with replica counts chosen with the cuts, its leftover devices
  // handed out greedily, against plain data parallelism; the shorter predicted step wins.
  std::vector<CandidatePlan> candidates;
  auto [chain, replicas] = sequential_replicated(problem, request.options.tolerance);
  if (!chain.empty()) {
    replicas = allocate_replicas(problem, chain, std::move(replicas));
    candidates.push_back({std::move(chain), std::string(kName), std::move(replicas), {}});
  }
  auto [single, counts] = data_parallel_plan(problem);
  candidates.push_back({std::move(single), std::string(kName), std::move(counts), {}});
  return std::move(candidates[fastest_candidate(problem, candidates)]);
}

}  // namespace graphpipe::partition
