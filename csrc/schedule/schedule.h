// Schedule: what every rank does in one training iteration, as plain data.
//
// A schedule is, per rank, an ordered list of instructions (instruction.h): receives, forwards,
// sends, backwards, the optimizer step. It knows nothing of tensors or process groups: the
// runtime executes it, the simulator (csrc/sim) predicts its timing, the checker (check.h)
// proves it cannot hang. It carries the little of the plan it needs to stand alone (the rank of
// each stage and the stage edges), so a schedule read back from text or JSON can be checked
// without its plan.
//
// Replicated stages (data parallelism inside a stage): a stage may run on several ranks, its
// replicas, listed in stage_ranks with its lead first. Each micro-batch is split by rows among
// the replicas (shards.h), and every replica runs the lead's program unchanged on its
// rows: a transfer instruction then means "exchange my rows with the ranks of the other stage
// that own them", and the stage's all_reduce instruction sums the replicas' gradients. Because
// the programs are identical and every pair of ranks exchanges its rows in the program's order,
// the replicas of a stage move in lockstep with their lead, so the checker (check.h) and the
// simulator reason about the leads' programs alone (leads_only()).
//
// Invariants (checked by validate(), which every loader and generator calls):
//   - num_micro_batches >= 1; at least one stage; every stage on one or more ranks in
//     [0, ranks.size()); a rank holds several stages only where each of them runs on it alone
//     (a replicated stage has its ranks to itself);
//   - a replica's program equals its lead's; a stage with replicas has exactly one all_reduce,
//     after its last backward and before its optimizer step; a stage on one rank has none;
//   - every edge joins two stages with src < dst (stages are numbered in a topological order,
//     as in Plan);
//   - every instruction sits on the rank of its stage, names a micro-batch in range when it
//     has one, and names an edge whose matching end is its stage (a send of an activation
//     leaves the edge's src, its receive arrives at the edge's dst; gradients go the other way);
//   - per stage and micro-batch exactly one forward and one backward, the backward being one B or
//     an I (input gradients) followed later by a W (weight gradients); per edge and micro-batch
//     exactly one send and one receive in each direction, except on a local edge (both stages on
//     one rank), which has none: its tensors stay on the rank; at most one optimizer step per stage;
//   - on each rank: a forward follows the receives of all its inputs (on a local edge: the
//     producing stage's forward of the micro-batch) and the previous micro-batch's forward; a send of an activation
//     follows its forward; a backward follows its forward, the receives of all its output gradients (on a local edge:
//     the consuming stage's B or I of the micro-batch) and the previous micro-batch's backward (B or I); a send of a
//     gradient follows its B or I; the optimizer step (and a replicated stage's all_reduce) follows every B and W of
//     its stage.
// These make the schedule well formed. That it cannot deadlock is a separate property, proved
// by check() in check.h.
//
// Text form (to_string / parse): a table, one row per rank, one column per step:
//
//   schedule 1f1b: 2 stages, 2 micro-batches, 2 ranks
//   stage ranks: 0 1
//   edges: 0->1
//   step   | 0       1     2       3       4     5       6       7
//   rank 0 | 0F0     0SF0e0 ...
//
// Costs: validate, to_string and parse are linear in the number of instructions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "schedule/instruction.h"

namespace graphpipe::schedule {

// A schedule that is malformed, does not fit its plan, or cannot complete.
class ScheduleError : public Error {
 public:
  using Error::Error;
};

struct ScheduleEdge {
  int src = 0;  // producing stage
  int dst = 0;  // consuming stage
  bool operator==(const ScheduleEdge&) const = default;
};

struct Schedule {
  std::string kind;  // a policy's name (generate.h, policies()), or what a hand-made schedule says
  int num_micro_batches = 0;
  std::vector<std::vector<int>> stage_ranks;    // ranks of each stage, its lead first
  std::vector<ScheduleEdge> edges;              // the plan's stage edges, same indices
  std::vector<std::vector<Instruction>> ranks;  // each rank's program, in execution order

  int num_stages() const { return static_cast<int>(stage_ranks.size()); }
  int num_ranks() const { return static_cast<int>(ranks.size()); }
  std::size_t num_instructions() const;

  // Whether an edge is local: both of its stages run on one rank, alone, so its tensors never
  // leave the rank and no transfer instruction moves them.
  bool local(int edge) const;
  // The lead rank (first replica) of a stage.
  int lead_rank(int stage) const { return stage_ranks.at(static_cast<std::size_t>(stage)).front(); }
  // How many ranks run a stage (1 unless it is replicated).
  int replicas(int stage) const { return static_cast<int>(stage_ranks.at(static_cast<std::size_t>(stage)).size()); }
  // The lead rank of the stage at the other end of a transfer instruction.
  int peer_rank(const Instruction& transfer) const;
  // Every rank of the stage at the other end of a transfer instruction.
  const std::vector<int>& peer_ranks(const Instruction& transfer) const;

  // The table described above; parse() reads it back.
  std::string to_string() const;
  // Only forwards and backwards, one row per rank: the shape of the pipeline at a glance
  // (not parseable).
  std::string compute_table() const;

  bool operator==(const Schedule&) const = default;
};

// The schedule with every replica's program left empty: what the deadlock checker and the
// simulator reason about (replicas run their lead's program in lockstep, see above).
Schedule leads_only(const Schedule& schedule);

// Throws ScheduleError naming the rank, step and token of the first broken invariant.
void validate(const Schedule& schedule);

// Reads the text form; throws FormatError on malformed text, ScheduleError on an invalid
// schedule.
Schedule parse(std::string_view text);

}  // namespace graphpipe::schedule
