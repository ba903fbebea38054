#include "planner/retime.h"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/cost_model.h"
#include "partition/plan_build.h"
#include "partition/problem.h"
#include "partition/replicas.h"
#include "plan/plan_io.h"
#include "schedule/generate.h"

namespace graphpipe::planner {

namespace {

// The highest rank any stage of `plan` runs on, plus one.
int ranks_used(const plan::Plan& plan) {
  int used = 0;
  for (const plan::Stage& s : plan.stages) {
    for (int d : s.devices) used = std::max(used, d + 1);
  }
  return used;
}

// The question the plan answered, at its micro-batch size, on `model`'s figures: what the
// manual partitioner's driver asks of a layout with given ranks (partitioner_interface.h).
partition::Problem problem_of(const plan::Plan& plan, const cost::CostModel& model, const cost::Devices& devices) {
  const double limit = plan.memory_limit_bytes > 0.0 ? plan.memory_limit_bytes : devices.memory_bytes;
  partition::Problem p =
      partition::make_problem(model, plan.batch_size, plan.micro_batch_size, devices.count, limit, {});
  p.chain = plan.chain;
  p.zero_bubble = schedule::traits(schedule::parse_policy(plan.schedule)).splits_backward;
  // Every stage's ranks are given, as a manual plan's stage_devices give them: the replica
  // figures (shards, the sync's price) are the ones a replicated stage is evaluated with.
  p.replicas = std::make_shared<const partition::ReplicaTable>(model, plan.micro_batch_size, devices.count);
  p.device_budget = devices.count;
  partition::set_sync(p, plan.sync);
  return p;
}

void check_same_decisions(const plan::Plan& before, const plan::Plan& after) {
  if (after.stages.size() != before.stages.size()) {
    throw PlanningError("retime: the plan's " + std::to_string(before.stages.size()) + " stages evaluate as " +
                        std::to_string(after.stages.size()));
  }
  for (std::size_t s = 0; s < before.stages.size(); ++s) {
    const plan::Stage& b = before.stages[s];
    const plan::Stage& a = after.stages[s];
    if (a.nodes != b.nodes || a.devices != b.devices) {
      throw PlanningError("retime: stage " + std::to_string(s) +
                          " would be renumbered (the plan's stages are not in the evaluator's topological order)");
    }
    if (a.recompute != b.recompute) {
      throw PlanningError("retime: stage " + std::to_string(s) + (b.recompute ? " recomputes" : " keeps") +
                          " its activations in the plan, but on these devices it would " +
                          (a.recompute ? "have to recompute them" : "keep them") +
                          " (another memory figure): that is another plan; plan again instead");
    }
  }
}

}  // namespace

plan::Plan retime(const plan::Plan& plan, const graph::OpGraph& graph, const cost::Devices& devices) {
  plan::validate_plan(plan, graph);  // another graph, or a plan that does not hold: PlanningError
  if (ranks_used(plan) > devices.count) {
    throw PlanningError("retime: the plan runs on " + std::to_string(ranks_used(plan)) +
                        " ranks but the devices describe " + std::to_string(devices.count));
  }
  const cost::CostModel model(graph, devices, cost::parse_optimizer(plan.optimizer));
  const partition::Problem problem = problem_of(plan, model, devices);
  std::vector<int> assignment(graph.num_nodes(), -1);
  std::vector<int> replicas;
  std::vector<std::vector<int>> ranks;
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    for (graph::NodeId v : plan.stages[s].nodes) assignment[static_cast<std::size_t>(v)] = static_cast<int>(s);
    replicas.push_back(static_cast<int>(plan.stages[s].devices.size()));
    ranks.push_back(plan.stages[s].devices);
  }
  plan::Plan out = partition::build_plan(problem, assignment, plan.partitioner, replicas, ranks);
  check_same_decisions(plan, out);
  // What the planner decided after the partition (planner.cpp, folded_search.cpp): kept.
  out.fold = plan.fold;
  out.schedule = plan.schedule;
  return out;
}

}  // namespace graphpipe::planner
