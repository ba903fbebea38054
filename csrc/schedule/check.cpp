#include "schedule/check.h"

#include <deque>
#include <sstream>

namespace graphpipe::schedule {

namespace {

struct Posted {
  int rank;
  std::size_t step;
};

// Identity of a transfer: the same for its send and its receive.
bool same_transfer(const Instruction& send, const Instruction& recv) {
  const bool activation = send.kind == OpKind::send_activation;
  return send.edge == recv.edge && send.micro_batch == recv.micro_batch &&
         recv.kind == (activation ? OpKind::recv_activation : OpKind::recv_gradient);
}

// The stage at the other end of a transfer's edge.
int peer_stage(const Schedule& s, const Instruction& i) {
  const ScheduleEdge& e = s.edges[i.edge];
  return i.stage == e.src ? e.dst : e.src;
}

}  // namespace

std::string CheckResult::to_string() const {
  std::ostringstream out;
  if (ok) {
    out << "ok: the schedule completes (" << batches << " communication batches)";
    return out.str();
  }
  out << "the schedule hangs: " << blocked.size() << " rank(s) blocked";
  for (const auto& b : blocked) {
    out << "\n  rank " << b.rank << " blocks at step " << b.step << " on " << to_token(b.instruction) << ": "
        << b.reason;
  }
  return out.str();
}

namespace {

// The blocking model of check.h played out on the leads' programs.
class Replay {
 public:
  explicit Replay(const Schedule& schedule)
      : s_(leads_only(schedule)),
        R_(s_.num_ranks()),
        pc_(R_, 0),
        batch_end_(R_, 0),
        unfinished_(R_, 0),
        in_batch_(R_, 0),
        done_(R_),
        sends_(static_cast<std::size_t>(R_) * R_),
        recvs_(sends_.size()),
        mismatch_(sends_.size()) {
    for (int r = 0; r < R_; ++r) done_[r].assign(s_.ranks[r].size(), 0);
  }

  CheckResult run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < R_; ++r) progress = advance(r) || progress;
    }
    for (int r = 0; r < R_; ++r) {
      if (pc_[r] < s_.ranks[r].size()) result_.blocked.push_back(blocked(r));
    }
    result_.ok = result_.blocked.empty();
    return result_;
  }

 private:
  // The ordered pair (sender, receiver) of rank r's transfer i: its FIFO queue.
  std::size_t pair_of(int r, const Instruction& i) const {
    const int peer = s_.peer_rank(i);
    return is_send(i.kind) ? static_cast<std::size_t>(r) * R_ + peer : static_cast<std::size_t>(peer) * R_ + r;
  }
  bool advance(int r);
  void post_batch(int r);
  void match(std::size_t pair);
  std::size_t first_unfinished(int r) const;
  std::string waiting_on(int r) const;
  BlockedRank blocked(int r) const;

  const Schedule s_;
  const int R_;
  std::vector<std::size_t> pc_, batch_end_, unfinished_;
  std::vector<char> in_batch_;
  std::vector<std::vector<char>> done_;
  // Posted, unmatched operations per ordered pair src * R + dst.
  std::vector<std::deque<Posted>> sends_, recvs_;
  std::vector<std::string> mismatch_;
  CheckResult result_;
};

// Runs rank r as far as it can go; whether it moved.
bool Replay::advance(int r) {
  const auto& program = s_.ranks[r];
  bool progress = false;
  while (pc_[r] < program.size()) {
    if (in_batch_[r]) {
      if (unfinished_[r] > 0) break;
      in_batch_[r] = 0;
      pc_[r] = batch_end_[r];
      ++result_.batches;
    } else if (is_compute(program[pc_[r]].kind)) {
      ++pc_[r];
    } else {
      post_batch(r);
    }
    progress = true;
  }
  return progress;
}

// Posts the run of transfers at rank r's position as one batch, matching what it can.
void Replay::post_batch(int r) {
  const auto& program = s_.ranks[r];
  std::size_t q = pc_[r];
  while (q < program.size() && is_transfer(program[q].kind)) {
    (is_send(program[q].kind) ? sends_ : recvs_)[pair_of(r, program[q])].push_back({r, q});
    ++q;
  }
  in_batch_[r] = 1;
  batch_end_[r] = q;
  unfinished_[r] = q - pc_[r];
  for (std::size_t k = pc_[r]; k < q; ++k) match(pair_of(r, program[k]));
}

// Matches the pair's posted sends and receives FIFO; a mismatch stops the pair for good.
void Replay::match(std::size_t pair) {
  auto& sq = sends_[pair];
  auto& rq = recvs_[pair];
  while (!sq.empty() && !rq.empty()) {
    const Posted a = sq.front(), b = rq.front();
    const Instruction& send = s_.ranks[a.rank][a.step];
    const Instruction& recv = s_.ranks[b.rank][b.step];
    if (!same_transfer(send, recv)) {
      mismatch_[pair] = "order mismatch: rank " + std::to_string(b.rank) + " posts " + to_token(recv) +
                        " but the next message rank " + std::to_string(a.rank) + " sends it is " + to_token(send) +
                        " (step " + std::to_string(a.step) + ")";
      return;
    }
    sq.pop_front();
    rq.pop_front();
    done_[a.rank][a.step] = done_[b.rank][b.step] = 1;
    --unfinished_[a.rank];
    --unfinished_[b.rank];
  }
}

// The first operation of rank r's current batch that has not finished.
std::size_t Replay::first_unfinished(int r) const {
  std::size_t k = pc_[r];
  while (k < batch_end_[r] && done_[r][k]) ++k;
  return k;
}

// What rank r is doing at the end, for the reasons of the ranks waiting on it.
std::string Replay::waiting_on(int r) const {
  if (pc_[r] >= s_.ranks[r].size()) return "rank " + std::to_string(r) + " has finished its program";
  const std::size_t k = first_unfinished(r);
  return "rank " + std::to_string(r) + " blocks at step " + std::to_string(k) + " on " + to_token(s_.ranks[r][k]);
}

BlockedRank Replay::blocked(int r) const {
  const std::size_t k = first_unfinished(r);
  const Instruction& i = s_.ranks[r][k];
  const int peer = s_.peer_rank(i);
  const std::size_t pair = pair_of(r, i);
  std::string reason;
  if (!mismatch_[pair].empty()) {
    reason = mismatch_[pair];
  } else {
    reason = std::string("waits for rank ") + std::to_string(peer) + " to post the matching " +
             (is_send(i.kind) ? "receive " : "send ") + to_token(matching_transfer(i, peer_stage(s_, i))) + "; " +
             waiting_on(peer);
  }
  return {r, k, i, reason};
}

}  // namespace

CheckResult check(const Schedule& schedule) {
  validate(schedule);
  // Replicas run their lead's program in lockstep (schedule.h): the leads' programs decide.
  return Replay(schedule).run();
}

void require_deadlock_free(const Schedule& schedule) {
  CheckResult result = check(schedule);
  if (!result.ok) throw ScheduleError(result.to_string());
}

}  // namespace graphpipe::schedule
