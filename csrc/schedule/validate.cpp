// validate() (schedule.h): the ranks and edges of a schedule, then each lead's instructions one
// by one (stage, rank, micro-batch, edge, no repeats), then completeness and the order each
// stage's instructions need on its rank. Replicas are checked to run their lead's program.
#include <algorithm>
#include <string>

#include "plan/rank_sharing.h"
#include "schedule/schedule.h"

namespace graphpipe::schedule {

namespace {

std::string where(int rank, std::size_t step, const Instruction& i) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step) + " (" + to_token(i) + ")";
}

// Positions of every instruction kind, indexed [stage or edge][micro-batch]; -1 when absent.
// All positions of one stage are on one rank, as are those of two stages joined by a local
// edge, so comparing them compares program order.
struct Positions {
  int m = 0;
  std::vector<long> forward, backward, backward_input, backward_weight;  // [stage * m + mb]
  std::vector<long> send_act, recv_act, send_grad, recv_grad;            // [edge * m + mb]
  std::vector<long> optimizer, all_reduce;                               // [stage]

  Positions(int stages, int edges, int micro_batches) : m(micro_batches) {
    const std::size_t s = static_cast<std::size_t>(stages) * m;
    const std::size_t e = static_cast<std::size_t>(edges) * m;
    forward.assign(s, -1);
    backward.assign(s, -1);
    backward_input.assign(s, -1);
    backward_weight.assign(s, -1);
    send_act.assign(e, -1);
    recv_act.assign(e, -1);
    send_grad.assign(e, -1);
    recv_grad.assign(e, -1);
    optimizer.assign(stages, -1);
    all_reduce.assign(stages, -1);
  }

  long& slot(const Instruction& i) {
    const std::size_t stage_index = static_cast<std::size_t>(i.stage) * m + i.micro_batch;
    const std::size_t edge_index = static_cast<std::size_t>(i.edge) * m + i.micro_batch;
    switch (i.kind) {
      case OpKind::forward:
        return forward[stage_index];
      case OpKind::backward:
        return backward[stage_index];
      case OpKind::backward_input:
        return backward_input[stage_index];
      case OpKind::backward_weight:
        return backward_weight[stage_index];
      case OpKind::send_activation:
        return send_act[edge_index];
      case OpKind::recv_activation:
        return recv_act[edge_index];
      case OpKind::send_gradient:
        return send_grad[edge_index];
      case OpKind::recv_gradient:
        return recv_grad[edge_index];
      case OpKind::optimizer_step:
        return optimizer[i.stage];
      case OpKind::all_reduce:
        return all_reduce[i.stage];
    }
    throw ScheduleError("unknown instruction kind");
  }
};

// The stage at the instruction's end of its edge (which end depends on kind).
int own_end(const ScheduleEdge& e, OpKind kind) {
  return (kind == OpKind::send_activation || kind == OpKind::recv_gradient) ? e.src : e.dst;
}

class Validator {
 public:
  explicit Validator(const Schedule& s)
      : s_(s),
        S_(s.num_stages()),
        M_(s.num_micro_batches),
        R_(s.num_ranks()),
        E_(static_cast<int>(s.edges.size())),
        pos_(std::max(S_, 0), E_, std::max(M_, 0)) {}

  void run() {
    if (M_ < 1) throw ScheduleError("a schedule needs at least one micro-batch, found " + std::to_string(M_));
    if (S_ < 1) throw ScheduleError("a schedule needs at least one stage");
    check_stage_ranks();
    check_edges();
    for (int r = 0; r < R_; ++r) {
      if (stage_on_rank_[r] >= 0 && s_.lead_rank(stage_on_rank_[r]) != r) continue;  // a replica
      const auto& program = s_.ranks[r];
      for (std::size_t step = 0; step < program.size(); ++step) record(r, step, program[step]);
    }
    for (int st = 0; st < S_; ++st) check_stage_order(st);
  }

 private:
  void check_stage_ranks();
  void check_edges();
  void record(int r, std::size_t step, const Instruction& i);
  void check_transfer(const std::string& at, const Instruction& i) const;
  ScheduleError missing(const Instruction& i) const;
  void need_before(const Instruction& first, const Instruction& then);
  Instruction grads(int st, int m);
  Instruction weights_done(int st, int m);
  void check_stage_order(int st);

  const Schedule& s_;
  const int S_, M_, R_, E_;
  std::vector<int> stage_on_rank_;
  std::vector<std::vector<int>> in_edges_, out_edges_;
  Positions pos_;
};

