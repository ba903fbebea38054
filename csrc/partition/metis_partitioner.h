// The "metis" partitioner: a general-purpose graph partitioner as a baseline that, unlike the
// sequential one, may place branches side by side.
//
// METIS k-way with k = the stage count (metis.h), repaired to convex stages with an acyclic
// stage graph (repair.h). METIS runs once per partition() call, at the middle candidate
// micro-batch size: its parts depend on the size only through the operators' relative weights,
// and one set of parts keeps the candidates comparable. The parts are then refined (refine.h,
// unless Options::refine is off) at every micro-batch size, where transfers and in-flight
// memory weigh differently.
#pragma once

#include <string_view>
#include <vector>

#include "partition/partitioner_interface.h"

namespace graphpipe::partition {

class MetisPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "metis";

  void prepare(const PartitionRequest& request) override;
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;

 private:
  std::vector<int> start_;  // from prepare(): the repaired METIS parts
};

}  // namespace graphpipe::partition
