#include "partition/partitioner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "common/error.h"
#include "common/log.h"
#include "graph/series_parallel.h"
#include "partition/downset.h"
#include "partition/evaluate.h"
#include "partition/graphpipe_dp.h"
#include "partition/metis.h"
#include "partition/plan_build.h"
#include "partition/problem.h"
#include "partition/refine.h"
#include "partition/sequential.h"

namespace graphpipe::partition {

namespace {

std::string gib(double bytes) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.3g GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buffer;
}

std::int64_t resolve_batch(const graph::OpGraph& g, const Options& o) {
  std::int64_t batch = o.batch_size ? o.batch_size : g.trace_batch_size;
  if (batch < 1) throw PlanningError("the mini-batch size must be at least 1, found " + std::to_string(batch));
  return batch;
}

std::int64_t resolve_micro_batch(std::int64_t batch, const Options& o) {
  if (o.micro_batch_size < 0 || o.num_micro_batches < 0) {
    throw PlanningError("micro_batch_size and num_micro_batches must not be negative");
  }
  std::int64_t fixed = o.micro_batch_size;
  if (o.num_micro_batches) {
    if (batch % o.num_micro_batches != 0) {
      throw PlanningError(std::to_string(o.num_micro_batches) + " micro-batches do not divide the mini-batch of " +
                          std::to_string(batch));
    }
    std::int64_t derived = batch / o.num_micro_batches;
    if (fixed && fixed != derived) {
      throw PlanningError("micro_batch_size " + std::to_string(fixed) + " and num_micro_batches " +
                          std::to_string(o.num_micro_batches) + " disagree for a mini-batch of " +
                          std::to_string(batch));
    }
    fixed = derived;
  }
  return fixed;
}

void check_inputs(const graph::OpGraph& g, const cost::Devices& devices, const Options& o) {
  if (g.num_nodes() == 0) throw PlanningError("cannot partition an empty graph");
  g.validate();  // GraphError naming a cycle
  if (devices.count < 1) {
    throw PlanningError("cannot partition onto " + std::to_string(devices.count) + " devices: at least 1 is needed");
  }
  if (static_cast<std::size_t>(devices.count) > g.num_nodes()) {
    throw PlanningError(std::to_string(devices.count) + " devices but the graph has only " +
                        std::to_string(g.num_nodes()) +
                        " operators: every stage needs an operator and data parallelism inside a "
                        "stage is not supported yet; use at most " + std::to_string(g.num_nodes()) + " devices");
  }
  auto names = partitioner_names();
  if (std::find(names.begin(), names.end(), o.partitioner) == names.end()) {
    throw PlanningError("unknown partitioner '" + o.partitioner + "': choose graphpipe, metis, sequential or manual");
  }
  if (o.max_stages < 0) throw PlanningError("max_stages must not be negative");
  if (!(o.tolerance > 0.0)) throw PlanningError("the binary-search tolerance must be positive");
}

// A clear message when no arrangement can fit: one operator too large, or the sum of static
// memory larger than all devices together.
void check_memory_bounds(const cost::CostModel& model, double limit, int devices) {
  const graph::OpGraph& g = model.graph();
  double total = 0.0;
  for (graph::NodeId v = 0; v < static_cast<graph::NodeId>(g.num_nodes()); ++v) {
    double need = model.static_bytes(v);
    total += need;
    if (need > limit) {
      throw PlanningError("the model does not fit: operator " + graph::describe(g, v) + " alone needs " +
                          gib(need) + " for weights, gradients and optimizer state, more than the memory limit of " +
                          gib(limit) + " per device (over by " + gib(need - limit) + ")");
    }
  }
  if (total > limit * devices) {
    throw PlanningError("the model does not fit: weights, gradients and optimizer state need " + gib(total) +
                        ", " + std::to_string(devices) + " devices of " + gib(limit) + " hold " +
                        gib(limit * devices) + " (over by " + gib(total - limit * devices) + ")");
  }
}

// The candidate with the least predicted step among those that fit (the least overflow if none
// fits), then the lower bottleneck, then the earlier one (determinism).
std::size_t best_by_step(const Problem& problem, const std::vector<std::vector<int>>& candidates) {
  std::size_t best = 0;
  double best_overflow = 0.0, best_step = 0.0, best_bottleneck = 0.0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Evaluation ev = evaluate(problem, candidates[i]);
    double overflow = std::max(ev.max_overflow, 0.0);
    double step = ev.iteration_seconds(problem);
    bool better = i == 0 || overflow < best_overflow ||
                  (overflow == best_overflow && (step < best_step * (1.0 - 1e-12) ||
                                                 (step <= best_step * (1.0 + 1e-12) && ev.bottleneck < best_bottleneck)));
    if (better) {
      best = i;
      best_overflow = overflow;
      best_step = step;
      best_bottleneck = ev.bottleneck;
    }
  }
  return best;
}

