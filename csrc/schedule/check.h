// check: proves that a schedule completes, or shows where it hangs.
//
// Blocking model (what the runtime does over Gloo/NCCL point-to-point, docs/design.md §9):
//   - Each rank runs its program in order. A compute instruction (forward, backward, optimizer)
//     always finishes: its inputs were received by earlier instructions of the same rank.
//   - A maximal run of consecutive sends and receives in a program is one *batch* (a "step"):
//     the rank posts every operation of the batch, then waits until all of them have finished,
//     then goes on. This is batch_isend_irecv followed by waiting on every request.
//   - Messages match FIFO per ordered pair of ranks (src -> dst): the k-th receive that dst posts
//     from src takes the k-th send that src posts to dst. The runtime tags each message by its
//     edge, direction and tensor (executor.cpp, tag_of), so a receive that meets a send of
//     another transfer (other edge, micro-batch or direction) would wait for a message that
//     never comes, or on a transport that matches by order alone read the wrong tensor; the
//     checker requires the order to agree and reports a mismatch as the rank blocking.
//   - A send finishes only when its receive is posted, and a receive when its send is posted
//     (rendezvous, as Gloo sends behave); no operation finishes on its own.
// Replicated stages: every replica runs its lead's program, and every pair of ranks of two
// stages exchanges its rows in that program's order, so a replica can post or finish an
// operation exactly when its lead can; the all_reduce, a collective of one stage's replicas,
// is reached by all of them at the same step. The check therefore runs on the leads' programs
// (leads_only() in schedule.h).
// This is the strictest reasonable model: a schedule that completes under it also completes
// when sends are buffered or when a runtime waits less, so passing the check is a proof for the
// runtime. Structural validity (validate() in schedule.h) is checked first and throws.
//
// Result: ok, or for each rank that cannot finish, the instruction it blocks on (its first
// unfinished operation) and why: which rank has not posted the partner, or which token it met
// instead. Cost: O(I + R * B) for I instructions, R ranks and B batches per rank.
#pragma once

#include <string>
#include <vector>

#include "schedule/schedule.h"

namespace graphpipe::schedule {

struct BlockedRank {
  int rank = 0;
  std::size_t step = 0;     // position of the blocking instruction in the rank's program
  Instruction instruction;  // the instruction it blocks on
  std::string reason;
};

struct CheckResult {
  bool ok = true;
  std::size_t batches = 0;           // communication batches completed (all ranks)
  std::vector<BlockedRank> blocked;  // empty when ok
  // "ok: ..." or one line per blocked rank.
  std::string to_string() const;
};

CheckResult check(const Schedule& schedule);

// check(), throwing ScheduleError with the report when the schedule can hang.
void require_deadlock_free(const Schedule& schedule);

}  // namespace graphpipe::schedule
