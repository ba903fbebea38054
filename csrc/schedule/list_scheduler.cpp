#include "schedule/list_scheduler.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <queue>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace graphpipe::schedule {

using plan::Plan;

namespace {

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

enum EventType { kFinishForward, kFinishBackward, kFinishOptimizer, kFinishWeight };

struct Event {
  double time;
  long seq;
  EventType type;
  int stage;
  int micro_batch;
  bool operator>(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
};

// A compute that finished at the current time and produces transfers: a forward (its
// activations go downstream) or a backward (its input gradients go upstream).
struct Produced {
  int stage;
  Instruction compute;
};

class ListScheduler {
 public:
  // source_weights_wait (zb_graph): whether the W's of a stage with no stage upstream wait for
  // the next I as every other stage's do (weight_waits). unsplit (zb_graph): per stage, whether
  // it runs whole backwards (B) instead of I and W; empty: every stage splits.
  ListScheduler(const Plan& plan, Policy policy, const std::vector<std::vector<int>>& ranks_of,
                bool source_weights_wait = true, std::vector<char> unsplit = {});
  Schedule run();
  // The timeline's end (stage costs from the plan, transfers instantaneous), once run() returned.
  double finish_time() const { return finish_time_; }

 private:
  std::size_t at(int s, int m) const { return static_cast<std::size_t>(s) * M_ + m; }
  // Whether stage s splits its backwards into I and W.
  bool split(int s) const { return split_ && (unsplit_.empty() || !unsplit_[s]); }
  void emit(int stage, const Instruction& i) { schedule_.ranks[rank_of_[stage]].push_back(i); }
  bool ready(const Instruction& i) const;
  void start(int s, const Instruction& i, double t);
  std::optional<Instruction> candidate(int s, double t) const;
  std::optional<Instruction> greedy_candidate(int s, double t) const;
  void dispatch(int rank, double t);
  bool weight_waits(int s, double t) const;
  void finish_events(double t);
  void emit_transfers(const Produced& p);
  void round(double t);
  void check_finished() const;