// Refines every start and keeps the best: fits in memory first, then the lower bottleneck,
// then the earlier start (determinism).
std::vector<int> best_start(const Problem& problem, const std::vector<std::vector<int>>& starts, bool refine_them) {
  std::vector<int> best;
  double best_overflow = 0.0, best_bottleneck = 0.0;
  for (const auto& start : starts) {
    std::vector<int> candidate = refine_them ? refine(problem, start) : start;
    Evaluation ev = evaluate(problem, candidate);
    double overflow = std::max(ev.max_overflow, 0.0);
    if (best.empty() || overflow < best_overflow ||
        (overflow == best_overflow && ev.bottleneck < best_bottleneck)) {
      best = std::move(candidate);
      best_overflow = overflow;
      best_bottleneck = ev.bottleneck;
    }
  }
  return best;
}

// The operators in the series-parallel tree's order: series children in turn, and each parallel
// node's branches one after another, largest compute first (or smallest first), so that every
// branch is a contiguous run. A topological order.
std::vector<graph::NodeId> branch_order(const Problem& p, const graph::SPTree& tree, bool smallest_first) {
  std::vector<double> weight(tree.nodes.size(), 0.0);
  for (std::size_t t = 0; t < tree.nodes.size(); ++t) {
    const graph::SPNode& node = tree.nodes[t];
    if (node.kind == graph::SPNode::Kind::leaf) weight[t] = p.compute[node.op];
    for (int c : node.children) weight[t] += weight[c];  // children come before their parent
  }
  std::vector<graph::NodeId> order;
  order.reserve(p.num_nodes());
  std::vector<int> todo{tree.root};
  while (!todo.empty()) {
    const graph::SPNode& node = tree.nodes[todo.back()];
    todo.pop_back();
    if (node.kind == graph::SPNode::Kind::leaf) {
      order.push_back(node.op);
      continue;
    }
    std::vector<int> children = node.children;
    if (node.kind == graph::SPNode::Kind::parallel) {
      std::stable_sort(children.begin(), children.end(), [&](int a, int b) {
        return smallest_first ? weight[a] < weight[b] : weight[a] > weight[b];
      });
    }
    todo.insert(todo.end(), children.rbegin(), children.rend());
  }
  return order;
}

// The sequential DP's cut of `order` (instead of the graph's own topological order).
std::vector<int> chain_along(Problem p, std::vector<graph::NodeId> order) {
  p.order = std::move(order);
  for (std::size_t i = 0; i < p.order.size(); ++i) p.position[p.order[i]] = static_cast<int>(i);
  return sequential_assignment(p);
}

}  // namespace

std::vector<std::string> partitioner_names() { return {"graphpipe", "metis", "sequential", "manual"}; }

