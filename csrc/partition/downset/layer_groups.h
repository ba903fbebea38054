// The down-set DP's layers (downset.h): the figures of a set of operators as one stage, the
// weakly connected components of a layer, and the best groupings of a layer's components into
// stages (exact up to kExactComponents components, longest processing time first beyond).
// Internal to partition/downset/.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "partition/problem.h"
#include "partition/recompute.h"

namespace graphpipe::partition::downset {

using Set = std::uint64_t;  // bit v: operator v (graphs of at most 64 operators)

inline Set bit(int v) { return Set{1} << v; }

// The down-sets of a DAG of preds.size() <= 64 nodes (preds[v]: the nodes with an edge into v),
// breadth-first from the empty set: each is one node more than one before it, so sizes never
// decrease along the list and a strict superset always comes later. Empty when there are more
// than `budget`. The exact down-set DP and Piper's planner (piper/layer_graph.h) both walk them.
std::vector<Set> enumerate_downsets(const std::vector<Set>& preds, int budget);
inline int lowest(Set s) { return __builtin_ctzll(s); }

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A set of operators as a stage, alone: its time, the two parts of its memory, and what
// activation recomputation runs again and keeps (forward seconds, received bytes; recompute.h).
struct Figures {
  double time = 0.0, static_bytes = 0.0, act_bytes = 0.0, optimizer = 0.0;
  double forward = 0.0, input_bytes = 0.0;
  void add(const Figures& f) {
    time += f.time;
    static_bytes += f.static_bytes;
    act_bytes += f.act_bytes;
    forward += f.forward;
    input_bytes += f.input_bytes;
  }
  void remove(const Figures& f) {
    time -= f.time;
    static_bytes -= f.static_bytes;
    act_bytes -= f.act_bytes;
    forward -= f.forward;
    input_bytes -= f.input_bytes;
  }
  StageMemory memory(int in_flight, double limit) const {
    return stage_memory(static_bytes, act_bytes, input_bytes, in_flight, limit);
  }
  // The stage's time at `in_flight` micro-batches when it fits the limit (recomputed where it
  // fits only so), infinity when it does not.
  double time_if_fits(int in_flight, double limit) const {
    const StageMemory m = memory(in_flight, limit);
    return m.bytes <= limit ? time + m.extra_seconds(forward) : std::numeric_limits<double>::infinity();
  }
};

// The figures of the operators in `stage` as one stage of problem p.
Figures figures_of(const Problem& p, Set stage);

// The weakly connected components of the subgraph induced by `layer` (neighbours[v]: v's
// operators joined to it by an edge either way).
std::vector<Set> components(Set layer, const std::vector<Set>& neighbours);

// The components grouped into exactly g stages (group[q]: the stage of component q).
struct Grouping {
  double slowest = kInf;
  std::vector<int> group;
};

// For g = 1..cap, the grouping of the m parts into exactly g stages with the least slowest
// stage, every stage fitting at `in_flight` micro-batches (slowest = infinity where none fits).
std::vector<Grouping> group_parts(const Figures* parts, int m, int cap, int in_flight, double limit);

}  // namespace graphpipe::partition::downset
