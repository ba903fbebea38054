// The "sequential" partitioner: the chain-pipeline baseline (PipeDream and every chain pipeline
// system), against which the benchmarks measure graphpipe.
//
// At each micro-batch size, the sequential DP's contiguous cuts of the graph's topological order
// (sequential.h), run as a chain (Plan::chain): depth = stage count, 1F1B in-flight counts by
// chain position, and a tensor that skips stages is relayed through the stages in between, as
// chain pipelines do. The evaluation charges those relays (evaluate.h), so the plan's figures
// and the driver's choice of micro-batch size see them; the DP that places the cuts does not
// (it charges each tensor at its producer's and consumer's stages only), so the cuts are the
// best chain for that simpler cost. No refinement: the baseline is the contiguous cuts that
// chain systems make, not a plan improved by graphpipe's tools. A micro-batch size at which no
// chain fits in memory has no candidate (the driver then reports the least overflow).
// With replication (Options::replicate) it is PipeDream's planner (pipedream.h): the chain's
// cuts and each stage's replica count chosen together by its dynamic program, one chain per
// device count up to the budget, with plain data parallelism at every replica count beside
// them; the shortest predicted step wins, so more devices never give a slower plan. Devices the
// best chain does not need stay idle.
#pragma once

#include <string_view>

#include "partition/partitioner_interface.h"

namespace graphpipe::partition {

class SequentialPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "sequential";

  bool plans_chains() const override { return true; }
  bool is_baseline() const override { return true; }
  bool plans_sizes_at_once() const override { return true; }  // no state between sizes
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;
  std::vector<CandidatePlan> candidates(const PartitionRequest& request, const Problem& problem) override;
};

}  // namespace graphpipe::partition
