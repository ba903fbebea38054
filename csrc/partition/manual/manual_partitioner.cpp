#include "partition/manual/manual_partitioner.h"

#include <algorithm>

#include "partition/manual/manual.h"

namespace graphpipe::partition {

void ManualPartitioner::prepare(const PartitionRequest& request) {
  // With stage_devices, stages may outnumber the devices (several on one), which
  // manual_stage_devices then checks.
  assignment_ = manual_assignment(request.graph, request.options.manual, request.devices.count,
                                  !request.options.stage_devices.empty());
  if (!request.options.stage_devices.empty()) {
    const int stages = *std::max_element(assignment_.begin(), assignment_.end()) + 1;
    devices_ = manual_stage_devices(request.options.stage_devices, stages, request.devices.count);
  }
}

CandidatePlan ManualPartitioner::plan(const PartitionRequest&, const Problem&) {
  return {assignment_, std::string(kName), {}, devices_};
}

}  // namespace graphpipe::partition
