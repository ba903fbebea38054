#include "partition/replica_allocation.h"

#include <algorithm>
#include <numeric>

#include "cost/sync_kind.h"
#include "partition/evaluate.h"

namespace graphpipe::partition {

double replica_stage_time(const Problem& p, int level, double compute, double transfer, double cross_bytes,
                          double params) {
  if (level == 0) return compute + transfer;
  const ReplicaTable& table = *p.replicas;
  const int d = table.replicas(level);
  const double bandwidth = table.link_bandwidth();
  // Every crossing transfer keeps its latency; its bytes term shrinks to the share.
  const double saved = bandwidth > 0.0 ? cross_bytes / bandwidth * (1.0 - 1.0 / d) : 0.0;
  return compute + std::max(0.0, transfer - saved) +
         sync_estimate(p, d, params) / static_cast<double>(p.num_micro_batches);
}

double sync_estimate(const Problem& p, int d, double params) {
  const ReplicaTable& table = *p.replicas;
  // The default all-reduce of every parameter byte: the estimate the planner always used.
  if (cost::sync_kind_model(p.sync.kind).plain_all_reduce() && !p.sync.hierarchical &&
      p.sync_total.bytes == p.total_param_bytes) {
    return table.all_reduce_estimate(d, params);
  }
  if (d <= 1 || params <= 0.0 || p.total_param_bytes <= 0.0) return 0.0;
  const EstimatePricer pricer(table, p.model->devices(), d, p.sync.hierarchical);
  return cost::single_bucket_seconds(p.sync, p.sync_total.scaled(params / p.total_param_bytes), pricer);
}

namespace {

// The step and slowest stage of an evaluation, and the stage to grow: the worst overflow while
// the plan does not fit, else the slowest stage (by renumbered index).
struct Score {
  bool fits = false;
  double overflow = 0.0, step = 0.0, bottleneck = 0.0;
};

Score score(const Problem& p, const Evaluation& ev) {
  return {ev.fits(), std::max(0.0, ev.max_overflow), ev.iteration_seconds(p), ev.bottleneck};
}

}  // namespace

std::vector<int> allocate_replicas(const Problem& p, const std::vector<int>& assignment, std::vector<int> replicas,
                                   std::vector<std::vector<int>>* trail) {
  const int k = assignment.empty() ? 0 : *std::max_element(assignment.begin(), assignment.end()) + 1;
  if (replicas.empty()) replicas.assign(k, 1);
  if (!p.replicated()) return replicas;
  const ReplicaTable& table = *p.replicas;
  int used = std::accumulate(replicas.begin(), replicas.end(), 0);
  Evaluation ev = evaluate(p, assignment, replicas);
  if (!ev.acyclic) return replicas;
  // Renumbered stage -> input label.
  std::vector<int> label_of(k, 0);
  for (std::size_t v = 0; v < assignment.size(); ++v) label_of[ev.stage_of[v]] = assignment[v];
  Score now = score(p, ev);
  while (true) {
    // Stages to try, in order: the overflowing ones by overflow, or those as slow as the slowest.
    std::vector<int> order;
    for (int s = 0; s < k; ++s) {
      const StageFigures& f = ev.stages[s];
      if (!now.fits ? f.memory > p.memory_limit : f.time() >= ev.bottleneck * (1.0 - 1e-9)) order.push_back(s);
    }
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      return now.fits ? ev.stages[x].time() > ev.stages[y].time() : ev.stages[x].memory > ev.stages[y].memory;
    });
    // The stages are tried in an order that does not depend on the budget, and the allocation
    // stops at the first move the budget cannot pay for: with more devices the same moves are
    // made, then more, so the result is never slower (each move keeps or shortens the step).
    bool grown = false, over = false;
    for (int s : order) {
      const int label = label_of[s];
      const int level = table.level_of(replicas[label]);
      if (level + 1 >= table.num_levels()) {
        // The table stops at the device count (not at the micro-batch's rows): the next count
        // would exceed the budget.
        if (table.max_replicas() < p.micro_batch_size && replicas[label] < p.micro_batch_size) {
          over = true;
          break;
        }
        continue;
      }
      const int next = table.replicas(level + 1);
      if (used - replicas[label] + next > p.device_budget) {
        over = true;  // whether this move would pay cannot be told without the devices: stop here
        break;
      }
      std::vector<int> trial = replicas;
      trial[label] = next;
      Evaluation tried = evaluate(p, assignment, trial);
      Score then = score(p, tried);
      const bool better =
          now.fits ? then.fits && then.step <= now.step * (1.0 + 1e-12) &&
                         (then.step < now.step * (1.0 - 1e-12) || tried.stages[s].time() < ev.stages[s].time())
                   : then.overflow < now.overflow;
      if (!better) continue;
      used += next - replicas[label];
      if (trail) trail->push_back(replicas);
      replicas = std::move(trial);
      ev = std::move(tried);
      now = then;
      grown = true;
      break;
    }
    if (!grown || over) break;
  }
  return replicas;
}

std::pair<std::vector<int>, std::vector<int>> data_parallel_plan(const Problem& p) {
  std::vector<int> assignment(p.num_nodes(), 0);
  std::vector<int> best{1};
  if (!p.replicated()) return {assignment, best};
  const ReplicaTable& table = *p.replicas;
  Score top = score(p, evaluate(p, assignment, best));
  for (int level = 1; level < table.num_levels() && table.replicas(level) <= p.device_budget; ++level) {
    std::vector<int> trial{table.replicas(level)};
    Score s = score(p, evaluate(p, assignment, trial));
    const bool better = top.fits ? s.fits && predicted_faster(s.step, s.bottleneck, top.step, top.bottleneck)
                                 : s.overflow < top.overflow;
    if (better) {
      best = trial;
      top = s;
    }
  }
  return {assignment, best};
}

std::vector<std::vector<int>> data_parallel_counts(const Problem& p) {
  std::vector<std::vector<int>> counts{{1}};
  if (!p.replicated()) return counts;
  const ReplicaTable& table = *p.replicas;
  for (int level = 1; level < table.num_levels() && table.replicas(level) <= p.device_budget; ++level)
    counts.push_back({table.replicas(level)});
  return counts;
}

std::size_t fastest_candidate(const Problem& p, const std::vector<CandidatePlan>& candidates) {
  std::size_t best = 0;
  Score top;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Evaluation ev = evaluate(p, candidates[i].assignment, candidates[i].replicas, candidates[i].devices);
    Score s = score(p, ev);
    if (i == 0 || s.overflow < top.overflow ||
        (s.overflow == top.overflow && predicted_faster(s.step, s.bottleneck, top.step, top.bottleneck))) {
      best = i;
      top = s;
    }
  }
  return best;
}

}  // namespace graphpipe::partition
