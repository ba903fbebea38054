// The series-parallel DP's memo values (graphpipe_dp.h): a fragment's least depth and how its
// best plan starts, one struct per move, so that the rebuild can follow it. Replica counts are
// the stage's devices: 1 where the problem is not replicated.
//
// Device and replica counts are at most 255 (the solver's device cap, Solver::devices_), so the
// largest moves hold them in a byte: an Entry is 20 bytes and a memo slot 32 (dp_memo.h), half a
// cache line, where the DP's time goes mostly to memo look-ups that miss the cache.
//
// Fragments (dp_solver.h): solve (a whole subtree), series (children i.. of a series node),
// parallel (sorted branches j.. of a parallel node), inside (after a fork stage), to_join (a
// branch's items i.. whose last stage also holds the join), others (the branches of a parallel
// node but one of its two largest).
#pragma once

#include <cassert>
#include <cstdint>
#include <variant>

namespace graphpipe::partition::series_parallel_dp {

inline constexpr int kInf = 1 << 20;

// A device or replica count held in a move's byte. The solver caps devices at 255, so a count
// outside 0..255 is a bug in the DP, caught here in debug builds rather than stored wrapped.
constexpr std::uint8_t device_byte(int count) {
  assert(count >= 0 && count <= 255);
  return static_cast<std::uint8_t>(count);
}

// An empty fragment (depth 0) or one with no plan (depth kInf).
struct Nothing {};
// solve: the whole subtree as one stage.
struct WholeStage {
  int replicas = 1;
};
// solve: the subtree decomposed (its series or parallel fragment from the first child).
struct Decomposed {};
// series / to_join: items i..last as one stage, the rest after it.
struct Group {
  int last = -1;
  int replicas = 1;
};
// series: child i decomposed on `devices`, the rest on the others; parallel: branch j on
// `devices`; to_join: item i decomposed on `devices`.
struct Split {
  int devices = 0;
};
// parallel: sorted branches j..last share one stage.
struct Run {
  int last = -1;
  int replicas = 1;
};
// series: children i..child-1 and the first `head` items of the `lead`-th largest branch
// (0 or 1) of parallel child `child` as one stage; inside() from there.
struct Fork {
  int child = -1;
  int head = 0;
  std::uint8_t lead = 0;
  std::uint8_t replicas = 1;
};
// inside: the series after the join on `join_devices`, the fork branch's rest on
// `branch_devices` (0 when nothing is left of it), the other branches on the rest.
struct Open {
  int join_devices = 0;
  int branch_devices = 0;
};
// inside, for join, cross and close: the join stage holds the series children q+1..last_child
// after the parallel node, and the series after last_child runs on `after_devices`.
struct JoinAt {
  int last_child = -1;
  std::uint8_t after_devices = 0;
};
// inside: the fork branch's rest, its last stage the join stage (to_join), on `tail_devices`;
// the other branches on the rest.
struct Join {
  JoinAt at;
  int tail_devices = 0;
};
// inside: as Join, but the other largest branch from its start ends in the join stage, and the
// fork branch's rest gets `fork_devices` (0 when nothing is left of it).
struct Cross {
  JoinAt at;
  std::uint8_t tail_devices = 0;
  std::uint8_t fork_devices = 0;
};
// inside: the fork branch's rest and the other largest branch in the join stage; the smaller
// branches on the rest.
struct Close {
  JoinAt at;
  int replicas = 1;
};
// to_join: items i.. and the series children up to the join's last child as one stage.
struct JoinStage {
  int replicas = 1;
};
// others: the largest branch on `largest_devices`, the branches after the two largest on the rest.
struct OthersSplit {
  int largest_devices = 0;
};

using Step = std::variant<Nothing, WholeStage, Decomposed, Group, Split, Run, Fork, Open, Join, Cross, Close, JoinStage,
                          OthersSplit>;

struct Entry {
  int depth = kInf;
  Step step;
};
static_assert(sizeof(Entry) <= 20, "a memo slot of a 64-bit key should stay within 32 bytes (dp_memo.h)");

}  // namespace graphpipe::partition::series_parallel_dp
