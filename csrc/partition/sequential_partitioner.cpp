#include "partition/sequential_partitioner.h"

#include "partition/sequential.h"

namespace graphpipe::partition {

CandidatePlan SequentialPartitioner::plan(const PartitionRequest&, const Problem& problem) {
  return {sequential_assignment(problem), std::string(kName)};
}

}  // namespace graphpipe::partition
