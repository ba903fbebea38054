// cost/devices.h collective link figures and cost/rings.h ring_step_seconds: where the
// description gives a collective link, every collective's ring step is priced from it (latency +
// chunk / bandwidth) instead of from the point-to-point links; where it does not (0), nothing
// changes. Checked through the all-reduce, the all-gather and a stage's gradient-bucket sync.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "cost/all_gather.h"
#include "cost/all_reduce.h"
#include "cost/devices_json.h"
#include "cost/presets.h"
#include "cost/rings.h"
#include "cost/sync_cost.h"
#include "cost/sync_method.h"

namespace gc = graphpipe::cost;

namespace {

std::vector<int> first(int n) {
  std::vector<int> g(n);
  for (int i = 0; i < n; ++i) g[i] = i;
  return g;
}

// 4 CPU ranks with round point-to-point links (10 us, 4 GB/s).
gc::Devices ranks(int count = 4) {
  gc::Devices d = gc::cpu_rank(count, false);
  gc::set_node_links(d, count, 4e9, 10e-6, 4e9, 10e-6);
  return d;
}

}  // namespace

TEST(CostCollectiveLink, RingStepUsesTheCollectiveFiguresWhereGiven) {
  gc::Devices d = ranks();
  const std::vector<int> ring = first(4);
  const double chunk = 256e3;
  EXPECT_DOUBLE_EQ(gc::ring_step_seconds(d, ring, chunk), 10e-6 + chunk / 4e9);
  d.collective_latency_seconds = 150e-6;
  d.collective_bandwidth_bytes_per_second = 0.5e9;
  EXPECT_DOUBLE_EQ(gc::ring_step_seconds(d, ring, chunk), 150e-6 + chunk / 0.5e9);
  // A ring of one device, or nothing to move, costs nothing either way.
  EXPECT_EQ(gc::ring_step_seconds(d, {2}, chunk), 0.0);
  EXPECT_EQ(gc::ring_step_seconds(d, ring, 0.0), 0.0);
  // Point-to-point transfers (a pipeline's) keep the links' figures.
  EXPECT_DOUBLE_EQ(d.transfer_seconds(0, 1, chunk), 10e-6 + chunk / 4e9);
}

TEST(CostCollectiveLink, AllReduceAndAllGatherFollowTheRingFormula) {
  gc::Devices d = ranks();
  const double bytes = 1 << 20;
  const double from_links = gc::best_all_reduce(d, first(4), bytes).seconds;
  EXPECT_NEAR(from_links, 2.0 * 3.0 * (10e-6 + bytes / 4.0 / 4e9), 1e-15);
  d.collective_latency_seconds = 200e-6;
  d.collective_bandwidth_bytes_per_second = 1e9;
  // 2 (n - 1) steps of bytes / n, each latency + chunk / bandwidth, whichever algorithm.
  const double expected = 2.0 * 3.0 * (200e-6 + bytes / 4.0 / 1e9);
  EXPECT_NEAR(gc::ring_all_reduce(d, first(4), bytes).seconds, expected, 1e-15);
  EXPECT_NEAR(gc::best_all_reduce(d, first(4), bytes).seconds, expected, 1e-15);
  EXPECT_NEAR(gc::hierarchical_all_reduce(d, first(4), bytes).seconds, expected, 1e-15);
  // A sub-group is priced by the same per-step figures: 2 (d - 1) steps of bytes / d.
  EXPECT_NEAR(gc::ring_all_reduce(d, {1, 3}, bytes).seconds, 2.0 * (200e-6 + bytes / 2.0 / 1e9), 1e-15);
  // The all-gather's n - 1 steps move each device's whole share.
  EXPECT_NEAR(gc::ring_all_gather(d, first(4), bytes).seconds, 3.0 * (200e-6 + bytes / 1e9), 1e-15);
  // Back to 0: priced from the links as before.
  d.collective_latency_seconds = 0.0;
  d.collective_bandwidth_bytes_per_second = 0.0;
  EXPECT_EQ(gc::best_all_reduce(d, first(4), bytes).seconds, from_links);
}

TEST(CostCollectiveLink, StageSyncPricesEveryBucketFromTheFigures) {
  gc::Devices d = ranks();
  gc::SyncMethod all_reduce;
  all_reduce.kind = gc::SyncKind::all_reduce;
  const double params = 4.0 * (1 << 20), bucket = 1 << 20;  // flat buckets (no shapes)
  const double before = gc::stage_sync_cost(all_reduce, d, first(4), {}, params, bucket).comm_seconds;
  d.collective_latency_seconds = 300e-6;
  d.collective_bandwidth_bytes_per_second = 0.8e9;
  const gc::SyncCost after = gc::stage_sync_cost(all_reduce, d, first(4), {}, params, bucket);
  ASSERT_FALSE(after.buckets.empty());
  // Every bucket's all-reduce: 2 (n - 1) = 6 steps of its bytes / 4 at the collective figures.
  double expected = 0.0;
  for (const gc::BucketCost& b : after.buckets) expected += 6.0 * (300e-6 + b.payload_bytes / 4.0 / 0.8e9);
  EXPECT_NEAR(after.comm_seconds, expected, 1e-12);
  EXPECT_GT(after.comm_seconds, before);
}

TEST(CostCollectiveLink, JsonCarriesTheFiguresAndOlderFilesHaveNone) {
  gc::Devices d = ranks();
  EXPECT_EQ(gc::to_json(d).count("collective_bandwidth_bytes_per_second"), 0u);  // not given: not written
  d.collective_latency_seconds = 123e-6;
  d.collective_bandwidth_bytes_per_second = 0.75e9;
  const gc::Devices back = gc::loads_devices(gc::dumps(d));
  EXPECT_DOUBLE_EQ(back.collective_latency_seconds, 123e-6);
  EXPECT_DOUBLE_EQ(back.collective_bandwidth_bytes_per_second, 0.75e9);
  auto doc = gc::to_json(d);
  doc.erase("collective_latency_seconds");
  doc.erase("collective_bandwidth_bytes_per_second");
  const gc::Devices older = gc::devices_from_json(doc);
  EXPECT_FALSE(older.has_collective_link());
  doc["collective_bandwidth_bytes_per_second"] = -1.0;
  EXPECT_THROW(gc::devices_from_json(doc), graphpipe::FormatError);
}

TEST(CostCollectiveLink, ValidateNamesBadFigures) {
  gc::Devices d = ranks();
  d.collective_latency_seconds = 50e-6;  // a latency without a bandwidth prices nothing
  try {
    d.validate();
    FAIL() << "a collective latency without a bandwidth was accepted";
  } catch (const graphpipe::PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("collective_bandwidth_bytes_per_second"), std::string::npos) << e.what();
  }
  d.collective_bandwidth_bytes_per_second = 1e9;
  EXPECT_NO_THROW(d.validate());
  d.collective_latency_seconds = -1.0;
  EXPECT_THROW(d.validate(), graphpipe::PlanningError);
}
