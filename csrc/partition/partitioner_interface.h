// Partitioner: the interface every partitioning algorithm implements, so that partition()
// (partitioner.h) is one driver for all of them and a new algorithm is one class plus one line
// in the registry (registry.h).
//
// The division of work: the driver checks the inputs, resolves batch, memory limit and stage
// count into a PartitionRequest, and asks the partitioner for one CandidatePlan per candidate
// micro-batch size; it then evaluates each candidate with the one cost model (evaluate.h) and
// keeps the fastest that fits. A partitioner therefore only answers "which stages at this
// micro-batch size?"; it never compares micro-batch sizes, reports memory errors or builds the
// final Plan, so every algorithm is judged by the same rules.
//
// Life cycle: the driver makes a fresh instance per partition() call, calls prepare() once, then
// plan() once per candidate micro-batch size in ascending order. An instance may keep work that
// does not depend on the micro-batch size between those calls (METIS's parts, the
// series-parallel tree); it is not shared between calls or threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "partition/problem.h"

namespace graphpipe::partition {

// One partition() call's inputs, checked and resolved once by the driver.
struct PartitionRequest {
  const graph::OpGraph& graph;
  const cost::Devices& devices;
  const Options& options;
  const cost::CostModel& model;
  std::int64_t batch_size = 0;                  // resolved: Options::batch_size or the trace's
  std::vector<std::int64_t> micro_batch_sizes;  // the candidates, ascending (problem.h)
  double memory_limit = 0.0;                    // bytes per device, resolved
  int max_stages = 1;                           // <= devices and <= operators
  bool chain = false;                           // Partitioner::plans_chains() of the partitioner asked

  // The partitioning question at one micro-batch size, as the driver evaluates it.
  Problem problem(std::int64_t micro_batch_size) const {
    Problem p = make_problem(model, batch_size, micro_batch_size, max_stages, memory_limit, options.in_flight);
    p.chain = chain;
    p.zero_bubble = options.zero_bubble;
    if (options.replicate || !options.stage_devices.empty()) {
      p.replicas = std::make_shared<const ReplicaTable>(model, micro_batch_size, devices.count);
      p.device_budget = devices.count;
      set_sync(p, options.sync);
      p.bucket_bytes = options.bucket_bytes;
    }
    return p;
  }
};

// A partitioner's answer at one micro-batch size; the driver evaluates it and builds the Plan.
struct CandidatePlan {
  std::vector<int> assignment;            // node -> stage label 0..K-1; empty: no layout fits in memory
  std::string partitioner;                // Plan::partitioner: the registry name, or a variant such as
                                          // "graphpipe(chain)" that says which part of a portfolio won
  std::vector<int> replicas;              // devices per label; empty: one each (replicas.h)
  std::vector<std::vector<int>> devices;  // ranks per label (manual stage_devices); empty: placed
};

class Partitioner {
 public:
  virtual ~Partitioner() = default;

  // Whether this partitioner's plans run as chains (Problem::chain, Plan::chain): depth = stage
  // count and in-flight counts by chain position, whatever the operator edges say.
  virtual bool plans_chains() const { return false; }

  // Whether the user places the stages (the manual partitioner): the planner then runs it as
  // asked, weighing no plans without replicas beside it, and only such a partitioner takes
  // Options::stage_devices.
  virtual bool places_by_user() const { return false; }

  // Whether this partitioner is a published system's planner that graphpipe is measured
  // against (PipeDream's sequential, Piper's): the default search of the default partitioner
  // weighs its plans as candidates too (planner/default_search.h), so the default plan never
  // simulates slower than a baseline's on the same devices.
  virtual bool is_baseline() const { return false; }

  // Whether plan() may run for several micro-batch sizes at once, on threads (it keeps no state
  // between sizes, or guards what it keeps): partition() then plans the sizes side by side.
  virtual bool plans_sizes_at_once() const { return false; }

  // Once per partition() call, before the first plan(): the work that does not depend on the
  // micro-batch size. Errors in the user's input to this partitioner (a bad manual mapping)
  // are raised here, before any micro-batch size is tried.
  virtual void prepare(const PartitionRequest& /*request*/) {}

  // The candidate at one micro-batch size; `problem` is request.problem(that size).
  virtual CandidatePlan plan(const PartitionRequest& request, const Problem& problem) = 0;

  // Every candidate this partitioner weighs at one micro-batch size, the one plan() returns
  // among them (partition_candidates, partitioner.h, ranks them by other means than the closed
  // form). Default: plan()'s alone.
  virtual std::vector<CandidatePlan> candidates(const PartitionRequest& request, const Problem& problem) {
    return {plan(request, problem)};
  }
};

}  // namespace graphpipe::partition