  const Plan& plan_;
  const int S_, M_;
  const bool greedy_, split_;
  const bool source_weights_wait_;
  const std::vector<char> unsplit_;
  double finish_time_ = 0.0;
  std::vector<int> rank_of_;  // each stage's lead: the programs are made for the leads
  // Per lead rank, its stages in ascending order (several where a rank holds several stages),
  // and whether it computes now: a rank runs one compute at a time, whichever stage it is for.
  std::vector<std::vector<int>> stages_of_;
  std::vector<char> rank_busy_;
  std::vector<int> limit_;
  Schedule schedule_;
  std::vector<std::vector<int>> in_edges_, out_edges_;
  // Per (stage, micro-batch): inputs still missing for the forward, gradients still missing for
  // the backward, forward finished.
  std::vector<int> missing_inputs_, missing_grads_;
  std::vector<char> forward_done_;
  std::vector<std::vector<Instruction>> order_;  // fixed-order policies: each stage's order
  std::vector<std::size_t> next_;                // fixed order: position in order_[s]
  std::vector<int> forwards_, backwards_;        // dispatched so far
  std::vector<int> backwards_done_;
  std::vector<int> weights_, weights_done_;  // zb_graph: W dispatched and finished
  std::vector<double> input_finish_;         // zb_graph: when the stage's running I ends
  std::vector<int> held_limit_;              // zb_graph: weight_limits()
  std::vector<char> optimizer_done_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  long seq_ = 0;
  std::vector<Produced> produced_;  // in the current round
  std::vector<char> producer_;      // per rank: a compute of it produced transfers in this round
};

ListScheduler::ListScheduler(const Plan& plan, Policy policy, const std::vector<std::vector<int>>& ranks_of,
                             bool source_weights_wait, std::vector<char> unsplit)
    : plan_(plan),
      S_(static_cast<int>(plan.stages.size())),
      M_(static_cast<int>(plan.num_micro_batches)),
      greedy_(traits(policy).greedy),
      split_(traits(policy).splits_backward),
      source_weights_wait_(source_weights_wait),
      unsplit_(std::move(unsplit)),
      limit_(in_flight_limits(plan, policy)),
      in_edges_(S_),
      out_edges_(S_),
      missing_inputs_(static_cast<std::size_t>(S_) * M_),
      missing_grads_(missing_inputs_.size()),
      forward_done_(missing_inputs_.size(), 0),
      order_(S_),
      next_(S_, 0),
      forwards_(S_, 0),
      backwards_(S_, 0),
      backwards_done_(S_, 0),
      weights_(S_, 0),
      weights_done_(S_, 0),
      input_finish_(S_, 0.0),
      optimizer_done_(S_, 0) {
  int highest_rank = 0;
  for (const auto& ranks : ranks_of) {
    rank_of_.push_back(ranks.front());
    highest_rank = std::max(highest_rank, *std::max_element(ranks.begin(), ranks.end()));
  }
  schedule_.kind = std::string(policy_name(policy));
  schedule_.num_micro_batches = M_;
  schedule_.stage_ranks = ranks_of;
  for (const auto& e : plan.edges) schedule_.edges.push_back({e.src, e.dst});
  schedule_.ranks.assign(std::max(plan.num_devices, highest_rank + 1), {});
  stages_of_.assign(schedule_.ranks.size(), {});
  for (int s = 0; s < S_; ++s) stages_of_[rank_of_[s]].push_back(s);
  rank_busy_.assign(schedule_.ranks.size(), 0);
  producer_.assign(schedule_.ranks.size(), 0);
  for (int e = 0; e < static_cast<int>(plan.edges.size()); ++e) {
    out_edges_[plan.edges[e].src].push_back(e);
    in_edges_[plan.edges[e].dst].push_back(e);
  }
  for (int s = 0; s < S_; ++s) {
    for (int m = 0; m < M_; ++m) {
      missing_inputs_[at(s, m)] = static_cast<int>(in_edges_[s].size());
      missing_grads_[at(s, m)] = static_cast<int>(out_edges_[s].size());
    }
  }
  if (!greedy_) {
    for (int s = 0; s < S_; ++s) order_[s] = fixed_order(s, M_, limit_[s]);
  }
  if (split_) held_limit_ = weight_limits(plan, limit_);
}

bool ListScheduler::ready(const Instruction& i) const {
  if (i.kind == OpKind::forward) return missing_inputs_[at(i.stage, i.micro_batch)] == 0;
  return forward_done_[at(i.stage, i.micro_batch)] && missing_grads_[at(i.stage, i.micro_batch)] == 0;
}

void ListScheduler::start(int s, const Instruction& i, double t) {
  emit(s, i);
  rank_busy_[rank_of_[s]] = 1;
  if (i.kind == OpKind::optimizer_step) {
    optimizer_done_[s] = 1;
  } else if (!greedy_) {
    ++next_[s];  // the fixed order's head, which candidate() offered
  }
  const auto& stage = plan_.stages[s];
  if (i.kind == OpKind::forward) {
    ++forwards_[s];
    events_.push({t + stage.forward_seconds, seq_++, kFinishForward, s, i.micro_batch});
  } else if (i.kind == OpKind::backward) {
    ++backwards_[s];
    input_finish_[s] = t + stage.backward_seconds;  // its input gradients: what weight_waits() reads
    events_.push({input_finish_[s], seq_++, kFinishBackward, s, i.micro_batch});
  } else if (i.kind == OpKind::backward_input) {
    ++backwards_[s];
    input_finish_[s] = t + backward_split(stage).first;
    events_.push({input_finish_[s], seq_++, kFinishBackward, s, i.micro_batch});
  } else if (i.kind == OpKind::backward_weight) {
    ++weights_[s];
    events_.push({t + backward_split(stage).second, seq_++, kFinishWeight, s, i.micro_batch});
  } else {
    events_.push({t, seq_++, kFinishOptimizer, s, -1});
  }
}

// What stage s would start at time t if its rank were idle: its optimizer step once every
// backward (or W) is done, else its policy's next compute if ready; nothing otherwise.
std::optional<Instruction> ListScheduler::candidate(int s, double t) const {
  if ((split(s) ? weights_done_ : backwards_done_)[s] == M_) {
    if (optimizer_done_[s]) return std::nullopt;
    return Instruction{OpKind::optimizer_step, s, -1, -1};
  }
  if (greedy_) return greedy_candidate(s, t);
  if (next_[s] < order_[s].size() && ready(order_[s][next_[s]])) return order_[s][next_[s]];
  return std::nullopt;
}

// 1f1b_greedy and zb_graph: I (or B) before F before W (generate.h).
std::optional<Instruction> ListScheduler::greedy_candidate(int s, double t) const {
  Instruction b{split(s) ? OpKind::backward_input : OpKind::backward, s, backwards_[s], -1};
  if (backwards_[s] < M_ && backwards_[s] < forwards_[s] && ready(b)) return b;
  Instruction f{OpKind::forward, s, forwards_[s], -1};
  if (forwards_[s] < M_ && forwards_[s] - backwards_[s] < limit_[s] &&
      (!split(s) || forwards_[s] - weights_[s] < held_limit_[s]) && ready(f)) {
    return f;
  }
  if (!split(s) || weights_[s] >= backwards_done_[s] || weight_waits(s, t)) return std::nullopt;
  return Instruction{OpKind::backward_weight, s, weights_[s], -1};
}

// Starts the next compute of an idle rank at time t. With one stage, that stage's candidate;
// with several (interleaved stages), the most urgent of theirs: an optimizer step (it takes no
// time), then a backward (B or I: the stages upstream wait for its gradients, and it frees
// activations), then a forward, then a W (which nothing waits for); within a kind, the oldest
// micro-batch, then the later stage (nearer the loss, so the micro-batch finishes sooner).
void ListScheduler::dispatch(int rank, double t) {
  if (rank_busy_[rank]) return;
  auto urgency = [](const Instruction& i) {
    switch (i.kind) {
      case OpKind::optimizer_step:
        return 0;
      case OpKind::backward:
      case OpKind::backward_input:
        return 1;
      case OpKind::forward:
        return 2;
      default:
        return 3;
    }
  };
  std::optional<Instruction> best;
  for (int s : stages_of_[rank]) {
    const std::optional<Instruction> next = candidate(s, t);
    if (!next) continue;
    if (!best || std::tuple(urgency(*next), next->micro_batch, -next->stage) <
                     std::tuple(urgency(*best), best->micro_batch, -best->stage)) {
      best = next;
    }
  }
  if (best) start(best->stage, *best, t);
}

// zb_graph: a W waits if it would still run when the next I's gradients arrive: that I is on
// the critical path. Arrival is known once every stage downstream runs (or ran) its I.
bool ListScheduler::weight_waits(int s, double t) const {
  const int k = backwards_[s];
  if (k >= M_ || k >= forwards_[s]) return false;
  if (!source_weights_wait_ && in_edges_[s].empty()) return false;
  double arrival = t;
  for (int e : out_edges_[s]) {
    const int d = plan_.edges[e].dst;
    if (backwards_done_[d] > k) continue;
    if (backwards_[d] <= k) return false;  // not known yet
    arrival = std::max(arrival, input_finish_[d]);
  }
  return t + backward_split(plan_.stages[s]).second > arrival;
}

// Pops every event finishing at t, recording the computes whose results travel.
void ListScheduler::finish_events(double t) {
  produced_.clear();
  while (!events_.empty() && events_.top().time == t) {
    const Event ev = events_.top();
    events_.pop();
    rank_busy_[rank_of_[ev.stage]] = 0;
    if (ev.type == kFinishForward) {
      forward_done_[at(ev.stage, ev.micro_batch)] = 1;
      if (!out_edges_[ev.stage].empty())
        produced_.push_back({ev.stage, {OpKind::forward, ev.stage, ev.micro_batch, -1}});
    } else if (ev.type == kFinishBackward) {
      ++backwards_done_[ev.stage];
      if (!in_edges_[ev.stage].empty())
        produced_.push_back({ev.stage, {OpKind::backward, ev.stage, ev.micro_batch, -1}});
    } else if (ev.type == kFinishWeight) {
      ++weights_done_[ev.stage];
    }
  }
}

// The transfers of a finished compute: send right after it on the producer, receive on the
// consumer, at the same place in the global sequence (generate.h); they arrive at once.
void ListScheduler::emit_transfers(const Produced& p) {
  const int m = p.compute.micro_batch;
  if (p.compute.kind == OpKind::forward) {
    for (int e : out_edges_[p.stage]) {
      const int dst = plan_.edges[e].dst;
      if (!schedule_.local(e)) {  // a local edge's tensors stay on the rank: nothing to post
        emit(p.stage, {OpKind::send_activation, p.stage, m, e});
        emit(dst, {OpKind::recv_activation, dst, m, e});
      }
      --missing_inputs_[at(dst, m)];
    }
  } else {
    for (int e : in_edges_[p.stage]) {
      const int src = plan_.edges[e].src;
      if (!schedule_.local(e)) {
        emit(p.stage, {OpKind::send_gradient, p.stage, m, e});
        emit(src, {OpKind::recv_gradient, src, m, e});
      }
      --missing_grads_[at(src, m)];
    }
  }
}

// One round per distinct finish time t. Order inside a round matters for the programs, not for
// correctness (any emission order is one global sequence):
//   (a) ranks that produced nothing at t start whatever is ready without t's transfers, so a
//       receiver does not queue a receive in front of independent work (the last stage runs B0
//       before receiving activation 1, as in Megatron's send_backward_recv_forward);
//   (b) the transfers produced at t are emitted and arrive;
//   (c) every idle rank starts what is now ready.
void ListScheduler::round(double t) {
  finish_events(t);
  const int R = static_cast<int>(stages_of_.size());
  for (const auto& p : produced_) producer_[rank_of_[p.stage]] = 1;
  for (int r = 0; r < R; ++r) {
    if (!producer_[r]) dispatch(r, t);
  }
  for (const auto& p : produced_) {
    emit_transfers(p);
    producer_[rank_of_[p.stage]] = 0;
  }
  for (int r = 0; r < R; ++r) dispatch(r, t);
}

void ListScheduler::check_finished() const {
  for (int s = 0; s < S_; ++s) {
    if (!optimizer_done_[s]) {
      // Cannot happen for the policies (see generate.h's argument); kept as a guard.
      throw ScheduleError("internal error: the " + schedule_.kind + " generator stalled at stage " + std::to_string(s) +
                          " after " + std::to_string(forwards_[s]) + " forwards and " + std::to_string(backwards_[s]) +
                          " backwards");
    }
  }
}

Schedule ListScheduler::run() {
  for (int r = 0; r < static_cast<int>(stages_of_.size()); ++r) dispatch(r, 0.0);
  while (!events_.empty()) {
    finish_time_ = events_.top().time;
    round(finish_time_);
  }
  check_finished();
  return std::move(schedule_);
}

}  // namespace

Schedule list_schedule(const Plan& plan, Policy policy, const std::vector<std::vector<int>>& ranks_of) {
  ListScheduler scheduler(plan, policy, ranks_of);
  Schedule schedule = scheduler.run();
  if (!traits(policy).splits_backward) return schedule;
  // On a stage with no stage upstream, an I's gradients go nowhere: its W waits for the next I
  // only so that the forward that I unlocks starts sooner. Whether that pays depends on the
  // stage times (a first stage whose whole backward is W, e.g. a Transformer's embedding and
  // first layers, piles every W up at the end and drains slower than 1F1B), so both orders are
  // list-scheduled and the shorter timeline kept; a tie keeps the W's waiting.
  double best = scheduler.finish_time();
  bool wait = true;
  std::vector<char> unsplit(plan.stages.size(), 0);
  auto try_order = [&](bool waits, const std::vector<char>& whole) {
    ListScheduler other(plan, policy, ranks_of, waits, whole);
    Schedule made = other.run();
    if (other.finish_time() >= best * (1.0 - 1e-12)) return false;
    best = other.finish_time();
    schedule = std::move(made);
    return true;
  };
  if (try_order(false, unsplit)) wait = false;
  // A split backward may cost more than the whole one (I + W > B: the profiled halves of a
  // stage of small operators, where the second autograd pass is not free). Splitting such a
  // stage pays only where its earlier I shortens the critical path by more. Which such stages
  // run whole backwards (B) is searched by flipping groups of them (whole if split, split if
  // whole), each flip kept where the list-scheduled timeline ends sooner in either order of the
  // source stages' W's: the stages, dearest split first, as one group, then halves, quarters and
  // so on down to single stages, but at most kMostGroups groups a level. So a chain whose every
  // split is dear can go whole at once (where 1F1B's order wins), and its halves or quarters
  // can split where they pay, and the search stays bounded on deep plans: at most
  // 2 + 2 x (1 + 2 + ... + kMostGroups) = 32 list schedules in all.
  constexpr std::size_t kMostGroups = 8;
  std::vector<std::pair<double, int>> dear;  // (I + W - B, stage)
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const auto [input, weight] = backward_split(plan.stages[s]);
    const double extra = input + weight - plan.stages[s].backward_seconds;
    if (extra > plan.stages[s].backward_seconds * 1e-9) dear.emplace_back(extra, s);
  }
  std::stable_sort(dear.begin(), dear.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  auto flip = [&](std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) unsplit[dear[i].second] = static_cast<char>(!unsplit[dear[i].second]);
  };
  for (std::size_t groups = 1; !dear.empty(); groups *= 2) {
    const std::size_t size = (dear.size() + groups - 1) / groups;
    for (std::size_t from = 0; from < dear.size(); from += size) {
      const std::size_t to = std::min(dear.size(), from + size);
      flip(from, to);
      const bool kept_wait = try_order(wait, unsplit);
      const bool kept_other = try_order(!wait, unsplit);
      if (kept_other) wait = !wait;
      if (!kept_wait && !kept_other) flip(from, to);
    }
    if (size == 1 || groups >= kMostGroups) break;
  }
  return schedule;
}

}  // namespace graphpipe::schedule
