// The "manual" partitioner: the user's mapping of modules to stages (Options::manual; the rules
// and their checks are in manual.h), the same stages at every micro-batch size. Only the
// micro-batch size is chosen, as for every partitioner, by the driver (partitioner.h).
// The mapping is checked once, in prepare(), so a bad mapping is reported before any
// micro-batch size is tried; a mapping whose stages feed each other in a cycle is reported by
// the driver, which names the stages by their operators.
#pragma once

#include <string_view>
#include <vector>

#include "partition/partitioner_interface.h"

namespace graphpipe::partition {

class ManualPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "manual";

  void prepare(const PartitionRequest& request) override;
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;

 private:
  std::vector<int> assignment_;  // from prepare(): the mapping applied to the graph
};

}  // namespace graphpipe::partition
