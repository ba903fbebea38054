#include "schedule/generate.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <string>

#include "common/error.h"
#include "common/names.h"

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
      throw PlanningError("plan stage at index " + std::to_string(s) + " has id " +
                          std::to_string(plan.stages[s].id) + "; stage ids must be 0..S-1 in order");
    }
  }
  for (std::size_t e = 0; e < plan.edges.size(); ++e) {
    const auto& edge = plan.edges[e];
    if (edge.src < 0 || edge.dst >= S || edge.src >= edge.dst) {
      throw PlanningError("plan stage edge " + std::to_string(e) + " (" + std::to_string(edge.src) +
                          "->" + std::to_string(edge.dst) +
                          ") must join existing stages with src < dst (topological numbering)");
    }
  }
}

// One stage's compute order under a fixed-order policy: W forwards, then alternate one backward
// and one forward, then the remaining backwards. W = M gives fill-drain.
std::vector<Instruction> fixed_order(int stage, int M, int W) {
  std::vector<Instruction> order;
  order.reserve(2 * static_cast<std::size_t>(M));
  for (int m = 0; m < W; ++m) order.push_back({OpKind::forward, stage, m, -1});
  for (int k = 0; k < M; ++k) {
    order.push_back({OpKind::backward, stage, k, -1});
    if (W + k < M) order.push_back({OpKind::forward, stage, W + k, -1});
  }
  return order;
}

enum EventType { kFinishForward, kFinishBackward, kFinishOptimizer, kFinishWeight };

struct Event {
  double time;
  long seq;
  EventType type;
  int index;  // stage for finishes, edge for arrivals
  int micro_batch;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy, Policy::zb_graph}) {
    names.emplace_back(policy_name(p));
  }
  return names;
}

Policy parse_policy(std::string_view name) {
  if (name == "gpipe") return Policy::fill_drain;
  for (Policy p : {Policy::one_f_one_b, Policy::fill_drain, Policy::one_f_one_b_greedy, Policy::zb_graph}) {
    if (name == policy_name(p)) return p;
  }
  throw PlanningError("unknown schedule kind '" + std::string(name) + "' (expected " + list_names(policy_names()) +
                      ")");
}

std::string_view policy_name(Policy policy) {
  switch (policy) {
    case Policy::fill_drain: return "fill_drain";
    case Policy::one_f_one_b: return "1f1b";
    case Policy::one_f_one_b_greedy: return "1f1b_greedy";
    case Policy::zb_graph: return "zb_graph";
  }
  return "?";
}

std::vector<std::vector<int>> stage_ranks(const Plan& plan) {
  check_plan_shape(plan);
  std::vector<std::vector<int>> ranks;
  std::vector<int> owner;
  for (const auto& stage : plan.stages) {
    if (stage.devices.empty()) {
      throw ScheduleError("stage " + std::to_string(stage.id) + " has no device to run on");
    }
    for (int r : stage.devices) {
      if (r < 0) throw ScheduleError("stage " + std::to_string(stage.id) + " is on negative rank " + std::to_string(r));
      if (static_cast<std::size_t>(r) >= owner.size()) owner.resize(r + 1, -1);
      if (owner[r] >= 0) {
        throw ScheduleError("stages " + std::to_string(owner[r]) + " and " + std::to_string(stage.id) +
                            " both run on rank " + std::to_string(r) +
                            ": the schedulers support one stage per rank for now; give each stage "
                            "its own devices");
      }
      owner[r] = stage.id;
    }
    ranks.push_back(stage.devices);
  }
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

namespace {

// zb_graph: the most micro-batches a stage may hold from its forward to the end of its W. A W
// can wait, but what its I kept (the activations the weight gradients need) is held meanwhile,
// so the plan's memory limit bounds how many: (limit - static bytes) / activation bytes, at
// least the 1F1B limit (which the plan was made to fit), all M when the plan gives no limit.
// (Counting a whole micro-batch's activations until its W overstates what W needs, so the
// bound is safe.)
std::vector<int> weight_limits(const Plan& plan, const std::vector<int>& limit) {
  const int M = static_cast<int>(plan.num_micro_batches);
  std::vector<int> out(limit.size());
  for (std::size_t s = 0; s < limit.size(); ++s) {
    const auto& st = plan.stages[s];
    int allowed = M;
    if (plan.memory_limit_bytes > 0.0 && st.activation_bytes > 0.0) {
      const double fits = std::floor((plan.memory_limit_bytes - st.static_bytes) / st.activation_bytes);
      allowed = fits > static_cast<double>(M) ? M : static_cast<int>(std::max(0.0, fits));
    }
    out[s] = std::max(limit[s], std::min(M, allowed));
  }
  return out;
}

}  // namespace

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
  for (int& w : limits) w = policy == Policy::fill_drain ? M : std::min(w, M);
  return limits;
}

Schedule generate(const Plan& plan, std::string_view policy) {
  return generate(plan, parse_policy(policy));
}

