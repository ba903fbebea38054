// Generators: build a deadlock-free Schedule for a Plan.
//
// Policies
//   fill_drain   GPipe: every forward (micro-batch order), then every backward. All M
//                micro-batches are in flight at every stage at the peak.
//   1f1b         Graph-aware one-forward-one-backward. Each stage s gets an in-flight limit
//                W_s = min(h_s, M), where h_s is the number of stages on the longest path from s
//                to a sink (a sink has h = 1). h is computed sink first, walking the stage edges
//                in reverse topological order, so the limit accounts for *all* successors of a
//                stage, not only one. Each stage runs W_s forwards, then alternates one backward
//                and one forward, then drains its backwards: on a chain of S stages, h_i = S - i,
//                which is classic 1F1B exactly (Megatron's / torch.distributed.pipelining's
//                order) whatever the stage costs. Each backward runs as early as that order
//                allows, which frees activations early.
//   1f1b_greedy  Same limits, no fixed alternation: whenever a stage's rank is idle it runs its
//                next backward if that is ready, else its next forward if it is ready and the
//                stage holds fewer than W_s micro-batches. Adapts the order to the predicted
//                stage costs; on a chain with equal stages it coincides with 1f1b.
//   zb_graph     Zero-bubble on the stage DAG: every backward is split into I (the gradients of
//                the stage's inputs, which the stages upstream wait for) and W (those of its
//                weights, which nothing waits for). Whenever a stage's rank is idle it runs, in
//                this order of priority: its next I if that is ready (the critical path: every
//                stage upstream waits for it); else its next forward if it is ready, the stage
//                has fewer than W_s forwards without their I (1f1b's limit), and fewer than H_s
//                micro-batches held until their W (W frees what I kept; H_s is what the plan's
//                memory limit allows, weight_limits() in list_scheduler.cpp); else its oldest
//                pending W, unless that W would still run when the next I's gradients arrive
//                (known once every stage downstream has started that I): then it waits for the
//                I. So the W's fill the bubbles that the forward and input-gradient waves
//                leave, on every branch of the DAG, without delaying the critical path. On a
//                stage with no stage upstream nothing waits for its I, and its W's waiting only
//                lets forwards through sooner: the order where they do not wait is made too,
//                and the one whose timeline ends first is kept (list_scheduler.cpp). A stage
//                whose split costs more than its whole backward (I + W > B, as profiled) runs
//                whole backwards (B) instead where that ends the timeline sooner (tried in
//                groups, all such stages at once, then halves, ... down to single stages, at
//                most 32 list schedules), so a split that does not pay is not made. On a
//                chain with equal F, I and W times and memory for the W's, the iteration is
//                ZB-H1's (Qi et al., ICLR 2024): M (F + B) + (p - 1)(F + I - W). Durations: the
//                stage's own I and W (backward_split()).
// Per-stage micro-batch sizes (the paper's stages may use different sizes) are deferred: Plan
// carries a single micro_batch_size, and every policy here assumes it.
//
// How orders are made deadlock-free (docs/design.md §5): the generator list-schedules all tasks
// on a global timeline (stage costs from the plan, transfers taken as instantaneous), rank by
// rank in the policy's compute order. Every compute task and every transfer gets one position in
// one global sequence; each rank's program is its part of that sequence: the send and the
// receive of a transfer share a position. So every pair of ranks sees its transfers in the same
// order, and under the blocking model of check.h the earliest unfinished instruction of the
// sequence can always finish: the schedule completes. (The compute orders themselves cannot
// wait on each other in a cycle: with W_s >= W_succ + 1 on every edge, ordering forward(s, m) by
// 2m - h_s and backward(s, k) by 2k + h_s - 1 orders every dependency, including 1f1b's
// alternation.)
//
// Ranks: a stage runs on stage.devices, its lead first. A rank may hold several stages, each
// alone on it (ScheduleError where one of them is replicated): it runs their computes one at a
// time, the most urgent first (list_scheduler.cpp), and an edge between two of them is local,
// with no transfers (schedule.h). The programs are generated for the leads; a stage with several devices runs data
// parallel (schedule.h): its replicas get the lead's program, which has an all_reduce right
// before the optimizer step. The schedule has max(plan.num_devices, highest rank + 1) ranks;
// ranks without a stage get empty programs. Each stage's program ends with its optimizer step.
//
// Cost: O(T log T) for T = S * M * (2 + transfers per stage) tasks.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "schedule/schedule.h"

namespace graphpipe::schedule {

enum class Policy { fill_drain, one_f_one_b, one_f_one_b_greedy, zb_graph };

// What a policy is, asked of it rather than compared by name: kPolicies (generate.cpp) holds one
// row per Policy, the one list that the names, the parser, the list scheduler, the planner and
// the bindings read. A new schedule is an enum value, its row, and what the list scheduler does
// differently for it (docs/extending.md).
struct PolicyTraits {
  Policy policy;
  std::string_view name;               // what users write: "1f1b", "fill_drain", "1f1b_greedy", "zb_graph"
  bool greedy = false;                 // a rank runs whatever is ready instead of waiting for 1F1B's order
  bool splits_backward = false;        // backwards as I (input gradients) and W (weight gradients)
  bool whole_batch_in_flight = false;  // every micro-batch's forward before any backward
  bool planner_weighs = false;         // schedule="auto": the planner weighs plans under it
};

// Every policy's row, in the order users read them: "1f1b", "fill_drain", "1f1b_greedy",
// "zb_graph".
const std::vector<PolicyTraits>& policies();
const PolicyTraits& traits(Policy policy);
// The policies' names, in policies()' order.
std::vector<std::string> policy_names();
// A name from policy_names() (or "gpipe", fill_drain's other name); throws PlanningError naming
// the choices.
Policy parse_policy(std::string_view name);
std::string_view policy_name(Policy policy);
// What schedule="auto" weighs: the policies whose planner_weighs is set.
std::vector<Policy> planner_policies();

// Ranks of each stage (its devices, lead first); throws ScheduleError when a stage has no device
// or shares a rank with another where either is replicated, PlanningError when the plan's
// stages or edges are malformed.
std::vector<std::vector<int>> stage_ranks(const plan::Plan& plan);
// The predicted seconds of a stage's backward halves, I (input gradients) and W (weight
// gradients), for one micro-batch: the stage's own Stage::backward_input_seconds and
// backward_weight_seconds, priced by the planner from its operators' (partition/backward_halves.h;
// their sum may exceed backward_seconds: the runtime's W walks activation gradients again). A
// stage without them (both 0: a plan from before they existed, or a stage built by hand) gets
// half of its backward each; a recomputed stage's forward, which backward_seconds includes, then
// goes to I, which runs it first.
std::pair<double, double> backward_split(const plan::Stage& stage);
// h_s: stages on the longest path from s to a sink, s included.
std::vector<int> stages_to_sink(const plan::Plan& plan);
// The most micro-batches each stage may hold (forward done, backward not yet) under `policy`.
std::vector<int> in_flight_limits(const plan::Plan& plan, Policy policy);

Schedule generate(const plan::Plan& plan, Policy policy);
Schedule generate(const plan::Plan& plan, std::string_view policy);

}  // namespace graphpipe::schedule