// Every stage on ranks of the schedule, a rank shared only by stages alone on it, replicas
// running the lead's program. stage_on_rank_ keeps one stage of each rank: a replica's rank has
// only its own.
void Validator::check_stage_ranks() {
  stage_on_rank_.assign(std::max(R_, 0), -1);
  if (static_cast<int>(s_.stage_ranks.size()) != S_) throw ScheduleError("internal: stage count");
  if (auto problem = plan::rank_sharing_problem(s_.stage_ranks)) throw ScheduleError(*problem);
  for (int st = 0; st < S_; ++st) {
    if (s_.stage_ranks[st].empty()) throw ScheduleError("stage " + std::to_string(st) + " has no rank");
    for (int r : s_.stage_ranks[st]) {
      if (r < 0 || r >= R_) {
        throw ScheduleError("stage " + std::to_string(st) + " is on rank " + std::to_string(r) +
                            ", outside the schedule's " + std::to_string(R_) + " ranks");
      }
      stage_on_rank_[r] = st;
    }
    // Replicas run their lead's program (see the header): checked here, then only the leads'
    // programs are validated instruction by instruction.
    const int lead = s_.stage_ranks[st].front();
    for (std::size_t k = 1; k < s_.stage_ranks[st].size(); ++k) {
      const int r = s_.stage_ranks[st][k];
      if (s_.ranks[r] != s_.ranks[lead]) {
        throw ScheduleError("rank " + std::to_string(r) + " runs a replica of stage " + std::to_string(st) +
                            ", so its program must equal that of the stage's lead, rank " + std::to_string(lead) +
                            " (replicas run the same schedule on their rows)");
      }
    }
  }
}

void Validator::check_edges() {
  in_edges_.assign(S_, {});
  out_edges_.assign(S_, {});
  for (int e = 0; e < E_; ++e) {
    const auto& edge = s_.edges[e];
    if (edge.src < 0 || edge.dst >= S_ || edge.src >= edge.dst) {
      throw ScheduleError("edge " + std::to_string(e) + " (" + std::to_string(edge.src) + "->" +
                          std::to_string(edge.dst) +
                          ") must join two existing stages with src < dst (stages are numbered "
                          "in a topological order)");
    }
    out_edges_[edge.src].push_back(e);
    in_edges_[edge.dst].push_back(e);
  }
}

// Instruction `step` of lead rank r: its stage runs on r, its micro-batch and edge fit its kind,
// and it appears once.
void Validator::record(int r, std::size_t step, const Instruction& i) {
  const std::string at = where(r, step, i);
  if (i.stage < 0 || i.stage >= S_) throw ScheduleError(at + ": no stage " + std::to_string(i.stage));
  if (s_.lead_rank(i.stage) != r) {
    throw ScheduleError(at + ": stage " + std::to_string(i.stage) + " runs on rank " +
                        std::to_string(s_.lead_rank(i.stage)));
  }
  if (i.kind == OpKind::all_reduce && s_.replicas(i.stage) < 2) {
    throw ScheduleError(at + ": stage " + std::to_string(i.stage) +
                        " runs on one rank, so it has no replicas' gradients to all-reduce");
  }
  if (has_micro_batch(i.kind) && (i.micro_batch < 0 || i.micro_batch >= M_)) {
    throw ScheduleError(at + ": micro-batch out of range [0, " + std::to_string(M_) + ")");
  }
  if (!has_micro_batch(i.kind) && i.micro_batch != -1) {
    throw ScheduleError(at + ": this instruction takes no micro-batch");
  }
  if (is_transfer(i.kind)) {
    check_transfer(at, i);
  } else if (i.edge != -1) {
    throw ScheduleError(at + ": only sends and receives name an edge");
  }
  long& slot = pos_.slot(i);
  if (slot >= 0) throw ScheduleError(at + ": appears twice (first at step " + std::to_string(slot) + ")");
  slot = static_cast<long>(step);
}

void Validator::check_transfer(const std::string& at, const Instruction& i) const {
  if (i.edge < 0 || i.edge >= E_) {
    throw ScheduleError(at + ": no edge " + std::to_string(i.edge) + " (the plan has " + std::to_string(E_) + ")");
  }
  const auto& edge = s_.edges[i.edge];
  if (s_.local(i.edge)) {
    throw ScheduleError(at + ": edge " + std::to_string(i.edge) + " joins stages " + std::to_string(edge.src) +
                        " and " + std::to_string(edge.dst) +
                        " on one rank, so its tensors stay there: it has no "
                        "sends or receives");
  }
  if (own_end(edge, i.kind) != i.stage) {
    throw ScheduleError(at + ": edge " + std::to_string(i.edge) + " runs " + std::to_string(edge.src) + "->" +
                        std::to_string(edge.dst) + ", so a " + std::string(kind_name(i.kind)) +
                        " on it belongs to stage " + std::to_string(own_end(edge, i.kind)));
  }
}

