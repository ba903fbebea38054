// The "manual" partitioner: the user's mapping of modules to stages (Options::manual; the rules
// and their checks are in manual.h), the same stages at every micro-batch size. Only the
// micro-batch size is chosen, as for every partitioner, by the driver (partitioner.h).
// The mapping is checked once, in prepare(), so a bad mapping is reported before any
// micro-batch size is tried; a mapping whose stages feed each other in a cycle is reported by
// the driver, which names the stages by their operators.
// Options::stage_devices gives stages their ranks (manual_stage_devices in manual.h): such a
// stage runs as that many data-parallel replicas; Options::replicate adds none of its own here,
// the user's layout is the plan.
#pragma once

#include <string_view>
#include <vector>

#include "partition/partitioner_interface.h"

namespace graphpipe::partition {

class ManualPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "manual";

  bool places_by_user() const override { return true; }
  // plan() hands out what prepare() made, the same at every size: the sizes' evaluations may run at once.
  bool plans_sizes_at_once() const override { return true; }
  void prepare(const PartitionRequest& request) override;
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;

 private:
  std::vector<int> assignment_;            // from prepare(): the mapping applied to the graph
  std::vector<std::vector<int>> devices_;  // ranks per stage when stage_devices is given
};

}  // namespace graphpipe::partition
