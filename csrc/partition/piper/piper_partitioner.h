// The "piper" partitioner: Piper's planner (piper.h), the second replicated baseline beside
// PipeDream's ("sequential" with replicate=True).
//
// prepare() builds the layer graphs (one per module depth) and their down-sets once
// (layer_graph.h; a graph too wide for the budget is a PlanningError naming the limit, raised
// before any micro-batch size is tried); plan() runs Piper's DP on each at each micro-batch size
// and keeps, of their chains for every device count up to the budget, the one with the least
// predicted step (evaluate.h): more devices never give a slower plan. Without replication every stage gets one device
// (the DP's only level). Plans run as chains (plans_chains()), Piper's linear pipeline.
#pragma once

#include <string_view>
#include <vector>

#include "partition/partitioner_interface.h"
#include "partition/piper/layer_graph.h"

namespace graphpipe::partition {

class PiperPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "piper";

  bool plans_chains() const override { return true; }
  bool is_baseline() const override { return true; }
  // The layer graphs are built once in prepare() and only read after it: each size's DP is its own.
  bool plans_sizes_at_once() const override { return true; }
  void prepare(const PartitionRequest& request) override;
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;
  // Every chain of every layer graph, for every device count up to the budget: the planner
  // (csrc/planner) simulates them, where the DP priced every transfer at the slowest link.
  std::vector<CandidatePlan> candidates(const PartitionRequest& request, const Problem& problem) override;

 private:
  std::vector<piper::LayerGraph> layers_;
};

}  // namespace graphpipe::partition
