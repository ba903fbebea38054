#include "partition/manual_partitioner.h"

#include "partition/manual.h"

namespace graphpipe::partition {

void ManualPartitioner::prepare(const PartitionRequest& request) {
  assignment_ = manual_assignment(request.graph, request.options.manual, request.devices.count);
}

CandidatePlan ManualPartitioner::plan(const PartitionRequest&, const Problem&) {
  return {assignment_, std::string(kName)};
}

}  // namespace graphpipe::partition
