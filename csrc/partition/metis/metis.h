// The METIS partitioner: k-way partitioning of the operator graph's undirected view, then
// repair into convex stages with an acyclic stage graph (partition/metis/repair.h); boundary
// refinement on the cost model (partition/metis/refine.h) is applied by the caller per micro-batch.
//
// METIS 5.1 input: every operator edge stored in both directions; edge weight = bytes per
// micro-batch in KiB (at least 1; scaled down together if their sum would overflow 32-bit
// METIS integers); two vertex constraints (ncon = 2): compute time and memory (static bytes +
// one micro-batch of activations), each scaled so that it sums to about 1e6, at least 1 per
// operator; imbalance tolerances 5% on compute and 50% on memory. METIS's seed is fixed, so
// the same input gives the same parts. Guards for METIS 5.1's faults, answered without asking
// METIS for them: no operator (no parts), k = 1 (it crashes), k >= the operator count (one
// operator per part), and more than a third of the operator count (its recursive bisection runs
// out of vertices, prints "***Cannot bisect a graph with 0 vertices!" and leaves parts empty):
// METIS gets V / 3 parts and split_to makes k stages of them. Empty parts are dropped.
// A METIS failure (return code) is a PlanningError. Cost: METIS's O((V + E) log k), then O(V + E).
//
// The "metis" partitioner: a general-purpose graph partitioner as a baseline that, unlike the
// sequential one, may place branches side by side.
//
// METIS k-way with k = the stage count (above), repaired to convex stages with an acyclic
// stage graph (repair.h). METIS runs once per partition() call, at the middle candidate
// micro-batch size: its parts depend on the size only through the operators' relative weights,
// and one set of parts keeps the candidates comparable. The parts are then refined (refine.h,
// unless Options::refine is off) at every micro-batch size, where transfers and in-flight
// memory weigh differently.
#pragma once

#include <string_view>
#include <vector>

#include "partition/partitioner_interface.h"
#include "partition/problem.h"

namespace graphpipe::partition {

// Raw METIS parts 0..k-1 (possibly cyclic, possibly with unused labels; at most max(1, V / 3)
// labels used unless k >= V).
std::vector<int> metis_parts(const Problem& problem, int k, int seed = 0);
// Parts repaired to an acyclic stage graph and split back up to min(k, V) stages.
std::vector<int> metis_assignment(const Problem& problem, int k, int seed = 0);

class MetisPartitioner final : public Partitioner {
 public:
  static constexpr std::string_view kName = "metis";

  void prepare(const PartitionRequest& request) override;
  CandidatePlan plan(const PartitionRequest& request, const Problem& problem) override;

 private:
  std::vector<int> start_;  // from prepare(): the repaired METIS parts
};

}  // namespace graphpipe::partition
