#include "partition/metis_partitioner.h"

#include "partition/metis.h"
#include "partition/refine.h"

namespace graphpipe::partition {

void MetisPartitioner::prepare(const PartitionRequest& request) {
  const auto& sizes = request.micro_batch_sizes;
  start_ = metis_assignment(request.problem(sizes[sizes.size() / 2]), request.max_stages, request.options.seed);
}

CandidatePlan MetisPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  return {request.options.refine ? refine(problem, start_) : start_, std::string(kName)};
}

}  // namespace graphpipe::partition
