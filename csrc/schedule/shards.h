// shards: which rows of a micro-batch each replica of a replicated stage owns.
//
// A stage with d replicas splits every micro-batch of b rows along its first (batch) dimension
// as torch.tensor_split(x, d) does: the first b % d replicas get ceil(b / d) rows, the others
// floor(b / d), in replica order. A stage edge between stages of different replica counts is
// re-sharded row by row: each sending replica sends every receiving replica the rows both own
// (overlap), and gradients travel back the same way. The runtime (which rows to send and where)
// and the simulator (how many bytes each link carries) both read these functions, so they agree
// by construction. Every function is O(1).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/error.h"

namespace graphpipe::schedule {

struct RowRange {
  std::int64_t begin = 0;  // first row, inclusive
  std::int64_t end = 0;    // one past the last row
  std::int64_t size() const { return end > begin ? end - begin : 0; }
  bool operator==(const RowRange&) const = default;
};

// Rows of replica `index` of `replicas` in a micro-batch of `rows` rows. Throws PlanningError
// when a replica would own no row (rows < replicas) or the index is out of range.
inline RowRange shard_rows(std::int64_t rows, int replicas, int index) {
  if (replicas < 1 || index < 0 || index >= replicas) {
    throw PlanningError("replica " + std::to_string(index) + " of " + std::to_string(replicas) + " does not exist");
  }
  if (rows < replicas) {
    throw PlanningError("a micro-batch of " + std::to_string(rows) + " rows cannot be split among " +
                        std::to_string(replicas) +
                        " replicas (each needs at least one row): use a "
                        "larger micro-batch or fewer replicas");
  }
  const std::int64_t base = rows / replicas, extra = rows % replicas;
  const std::int64_t begin = index * base + std::min<std::int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

// The rows two ranges share (empty when they do not meet).
inline RowRange overlap(const RowRange& a, const RowRange& b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

}  // namespace graphpipe::schedule
