// partition(): the front door of csrc/partition. Given an OpGraph, the devices and Options, it
// runs one partitioner for every candidate micro-batch size and returns the best Plan.
//
// Partitioners (all judged by the same cost model, memory limit and micro-batch freedom):
//   "graphpipe"  binary search + DP over the series-parallel tree (graphpipe_dp.h: its plans
//                of least slowest stage and the shallower ones found at larger targets), and
//                the sequential DP's cuts of three topological orders (the graph's, and the
//                tree's with branches largest-first and smallest-first) evaluated as graphs
//                (independent segments run in parallel); each cut and the first DP plan also
//                refined (refine.h); and on graphs of at most 64 operators and 1024 down-sets,
//                the exact down-set DP's plans (downset.h: for every depth bound the least
//                slowest stage over all acyclic partitions). The least predicted step wins, ties
//                to the DP (the plan's partitioner reads "graphpipe(chain)" when a cut won,
//                "graphpipe(downset)" when an exact plan did). A graph that is not
//                series-parallel, and a micro-batch size at which no layout of the DP's family
//                fits in memory, fall back to the better of two refined starts, METIS's layout
//                and the sequential DP's chain, weighed by step against the down-set plans where
//                they exist (logged at info level; the plan's partitioner then reads
//                "graphpipe(fallback)" or "graphpipe(downset)").
//   "metis"      METIS k-way with k = stages (metis.h), repaired to an acyclic stage graph,
//                then refined per micro-batch size. METIS runs once, at the middle candidate
//                micro-batch size.
//   "sequential" contiguous cuts of one topological order (sequential.h), run as a chain
//                (Plan::chain: depth = stages, 1F1B in-flight by chain position), like
//                PipeDream and every chain pipeline; skip tensors forwarded through the stages in
//                between are not charged (which favours the baseline).
//   "manual"     the user's mapping (manual.h).
// Micro-batch size: the given one, or the one derived from num_micro_batches, or else every power
// of two dividing the mini-batch; for each the partitioner's plan is evaluated and the plan with
// the least predicted step time (num_micro_batches + depth - 1) x slowest stage, plus the part
// of the optimizer steps that outlasts the pipeline (evaluate.h), wins (ties: lower bottleneck,
// then smaller micro-batch).
//
// Errors (PlanningError unless said): an empty graph; a cyclic graph (GraphError naming the
// cycle); zero devices; more devices than operators (a stage needs at least one operator and
// data parallelism inside a stage is not supported yet); a bad batch / micro-batch combination;
// an unknown partitioner or optimizer; a model that does not fit, with the stage, its need,
// the limit and the excess.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cost/cost_model.h"
#include "cost/devices.h"
#include "cost/in_flight.h"
#include "graph/op_graph.h"
#include "partition/manual.h"
#include "partition/plan.h"

namespace graphpipe::partition {

struct Options {
  std::string partitioner = "graphpipe";
  std::int64_t batch_size = 0;          // 0: the graph's trace_batch_size
  std::int64_t micro_batch_size = 0;    // 0: chosen (or from num_micro_batches)
  std::int64_t num_micro_batches = 0;   // 0: chosen
  double memory_limit = 0.0;            // bytes per device; 0: Devices::memory_bytes
  cost::Optimizer optimizer = cost::Optimizer::adam;
  ManualMapping manual;                 // for "manual"
  int max_stages = 0;                   // 0: one per device
  double tolerance = 1e-3;              // graphpipe's binary search, relative
  int seed = 0;                         // METIS seed
  bool refine = true;                   // boundary refinement for graphpipe and metis
  cost::InFlightRule in_flight;         // empty: 1F1B depth rule
};

Plan partition(const graph::OpGraph& graph, const cost::Devices& devices, const Options& options);

// The names accepted in Options::partitioner.
std::vector<std::string> partitioner_names();

}  // namespace graphpipe::partition
