#include "partition/piper/piper_partitioner.h"

#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "partition/piper/piper.h"
#include "partition/replica_allocation.h"

namespace graphpipe::partition {

void PiperPartitioner::prepare(const PartitionRequest& request) {
  // The pieces balance compute at the smallest micro-batch size; the layer graph's shape (which
  // units exist) is what the DP needs, and it is the same at every size.
  layers_ = piper::build_layer_graphs(request.problem(request.micro_batch_sizes.front()));
  for (const piper::LayerGraph& lg : layers_) {
    log::info("piper: " + std::to_string(lg.units.size()) + " layers (" + std::to_string(lg.chains) +
              " chains of operators grouped by module depth " + std::to_string(lg.module_depth) + ", at most " +
              std::to_string(lg.pieces_per_chain) + " pieces each), " + std::to_string(lg.downsets.size()) +
              " down-sets");
  }
}

std::vector<CandidatePlan> PiperPartitioner::candidates(const PartitionRequest& /*request*/, const Problem& problem) {
  std::vector<CandidatePlan> candidates;
  for (const piper::LayerGraph& lg : layers_) {
    for (ChainPlan& chain : piper_plans(problem, lg)) {
      candidates.push_back({std::move(chain.assignment), std::string(kName), std::move(chain.replicas), {}});
    }
  }
  return candidates;
}

CandidatePlan PiperPartitioner::plan(const PartitionRequest& request, const Problem& problem) {
  std::vector<CandidatePlan> all = candidates(request, problem);
  if (all.empty()) return {{}, std::string(kName), {}, {}};
  return std::move(all[fastest_candidate(problem, all)]);
}

}  // namespace graphpipe::partition
