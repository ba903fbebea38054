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
    out << "\n  rank " << b.rank << " blocks at step " << b.step << " on " << to_token(b.instruction)
        << ": " << b.reason;
  }
  return out.str();
}

CheckResult check(const Schedule& schedule) {
  validate(schedule);
  // Replicas run their lead's program in lockstep (schedule.h): the leads' programs decide.
  const Schedule s = leads_only(schedule);
  const int R = s.num_ranks();
  std::vector<std::size_t> pc(R, 0), batch_end(R, 0), unfinished(R, 0);
  std::vector<char> in_batch(R, 0);
  std::vector<std::vector<char>> done(R);
  for (int r = 0; r < R; ++r) done[r].assign(s.ranks[r].size(), 0);
  // Posted, unmatched operations per ordered pair src * R + dst.
  std::vector<std::deque<Posted>> sends(static_cast<std::size_t>(R) * R), recvs(sends.size());
  std::vector<std::string> mismatch(sends.size());
  CheckResult result;

  auto match = [&](std::size_t pair) {
    auto& sq = sends[pair];
    auto& rq = recvs[pair];
    while (!sq.empty() && !rq.empty()) {
      const Posted a = sq.front(), b = rq.front();
      const Instruction& send = s.ranks[a.rank][a.step];
      const Instruction& recv = s.ranks[b.rank][b.step];
      if (!same_transfer(send, recv)) {
        mismatch[pair] = "order mismatch: rank " + std::to_string(b.rank) + " posts " +
                         to_token(recv) + " but the next message rank " + std::to_string(a.rank) +
                         " sends it is " + to_token(send) + " (step " + std::to_string(a.step) + ")";
        return;
      }
      sq.pop_front();
      rq.pop_front();
      done[a.rank][a.step] = done[b.rank][b.step] = 1;
      --unfinished[a.rank];
      --unfinished[b.rank];
    }
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < R; ++r) {
      const auto& program = s.ranks[r];
      while (pc[r] < program.size()) {
        if (in_batch[r]) {
          if (unfinished[r] > 0) break;
          in_batch[r] = 0;
          pc[r] = batch_end[r];
          ++result.batches;
          progress = true;
          continue;
        }
        if (is_compute(program[pc[r]].kind)) {
          ++pc[r];
          progress = true;
          continue;
        }
        std::size_t q = pc[r];
        while (q < program.size() && is_transfer(program[q].kind)) {
          const int peer = s.peer_rank(program[q]);
          const bool send = is_send(program[q].kind);
          const std::size_t pair = send ? static_cast<std::size_t>(r) * R + peer
                                        : static_cast<std::size_t>(peer) * R + r;
          (send ? sends : recvs)[pair].push_back({r, q});
          ++q;
        }
        in_batch[r] = 1;
        batch_end[r] = q;
        unfinished[r] = q - pc[r];
        progress = true;
        for (std::size_t k = pc[r]; k < q; ++k) {
          const int peer = s.peer_rank(program[k]);
          match(is_send(program[k].kind) ? static_cast<std::size_t>(r) * R + peer
                                         : static_cast<std::size_t>(peer) * R + r);
        }
      }
    }
  }

  // What each rank is doing at the end, for the reasons below.
  auto waiting_on = [&](int r) -> std::string {
    if (pc[r] >= s.ranks[r].size()) return "rank " + std::to_string(r) + " has finished its program";
    std::size_t k = pc[r];
    while (k < batch_end[r] && done[r][k]) ++k;
    return "rank " + std::to_string(r) + " blocks at step " + std::to_string(k) + " on " +
           to_token(s.ranks[r][k]);
  };
  for (int r = 0; r < R; ++r) {
    if (pc[r] >= s.ranks[r].size()) continue;
    result.ok = false;
    std::size_t k = pc[r];
    while (k < batch_end[r] && done[r][k]) ++k;
    const Instruction& i = s.ranks[r][k];
    const int peer = s.peer_rank(i);
    const std::size_t pair = is_send(i.kind) ? static_cast<std::size_t>(r) * R + peer
                                             : static_cast<std::size_t>(peer) * R + r;
    std::string reason;
    if (!mismatch[pair].empty()) {
      reason = mismatch[pair];
    } else {
      reason = std::string("waits for rank ") + std::to_string(peer) + " to post the matching " +
               (is_send(i.kind) ? "receive " : "send ") +
               to_token(matching_transfer(i, peer_stage(s, i))) + "; " +
               waiting_on(peer);
    }
    result.blocked.push_back({r, k, i, reason});
  }
  return result;
}

void require_deadlock_free(const Schedule& schedule) {
  CheckResult result = check(schedule);
  if (!result.ok) throw ScheduleError(result.to_string());
}

}  // namespace graphpipe::schedule
