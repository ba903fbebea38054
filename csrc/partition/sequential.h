// The sequential (PipeDream-style) partitioner, the baseline every benchmark compares against:
// one topological order of the operators cut into contiguous segments, so the stages form a
// chain. A dynamic program over (segment start, stages left) minimises the slowest stage's time
// under the memory limit, where the i-th stage from the end of a chain holds min(i, M)
// micro-batches in flight (1F1B); among equally fast chains the shortest wins.
//
// Exact over cut positions for up to U "units" of the order, U = sqrt(4e7 / stages) (about 790
// for 64 stages); longer orders are first cut into U chunks of about equal compute, so cuts fall
// only at chunk boundaries. Cost O(U^2 x stages + U x (V + E)).
// Returns a node -> stage label assignment (labels along the chain), or an empty vector when no
// chain fits in memory.
#pragma once

#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

std::vector<int> sequential_assignment(const Problem& problem);

}  // namespace graphpipe::partition
