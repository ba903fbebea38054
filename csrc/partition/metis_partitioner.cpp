#include "partition/metis_partitioner.h"

#include "partition/metis.h"
#include "partition/refine.h"
#include "partition/replica_allocation.h"

namespace graphpipe::partition {

void MetisPartitioner::prepare(const PartitionRequest& request) {
  const auto& sizes = request.micro_batch_sizes;
  start_ = metis_assignment(request.problem(sizes[sizes.size() / 2]), request.max_stages, request.options.seed);
}

CandidatePlan MetisPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  std::vector<int> layout = request.options.refine ? refine(problem, start_) : start_;
  if (!problem.replicated()) return {std::move(layout), std::string(kName), {}, {}};
  // METIS cuts for one device per stage; leftover devices go to the slowest stages greedily.
  std::vector<int> replicas = allocate_replicas(problem, layout);
  return {std::move(layout), std::string(kName), std::move(replicas), {}};
}

}  // namespace graphpipe::partition