ScheduleError Validator::missing(const Instruction& i) const {
  return ScheduleError("rank " + std::to_string(s_.lead_rank(i.stage)) + " lacks " + to_token(i) + " (" + describe(i) +
                       ")");
}

void Validator::need_before(const Instruction& first, const Instruction& then) {
  const long a = pos_.slot(first);
  const long b = pos_.slot(then);
  if (a < 0) throw missing(first);
  if (b < 0) throw missing(then);
  if (a > b) {
    throw ScheduleError(where(s_.lead_rank(then.stage), static_cast<std::size_t>(b), then) + ": the " + describe(then) +
                        " comes before the " + describe(first) + " (step " + std::to_string(a) + ") that it needs");
  }
}

// A micro-batch's backward is one B, or an I (input gradients) and later a W (weight
// gradients): the one that produces the gradients sent back.
Instruction Validator::grads(int st, int m) {
  Instruction b{OpKind::backward, st, m, -1};
  Instruction in{OpKind::backward_input, st, m, -1};
  Instruction w{OpKind::backward_weight, st, m, -1};
  const bool split = pos_.slot(in) >= 0 || pos_.slot(w) >= 0;
  if (split && pos_.slot(b) >= 0) {
    throw ScheduleError("rank " + std::to_string(s_.lead_rank(st)) + " has both " + to_token(b) + " and the split " +
                        to_token(in) + "/" + to_token(w) + ": a micro-batch's backward is one or the other");
  }
  if (!split && pos_.slot(b) < 0) {
    throw ScheduleError("rank " + std::to_string(s_.lead_rank(st)) + " lacks " + to_token(b) + " (or " + to_token(in) +
                        " and " + to_token(w) + "): the backward of micro-batch " + std::to_string(m) + " at stage " +
                        std::to_string(st));
  }
  if (split) need_before(in, w);
  return split ? in : b;
}

// The instruction after which a micro-batch's weight gradients are final: B or W.
Instruction Validator::weights_done(int st, int m) {
  Instruction w{OpKind::backward_weight, st, m, -1};
  return pos_.slot(w) >= 0 ? w : Instruction{OpKind::backward, st, m, -1};
}

// Completeness, then order on the stage's rank.
void Validator::check_stage_order(int st) {
  for (int m = 0; m < M_; ++m) {
    Instruction f{OpKind::forward, st, m, -1};
    if (pos_.slot(f) < 0) throw missing(f);
    const Instruction b = grads(st, m);
    for (int e : in_edges_[st]) {
      if (s_.local(e)) continue;  // ordered from the producing stage's side below
      need_before({OpKind::recv_activation, st, m, e}, f);
      need_before(b, {OpKind::send_gradient, st, m, e});
    }
    for (int e : out_edges_[st]) {
      if (s_.local(e)) {  // both stages on this rank: program order carries the tensors
        const int dst = s_.edges[e].dst;
        need_before(f, {OpKind::forward, dst, m, -1});
        need_before(grads(dst, m), b);
        continue;
      }
      need_before(f, {OpKind::send_activation, st, m, e});
      need_before({OpKind::recv_gradient, st, m, e}, b);
    }
    need_before(f, b);
    if (m > 0) {
      need_before({OpKind::forward, st, m - 1, -1}, f);
      need_before(grads(st, m - 1), b);
    }
  }
  // The step, and a replicated stage's gradient sum before it, see every weight gradient.
  Instruction opt{OpKind::optimizer_step, st, -1, -1};
  Instruction sum{OpKind::all_reduce, st, -1, -1};
  for (int m = 0; m < M_; ++m) {
    if (pos_.slot(opt) >= 0) need_before(weights_done(st, m), opt);
    if (s_.replicas(st) > 1) need_before(weights_done(st, m), sum);
  }
  if (s_.replicas(st) > 1 && pos_.slot(opt) >= 0) need_before(sum, opt);
}

}  // namespace

void validate(const Schedule& schedule) { Validator(schedule).run(); }

}  // namespace graphpipe::schedule