Schedule generate(const Plan& plan, Policy policy) {
  const std::vector<std::vector<int>> ranks_of = stage_ranks(plan);
  std::vector<int> rank_of;  // each stage's lead: the programs are made for the leads
  int highest_rank = 0;
  for (const auto& ranks : ranks_of) {
    rank_of.push_back(ranks.front());
    highest_rank = std::max(highest_rank, *std::max_element(ranks.begin(), ranks.end()));
  }
  const std::vector<int> limit = in_flight_limits(plan, policy);
  const int S = static_cast<int>(plan.stages.size());
  const int M = static_cast<int>(plan.num_micro_batches);
  const int E = static_cast<int>(plan.edges.size());

  Schedule schedule;
  schedule.kind = std::string(policy_name(policy));
  schedule.num_micro_batches = M;
  schedule.stage_ranks = ranks_of;
  for (const auto& e : plan.edges) schedule.edges.push_back({e.src, e.dst});
  int num_ranks = std::max(plan.num_devices, highest_rank + 1);
  schedule.ranks.assign(num_ranks, {});

  std::vector<std::vector<int>> in_edges(S), out_edges(S);
  for (int e = 0; e < E; ++e) {
    out_edges[plan.edges[e].src].push_back(e);
    in_edges[plan.edges[e].dst].push_back(e);
  }

  // Per (stage, micro-batch): inputs still missing for the forward, gradients still missing for
  // the backward, forward finished.
  auto at = [M](int s, int m) { return static_cast<std::size_t>(s) * M + m; };
  std::vector<int> missing_inputs(static_cast<std::size_t>(S) * M), missing_grads(missing_inputs.size());
  std::vector<char> forward_done(missing_inputs.size(), 0);
  for (int s = 0; s < S; ++s) {
    for (int m = 0; m < M; ++m) {
      missing_inputs[at(s, m)] = static_cast<int>(in_edges[s].size());
      missing_grads[at(s, m)] = static_cast<int>(out_edges[s].size());
    }
  }
  const bool greedy = policy == Policy::one_f_one_b_greedy || policy == Policy::zb_graph;
  const bool split = policy == Policy::zb_graph;
  std::vector<std::vector<Instruction>> order(S);
  if (!greedy) {
    for (int s = 0; s < S; ++s) order[s] = fixed_order(s, M, limit[s]);
  }
  std::vector<std::size_t> next(S, 0);            // fixed order: position in order[s]
  std::vector<int> forwards(S, 0), backwards(S, 0);  // dispatched so far
  std::vector<int> backwards_done(S, 0);
  std::vector<int> weights(S, 0), weights_done(S, 0);  // zb_graph: W dispatched and finished
  std::vector<double> input_finish(S, 0.0);  // zb_graph: when the stage's running I ends
  const std::vector<int> held_limit = split ? weight_limits(plan, limit) : std::vector<int>{};
  std::vector<char> busy(S, 0), optimizer_done(S, 0);

  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  long seq = 0;
  auto emit = [&](int stage, const Instruction& i) { schedule.ranks[rank_of[stage]].push_back(i); };

  auto ready = [&](const Instruction& i) {
    if (i.kind == OpKind::forward) return missing_inputs[at(i.stage, i.micro_batch)] == 0;
    return forward_done[at(i.stage, i.micro_batch)] && missing_grads[at(i.stage, i.micro_batch)] == 0;
  };
  auto start = [&](int s, const Instruction& i, double t) {
    emit(s, i);
    busy[s] = 1;
    const auto& stage = plan.stages[s];
    if (i.kind == OpKind::forward) {
      ++forwards[s];
      events.push({t + stage.forward_seconds, seq++, kFinishForward, s, i.micro_batch});
    } else if (i.kind == OpKind::backward) {
      ++backwards[s];
      events.push({t + stage.backward_seconds, seq++, kFinishBackward, s, i.micro_batch});
    } else if (i.kind == OpKind::backward_input) {
      ++backwards[s];
      input_finish[s] = t + backward_split(stage).first;
      events.push({input_finish[s], seq++, kFinishBackward, s, i.micro_batch});
    } else if (i.kind == OpKind::backward_weight) {
      ++weights[s];
      events.push({t + backward_split(stage).second, seq++, kFinishWeight, s, i.micro_batch});
    } else {
      events.push({t, seq++, kFinishOptimizer, s, -1});
    }
  };
  auto dispatch = [&](int s, double t) {
    if (busy[s]) return;
    if ((split ? weights_done[s] : backwards_done[s]) == M) {
      if (!optimizer_done[s]) {
        optimizer_done[s] = 1;
        start(s, {OpKind::optimizer_step, s, -1, -1}, t);
      }
      return;
    }
    if (!greedy) {
      if (next[s] < order[s].size() && ready(order[s][next[s]])) start(s, order[s][next[s]++], t);
      return;
    }
    // zb_graph: I before F before W (generate.h).
    Instruction b{split ? OpKind::backward_input : OpKind::backward, s, backwards[s], -1};
    if (backwards[s] < M && backwards[s] < forwards[s] && ready(b)) {
      start(s, b, t);
      return;
    }
    Instruction f{OpKind::forward, s, forwards[s], -1};
    if (forwards[s] < M && forwards[s] - backwards[s] < limit[s] &&
        (!split || forwards[s] - weights[s] < held_limit[s]) && ready(f)) {
      start(s, f, t);
      return;
    }
    if (!split || weights[s] >= backwards_done[s]) return;
    // A W waits if it would still run when the next I's gradients arrive: that I is on the
    // critical path. Arrival is known once every stage downstream runs (or ran) its I.
    const int k = backwards[s];
    if (k < M && k < forwards[s]) {
      double arrival = t;
      bool known = true;
      for (int e : out_edges[s]) {
        const int d = plan.edges[e].dst;
        if (backwards_done[d] > k) continue;
        if (backwards[d] > k) {
          arrival = std::max(arrival, input_finish[d]);
        } else {
          known = false;
        }
      }
      if (known && t + backward_split(plan.stages[s]).second > arrival) return;
    }
    start(s, {OpKind::backward_weight, s, weights[s], -1}, t);
  };

  // One round per distinct finish time t. Order inside a round matters for the programs, not
  // for correctness (any emission order is one global sequence):
  //   (a) ranks that produced nothing at t start whatever is ready without t's transfers, so a
  //       receiver does not queue a receive in front of independent work (the last stage runs
  //       B0 before receiving activation 1, as in Megatron's send_backward_recv_forward);
  //   (b) the transfers produced at t are emitted (send right after its compute on the
  //       producer, receive on the consumer) and arrive (they are instantaneous here);
  //   (c) every idle rank starts what is now ready.
  struct Produced {
    int stage;
    Instruction compute;
  };
  std::vector<Produced> produced;
  std::vector<char> producer(S, 0);
  for (int s = 0; s < S; ++s) dispatch(s, 0.0);
  while (!events.empty()) {
    const double t = events.top().time;
    produced.clear();
    while (!events.empty() && events.top().time == t) {
      Event ev = events.top();
      events.pop();
      busy[ev.index] = 0;
      if (ev.type == kFinishForward) {
        forward_done[at(ev.index, ev.micro_batch)] = 1;
        if (!out_edges[ev.index].empty()) produced.push_back({ev.index, {OpKind::forward, ev.index, ev.micro_batch, -1}});
      } else if (ev.type == kFinishBackward) {
        ++backwards_done[ev.index];
        if (!in_edges[ev.index].empty()) produced.push_back({ev.index, {OpKind::backward, ev.index, ev.micro_batch, -1}});
      } else if (ev.type == kFinishWeight) {
        ++weights_done[ev.index];
      }
    }
    for (const auto& p : produced) producer[p.stage] = 1;
    for (int s = 0; s < S; ++s) {
      if (!producer[s]) dispatch(s, t);
    }
    for (const auto& p : produced) {
      const int m = p.compute.micro_batch;
      if (p.compute.kind == OpKind::forward) {
        for (int e : out_edges[p.stage]) {
          // Send and receive take the same place in the global sequence (see the header).
          const int dst = plan.edges[e].dst;
          emit(p.stage, {OpKind::send_activation, p.stage, m, e});
          emit(dst, {OpKind::recv_activation, dst, m, e});
          --missing_inputs[at(dst, m)];
        }
      } else {
        for (int e : in_edges[p.stage]) {
          const int src = plan.edges[e].src;
          emit(p.stage, {OpKind::send_gradient, p.stage, m, e});
          emit(src, {OpKind::recv_gradient, src, m, e});
          --missing_grads[at(src, m)];
        }
      }
      producer[p.stage] = 0;
    }
    for (int s = 0; s < S; ++s) dispatch(s, t);
  }
  for (int s = 0; s < S; ++s) {
    if (!optimizer_done[s]) {
      // Cannot happen for the policies above (see the header's argument); kept as a guard.
      throw ScheduleError("internal error: the " + schedule.kind + " generator stalled at stage " +
                          std::to_string(s) + " after " + std::to_string(forwards[s]) +
                          " forwards and " + std::to_string(backwards[s]) + " backwards");
    }
  }
  // Replicated stages: the replicas' gradients are summed right before the optimizer step (the
  // runtime starts the sum's buckets during the last backward already), and every replica runs
  // the lead's program.
  for (int s = 0; s < S; ++s) {
    if (ranks_of[s].size() < 2) continue;
    auto& program = schedule.ranks[rank_of[s]];
    auto step = std::find_if(program.begin(), program.end(),
                             [](const Instruction& i) { return i.kind == OpKind::optimizer_step; });
    program.insert(step, Instruction{OpKind::all_reduce, s, -1, -1});
    for (std::size_t k = 1; k < ranks_of[s].size(); ++k) schedule.ranks[ranks_of[s][k]] = program;
  }
  validate(schedule);
  return schedule;
}

}  // namespace graphpipe::schedule
