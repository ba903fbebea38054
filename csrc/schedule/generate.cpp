#include "schedule/generate.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "common/names.h"
#include "plan/rank_sharing.h"
#include "schedule/list_scheduler.h"

namespace graphpipe::schedule {

using plan::Plan;

namespace {

void check_plan_shape(const Plan& plan) {
  const int S = static_cast<int>(plan.stages.size());
  if (S < 1) throw PlanningError("cannot schedule a plan without stages");
  if (plan.num_micro_batches < 1) {
    throw PlanningError("cannot schedule a plan with " + std::to_string(plan.num_micro_batches) +
                        " micro-batches; it needs at least one");
  }
  for (int s = 0; s < S; ++s) {
    if (plan.stages[s].id != s) {
      throw PlanningError("plan stage at index " + std::to_string(s) + " has id " + std::to_string(plan.stages[s].id) +
                          "; stage ids must be 0..S-1 in order");
    }
  }
  for (std::size_t e = 0; e < plan.edges.size(); ++e) {
    const auto& edge = plan.edges[e];
    if (edge.src < 0 || edge.dst >= S || edge.src >= edge.dst) {
      throw PlanningError("plan stage edge " + std::to_string(e) + " (" + std::to_string(edge.src) + "->" +
                          std::to_string(edge.dst) +
                          ") must join existing stages with src < dst (topological numbering)");
    }
  }
}

}  // namespace

const std::vector<PolicyTraits>& policies() {
  static const std::vector<PolicyTraits> rows = {
      {.policy = Policy::one_f_one_b, .name = "1f1b", .planner_weighs = true},
      {.policy = Policy::fill_drain, .name = "fill_drain", .whole_batch_in_flight = true},
      {.policy = Policy::one_f_one_b_greedy, .name = "1f1b_greedy", .greedy = true},
      {.policy = Policy::zb_graph, .name = "zb_graph", .greedy = true, .splits_backward = true, .planner_weighs = true},
  };
  return rows;
}

const PolicyTraits& traits(Policy policy) {
  for (const PolicyTraits& row : policies()) {
    if (row.policy == policy) return row;
  }
  throw PlanningError("schedule policy " + std::to_string(static_cast<int>(policy)) + " has no row in policies()");
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const PolicyTraits& row : policies()) names.emplace_back(row.name);
  return names;
}

Policy parse_policy(std::string_view name) {
  if (name == "gpipe") return Policy::fill_drain;
  for (const PolicyTraits& row : policies()) {
    if (name == row.name) return row.policy;
  }
  throw PlanningError("unknown schedule kind '" + std::string(name) + "' (expected " + list_names(policy_names()) +
                      ")");
}

std::string_view policy_name(Policy policy) { return traits(policy).name; }

std::vector<Policy> planner_policies() {
  std::vector<Policy> weighed;
  for (const PolicyTraits& row : policies()) {
    if (row.planner_weighs) weighed.push_back(row.policy);
  }
  return weighed;
}

std::vector<std::vector<int>> stage_ranks(const Plan& plan) {
  check_plan_shape(plan);
  std::vector<std::vector<int>> ranks;
  for (const auto& stage : plan.stages) {
    if (stage.devices.empty()) {
      throw ScheduleError("stage " + std::to_string(stage.id) + " has no device to run on");
    }
    for (int r : stage.devices) {
      if (r < 0) throw ScheduleError("stage " + std::to_string(stage.id) + " is on negative rank " + std::to_string(r));
    }
    ranks.push_back(stage.devices);
  }
  if (auto problem = plan::rank_sharing_problem(ranks)) throw ScheduleError(*problem);
  return ranks;
}

std::pair<double, double> backward_split(const plan::Stage& stage) {
  if (stage.backward_input_seconds > 0.0 || stage.backward_weight_seconds > 0.0) {
    return {stage.backward_input_seconds, stage.backward_weight_seconds};
  }
  // Not priced (a plan from before the split was): halves of the backward, a recomputed
  // forward to I, which runs first.
  const double again = stage.recompute ? std::min(stage.forward_seconds, stage.backward_seconds) : 0.0;
  const double half = (stage.backward_seconds - again) / 2.0;
  return {half + again, half};
}

std::vector<int> stages_to_sink(const Plan& plan) {
  check_plan_shape(plan);
  const int S = static_cast<int>(plan.stages.size());
  std::vector<std::vector<int>> successors(S);
  for (const auto& e : plan.edges) successors[e.src].push_back(e.dst);
  // Stages are numbered topologically, so walking them backwards visits every successor first:
  // the sink is settled first and the stage edges are walked in reverse.
  std::vector<int> h(S, 1);
  for (int s = S - 1; s >= 0; --s) {
    for (int d : successors[s]) h[s] = std::max(h[s], h[d] + 1);
  }
  return h;
}

std::vector<int> in_flight_limits(const Plan& plan, Policy policy) {
  const int M = static_cast<int>(plan.num_micro_batches);
  std::vector<int> limits = stages_to_sink(plan);
  for (int& w : limits) w = traits(policy).whole_batch_in_flight ? M : std::min(w, M);
  return limits;
}

Schedule generate(const Plan& plan, std::string_view policy) { return generate(plan, parse_policy(policy)); }

Schedule generate(const Plan& plan, Policy policy) {
  const std::vector<std::vector<int>> ranks_of = stage_ranks(plan);
  Schedule schedule = list_schedule(plan, policy, ranks_of);
  // Replicated stages: the replicas' gradients are summed right before the optimizer step (the
  // runtime starts the sum's buckets during the last backward already), and every replica runs
  // the lead's program.
  for (std::size_t s = 0; s < ranks_of.size(); ++s) {
    if (ranks_of[s].size() < 2) continue;
    auto& program = schedule.ranks[ranks_of[s].front()];
    auto step = std::find_if(program.begin(), program.end(),
                             [](const Instruction& i) { return i.kind == OpKind::optimizer_step; });
    program.insert(step, Instruction{OpKind::all_reduce, static_cast<int>(s), -1, -1});
    for (std::size_t k = 1; k < ranks_of[s].size(); ++k) schedule.ranks[ranks_of[s][k]] = program;
  }
  validate(schedule);
  return schedule;
}

}  // namespace graphpipe::schedule
