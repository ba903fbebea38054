// In-flight micro-batches per stage: how many micro-batches' activations a stage holds at its
// peak. Stage memory grows with it, so it couples the partition to the memory limit.
//
// Until the scheduler (csrc/schedule) supplies its own figure, the rule is 1F1B's: a stage holds
// as many micro-batches as there are stages on the longest path from it to a sink (itself
// included), never more than the micro-batches of a step. On a chain of S stages that is
// S - i for stage i; a graph plan of depth 3 holds 3 at its first stage.
//
// The rule is a plain function value (InFlightRule) so a partitioner can be given another one
// (the schedule's) without changing the partitioner. Stages are 0..S-1 in topological order of
// the stage graph; edges are (src, dst) pairs with src < dst. O(S + E).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace graphpipe::cost {

using StageEdges = std::vector<std::pair<int, int>>;
using InFlightRule =
    std::function<std::vector<int>(int num_stages, const StageEdges& edges, std::int64_t num_micro_batches)>;

std::vector<int> in_flight_1f1b(int num_stages, const StageEdges& edges, std::int64_t num_micro_batches);

}  // namespace graphpipe::cost