Plan partition(const graph::OpGraph& g, const cost::Devices& devices, const Options& o) {
  check_inputs(g, devices, o);
  cost::CostModel model(g, devices, o.optimizer);
  const std::int64_t batch = resolve_batch(g, o);
  const auto candidates = micro_batch_candidates(batch, resolve_micro_batch(batch, o));
  const double limit = o.memory_limit > 0.0 ? o.memory_limit : devices.memory_bytes;
  if (o.memory_limit < 0.0) throw PlanningError("memory_limit must not be negative");
  const int max_stages = std::min(o.max_stages > 0 ? std::min(o.max_stages, devices.count) : devices.count,
                                  static_cast<int>(g.num_nodes()));
  check_memory_bounds(model, limit, max_stages);

  auto problem_for = [&](std::int64_t mb) {
    Problem problem = make_problem(model, batch, mb, max_stages, limit, o.in_flight);
    problem.chain = o.partitioner == "sequential";
    return problem;
  };
  std::string name = o.partitioner;
  std::optional<graph::SPDecomposition> sp;
  std::vector<int> manual_base;
  if (o.partitioner == "graphpipe") {
    sp = graph::decompose_series_parallel(g);
    if (!sp->is_series_parallel) {
      log::info("graphpipe: the graph is not series-parallel (" + sp->report + "); falling back to the better of metis and a refined topological-order DP");
      name = "graphpipe(fallback)";
    }
  }
  std::vector<std::vector<int>> metis_starts;
  // graphpipe without a usable tree: the better of METIS's start and the topological-order DP's
  // (sequential) start, both refined.
  // On a small graph the exact down-set plans join in, judged by the predicted step; `used`
  // names what won.
  auto fallback = [&](const Problem& problem, const std::vector<std::vector<int>>& metis, std::string& used) {
    std::vector<std::vector<int>> starts = metis;
    std::vector<int> chain = sequential_assignment(problem);
    if (!chain.empty()) starts.push_back(std::move(chain));
    std::vector<std::vector<int>> options{best_start(problem, starts, o.refine)};
    for (std::vector<int>& exact : downset_plans(problem)) options.push_back(std::move(exact));
    const std::size_t pick = best_by_step(problem, options);
    used = pick == 0 ? "graphpipe(fallback)" : "graphpipe(downset)";
    return std::move(options[pick]);
  };
  auto make_metis_starts = [&](const Problem& problem) {
    metis_starts.push_back(metis_assignment(problem, max_stages, o.seed));
  };
  if (o.partitioner == "metis" || (sp && !sp->is_series_parallel)) {
    make_metis_starts(problem_for(candidates[candidates.size() / 2]));
  }
  if (o.partitioner == "manual") manual_base = manual_assignment(g, o.manual, devices.count);

  struct Best {
    std::vector<int> assignment;
    std::int64_t mb = 0;
    double iteration = std::numeric_limits<double>::infinity();
    double bottleneck = 0.0;
    std::string name;
  } best;
  double least_overflow = std::numeric_limits<double>::infinity();
  double overflow_need = 0.0;
  int overflow_stage = -1;
  std::int64_t overflow_mb = 0;
  for (std::int64_t mb : candidates) {
    Problem problem = problem_for(mb);
    std::vector<int> assignment;
    std::string used = name;
    if (o.partitioner == "sequential") {
      assignment = sequential_assignment(problem);
    } else if (o.partitioner == "manual") {
      assignment = manual_base;
    } else if (o.partitioner == "metis") {
      assignment = best_start(problem, metis_starts, o.refine);
    } else if (!sp->is_series_parallel) {
      assignment = fallback(problem, metis_starts, used);
    } else {
      auto dp = graphpipe_assignments(problem, sp->tree, o.tolerance);
      if (!dp.empty()) {
        // Candidates, the DP's first: its plans (least bottleneck first, then the shallower
        // ones), the first refined; then cuts of three topological orders evaluated as graphs
        // (the graph's own order, and the tree's order with each parallel node's branches one
        // after another, largest or smallest first), each as is and refined. The DP's family
        // does not hold every convex partition (a stage with the tail of one branch and the head
        // of the next, for example), and such cuts do. Refinement lowers the bottleneck but may
        // deepen the stage graph, so the predicted step decides (ties: the earlier candidate).
        std::vector<std::vector<int>> options = dp;
        if (o.refine) options.push_back(refine(problem, dp.front()));
        const std::size_t chains_from = options.size();
        for (int order = 0; order < 3; ++order) {
          std::vector<int> chain = order == 0 ? sequential_assignment(problem)
                                              : chain_along(problem, branch_order(problem, sp->tree, order == 2));
          if (chain.empty()) continue;
          options.push_back(chain);
          if (o.refine) options.push_back(refine(problem, chain));
        }
        const std::size_t exact_from = options.size();
        for (std::vector<int>& exact : downset_plans(problem)) options.push_back(std::move(exact));
        const std::size_t pick = best_by_step(problem, options);
        assignment = std::move(options[pick]);
        if (pick >= exact_from) {
          used = "graphpipe(downset)";
        } else if (pick >= chains_from) {
          used = "graphpipe(chain)";
        }
      } else {
        if (metis_starts.empty()) make_metis_starts(problem);
        assignment = fallback(problem, metis_starts, used);
      }
    }
    if (assignment.empty()) {
      // Sequential found no chain that fits; evaluate the single-stage plan for the message.
      assignment.assign(g.num_nodes(), 0);
    }
    Evaluation ev = evaluate(problem, assignment);
    if (!ev.acyclic) {
      build_plan(problem, assignment, used);  // throws, naming the cycle
    }
    if (!ev.fits()) {
      if (ev.max_overflow < least_overflow) {
        least_overflow = ev.max_overflow;
        overflow_stage = ev.worst_memory_stage;
        overflow_need = ev.stages[ev.worst_memory_stage].memory;
        overflow_mb = mb;
      }
      continue;
    }
    double iteration = ev.iteration_seconds(problem);
    bool better = iteration < best.iteration * (1.0 - 1e-12) ||
                  (iteration <= best.iteration * (1.0 + 1e-12) && ev.bottleneck < best.bottleneck);
    if (best.assignment.empty() || better) {
      best = {std::move(assignment), mb, iteration, ev.bottleneck, used};
    }
  }
  if (best.assignment.empty()) {
    throw PlanningError("the model does not fit in memory: the best " + o.partitioner + " plan (micro-batch size " +
                        std::to_string(overflow_mb) + ") needs " + gib(overflow_need) + " on stage " +
                        std::to_string(overflow_stage) + ", the limit is " + gib(limit) + " per device (over by " +
                        gib(least_overflow) +
                        "); use more devices, a larger memory limit, smaller micro-batches or an optimizer with less state");
  }
  Plan plan = build_plan(problem_for(best.mb), best.assignment, best.name);
  log::info(best.name + ": " + std::to_string(plan.stages.size()) + " stages, depth " + std::to_string(plan.depth) +
            ", micro-batch " + std::to_string(plan.micro_batch_size));
  return plan;
}

}  // namespace graphpipe::partition
