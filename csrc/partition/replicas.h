// Replica figures: what a stage costs when it runs as d data-parallel replicas
// (docs/design.md, "Replicated stages in the planner").
//
// A replica of a stage with d devices runs every micro-batch of b rows on a shard of
// ceil(b / d) rows (the largest shard of torch.tensor_split's split; plan.h). Its compute is the
// cost model's per-operator time at that many rows, its activations scale with the rows, it
// holds the stage's whole static memory, and once per iteration the replicas sum their
// gradients (all_reduce.h). Many replica counts share one shard size (b = 8: d = 5..7 all give
// 2 rows), and a replica count above b leaves a replica without rows, so the counts a planner
// weighs are the least d of each shard size, d <= min(devices, b): the table's "levels".
//
// ReplicaTable holds, for one micro-batch size, every operator's forward and backward time (and
// the backward's halves) at each level's shard, and fast estimates of the collectives
// (all-reduce, all-gather) of B bytes over d devices that the partitioners' inner loops use to
// price a stage's sync (the figures of a finished plan price it on the stage's real device group;
// evaluate.h). Building it is
// O(levels x V + R^2 log R) for R replica counts; each query is O(1).
#pragma once

#include <cstdint>
#include <vector>

#include "cost/cost_model.h"
#include "cost/sync_cost.h"

namespace graphpipe::partition {

// Rows of the largest shard when `rows` are split into `replicas` shards: ceil(rows / replicas).
inline std::int64_t shard_rows(std::int64_t rows, int replicas) { return (rows + replicas - 1) / replicas; }

class ReplicaTable {
 public:
  // Replica counts 1..min(max_devices, micro_batch) for the model's graph.
  ReplicaTable(const cost::CostModel& model, std::int64_t micro_batch, int max_devices);

  int max_replicas() const { return max_replicas_; }
  int num_levels() const { return static_cast<int>(replicas_.size()); }
  // Level l's replica count (the least d with that shard), ascending; level 0 is d = 1.
  int replicas(int level) const { return replicas_[level]; }
  std::int64_t rows(int level) const { return rows_[level]; }
  // The level of d replicas (the level whose shard d gives), 1 <= d <= max_replicas().
  int level_of(int d) const { return level_of_[d]; }
  double forward(int level, int node) const { return forward_[level][node]; }
  double backward(int level, int node) const { return backward_[level][node]; }
  double compute(int level, int node) const { return forward_[level][node] + backward_[level][node]; }
  // The backward's halves (CostModel::backward_input/weight_seconds) at the level's shard.
  double backward_input(int level, int node) const { return input_[level][node]; }
  double backward_weight(int level, int node) const { return weight_[level][node]; }
  // The fraction of a micro-batch's rows the largest shard holds: what activations and the bytes
  // a replica receives scale by.
  double row_fraction(int level) const { return static_cast<double>(rows_[level]) / static_cast<double>(rows_[0]); }
  // An upper estimate of best_all_reduce(devices, {0..d-1}, bytes): d contiguous ranks, a node's
  // worth at a time, as placement (placement.h) tries to give a stage. Exact where the all-reduce
  // is affine in the bytes (one kind of link on the ring's slowest step, as in the presets).
  double all_reduce_estimate(int d, double bytes) const;
  // The same kind of estimate for the algorithms cost::GroupPricer uses: the all-reduce forced
  // hierarchical or by the cheaper algorithm, the all-gather by the ring or forced hierarchical.
  double all_reduce_estimate(int d, double bytes, bool hierarchical) const;
  double all_gather_estimate(int d, double bytes, bool hierarchical) const;
  // The slowest link's bandwidth (CostModel::transfer_seconds' figure), kept here because
  // Devices::slowest_link_bandwidth scans every pair and the DPs ask for it per stage.
  double link_bandwidth() const { return link_bandwidth_; }

 private:
  struct Line {
    double fixed = 0.0, per_byte = 0.0;
  };
  int max_replicas_ = 1;
  double link_bandwidth_ = 0.0;
  std::vector<int> replicas_;
  std::vector<std::int64_t> rows_;
  std::vector<int> level_of_;
  std::vector<std::vector<double>> forward_, backward_, input_, weight_;
  // Per d: for ring and hierarchical, two lines (through small and through large buffers)
  // whose max bounds that algorithm's convex, piecewise-affine cost from above.
  std::vector<std::vector<Line>> all_reduce_, all_gather_;
  static double chords(const std::vector<Line>& lines, std::size_t first, std::size_t last, double bytes);
};

// The table's collective estimates for a stage of d replicas, as a cost::CollectivePricer, so
// that the planner's inner loops price a sync method by the same rules as the plan's figures.
class EstimatePricer final : public cost::CollectivePricer {
 public:
  EstimatePricer(const ReplicaTable& table, const cost::Devices& devices, int replicas, bool hierarchical)
      : table_(&table), devices_(&devices), replicas_(replicas), hierarchical_(hierarchical) {}
  int replicas() const override { return replicas_; }
  const cost::Devices& devices() const override { return *devices_; }
  cost::AllReduceCost all_reduce(double bytes) const override;
  cost::AllReduceCost all_gather(double bytes) const override;

 private:
  const ReplicaTable* table_;
  const cost::Devices* devices_;
  int replicas_;
  bool hierarchical_;
};

}  // namespace graphpipe::partition
