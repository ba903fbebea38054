#include "partition/sequential/sequential_partitioner.h"

#include <numeric>

#include "partition/evaluate.h"
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
  //
  // Each chain is placed on the first ranks it needs, as PipeDream's DP assumes (contiguous
  // ranks), not on the whole budget: placed on the budget, a chain's ranks could change with
  // devices it does not use (a node partly in the budget has room for one more replica at
  // budget n + 1 than at n), and so its step, breaking the guarantee above.
  std::vector<CandidatePlan> candidates;
  Problem on_first = problem;
  for (ChainPlan& chain : pipedream_plans(problem)) {
    on_first.placement_ranks = std::accumulate(chain.replicas.begin(), chain.replicas.end(), 0);
    const Evaluation ev = evaluate(on_first, chain.assignment, chain.replicas);
    std::vector<std::vector<int>> devices(chain.replicas.size());
    for (std::size_t v = 0; v < chain.assignment.size(); ++v) {
      devices[chain.assignment[v]] = ev.stages[ev.stage_of[v]].devices;
    }
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
