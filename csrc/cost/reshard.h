// reshard: what moving one stage edge's tensors costs between the ranks of two stages, by the
// links those ranks actually use (docs/design.md, "Replicated stages in the planner").
//
// One rank per stage: latency + bytes / bandwidth of the link between the two ranks, plus
// Devices::extra_tensor_cost for each tensor after the first (the runtime sends every tensor as
// its own message, all posted before it waits: a measured per-message cost, else one latency).
// Replicated stages: a micro-batch of `rows` rows is split among each stage's replicas as
// torch.tensor_split does (schedule/shards.h: the first rows % d replicas get one row more), and
// every pair of a sending and a receiving replica whose rows overlap moves those rows' share of
// the bytes over its own link, all pairs at once; a rank's pairs take their sum, and the
// transfer lasts as long as the busiest rank. Intra-node pairs get the fast links and pairs
// across nodes the slow ones, so the figure depends on placement, not on the slowest link of the
// description. The planner's evaluation (partition/evaluate.h) and the simulator (sim/simulate.h)
// both price stage edges with it, so they agree by construction. O(ds x dr).
#pragma once

#include <cstdint>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

// Seconds of one transfer of `bytes` (one micro-batch, all of the edge's `tensors`) from the
// ranks `senders` to the ranks `receivers` (each stage's replicas in replica order). Throws
// PlanningError when a stage has more replicas than the micro-batch has rows.
double reshard_seconds(const Devices& devices, const std::vector<int>& senders, const std::vector<int>& receivers,
                       std::int64_t rows, double bytes, int tensors = 1);

// The first row and one past the last of replica `index` of `replicas` (torch.tensor_split's
// split, the rule of schedule/shards.h; a test checks that they agree).
std::pair<std::int64_t, std::int64_t> replica_row_range(std::int64_t rows, int replicas, int index);

}  // namespace graphpipe::cost
