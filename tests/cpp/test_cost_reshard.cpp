// Stage edges priced by the links the stages' ranks use (cost/reshard.h): the row split agrees
// with the runtime's (schedule/shards.h), one rank each way is the link's own figure, links
// inside a node are cheaper than links across nodes, and a fan-out costs the sending rank the sum
// of its pairs.
#include <gtest/gtest.h>

#include "common/error.h"
#include "cost/presets.h"
#include "cost/reshard.h"
#include "schedule/shards.h"

namespace cost = graphpipe::cost;

TEST(CostReshard, RowSplitIsTheRuntimes) {
  for (std::int64_t rows = 1; rows <= 40; ++rows) {
    for (int d = 1; d <= rows; ++d) {
      for (int i = 0; i < d; ++i) {
        const auto range = cost::replica_row_range(rows, d, i);
        const auto runtime = graphpipe::schedule::shard_rows(rows, d, i);
        EXPECT_EQ(range.first, runtime.begin) << rows << " rows, " << d << " replicas, replica " << i;
        EXPECT_EQ(range.second, runtime.end) << rows << " rows, " << d << " replicas, replica " << i;
      }
    }
  }
  EXPECT_THROW(cost::replica_row_range(2, 3, 0), graphpipe::PlanningError);
}

TEST(CostReshard, OneRankEachWayIsTheLinksFigure) {
  const cost::Devices d = cost::v100(16, 8);
  const double bytes = 3e6;
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {0}, {1}, 8, bytes), d.transfer_seconds(0, 1, bytes));
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {2}, {9}, 8, bytes, 3),
                   d.transfer_seconds(2, 9, bytes) + 2 * d.link_latency[2][9]);
  // Inside a node (NVLink) against across nodes.
  EXPECT_LT(cost::reshard_seconds(d, {0}, {7}, 8, bytes), cost::reshard_seconds(d, {7}, {8}, 8, bytes));
}

TEST(CostReshard, ExtraTensorsCostTheMeasuredMessageFigureWhereGiven) {
  cost::Devices d = cost::v100(16, 8);
  const double bytes = 3e6;
  d.extra_tensor_seconds = 4e-6;  // measured: well under a latency
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {2}, {9}, 8, bytes, 5), d.transfer_seconds(2, 9, bytes) + 4 * 4e-6);
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {2}, {9}, 8, bytes, 1), d.transfer_seconds(2, 9, bytes));
  // Replicated ends: every pair's transfer carries all the tensors (each replica's share of each).
  const double one = cost::reshard_seconds(d, {0, 1}, {2}, 8, bytes, 1);
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {0, 1}, {2}, 8, bytes, 3), one + 2 * 2 * 4e-6);
  // Unset: a link latency per extra tensor, the rule for descriptions that were not measured.
  d.extra_tensor_seconds.reset();
  EXPECT_DOUBLE_EQ(cost::reshard_seconds(d, {0, 1}, {2}, 8, bytes, 3), one + 2 * 2 * d.link_latency[0][2]);
}

TEST(CostReshard, ReplicasMoveTheirSharesAndTheBusiestRankSetsTheTime) {
  const cost::Devices d = cost::v100(16, 8);
  const double bytes = 4e6;
  // One rank to four on its node: it sends each a quarter, one after another.
  const double fan_out = cost::reshard_seconds(d, {0}, {1, 2, 3, 4}, 8, bytes);
  EXPECT_NEAR(fan_out, 4 * d.link_latency[0][1] + bytes / d.link_bandwidth[0][1], 1e-15);
  // Two to two with equal splits: each pair moves half, at once.
  const double paired = cost::reshard_seconds(d, {0, 1}, {2, 3}, 8, bytes);
  EXPECT_NEAR(paired, d.transfer_seconds(0, 2, bytes / 2), 1e-15);
  // The same pairs across nodes take longer.
  EXPECT_GT(cost::reshard_seconds(d, {0, 1}, {8, 9}, 8, bytes), paired);
  // 3 rows to 2 replicas: rows {0}, {1}, {2} -> {0, 1}, {2}: the first receiver takes two pairs.
  const double uneven = cost::reshard_seconds(d, {0, 1, 2}, {3, 4}, 3, 3e6);
  EXPECT_NEAR(uneven, 2 * d.transfer_seconds(0, 3, 1e6), 1e-15);
}
