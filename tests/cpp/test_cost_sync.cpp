// The pricing of the sync methods (cost/sync_method.h, cost/gradient_buckets.h, cost/power_sgd.h,
// cost/all_gather.h, cost/sync_cost.h) against hand-computed small cases: the runtime's bucket
// layout, each method's bytes and seconds, the all-gather's closed forms, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/all_gather.h"
#include "cost/all_reduce.h"
#include "cost/gradient_buckets.h"
#include "cost/power_sgd.h"
#include "cost/presets.h"
#include "cost/sync_cost.h"
#include "cost/sync_kind.h"
#include "cost/sync_method.h"

namespace gc = graphpipe::cost;
using graphpipe::PlanningError;
using graphpipe::graph::ParamShape;

namespace {

// `count` devices on nodes of `per_node`, round link figures, and round compute figures.
gc::Devices two_level(int count, int per_node) {
  gc::Devices d = gc::v100(count, per_node);
  gc::set_node_links(d, per_node, 100e9, 2e-6, 10e9, 20e-6);
  d.flops_per_second = 1e9;
  d.memory_bandwidth = 1e9;
  d.op_overhead_seconds = 0.0;
  return d;
}

std::vector<int> first(int n) {
  std::vector<int> g(n);
  for (int i = 0; i < n; ++i) g[i] = i;
  return g;
}

gc::SyncMethod method(gc::SyncKind kind) {
  gc::SyncMethod m;
  m.kind = kind;
  return m;
}

ParamShape param(const std::string& name, std::vector<std::int64_t> shape, std::string dtype = "float32",
                 int element_size = 4, bool trained = true) {
  return ParamShape{name, std::move(shape), std::move(dtype), element_size, trained};
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const PlanningError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(CostSync, MethodValidationNamesTheField) {
  auto m = method(gc::SyncKind::local_sgd);
  m.period = 0.5;
  EXPECT_NE(error_of([&] { m.validate(); }).find("period"), std::string::npos);
  m = method(gc::SyncKind::top_k);
  for (double bad : {0.0, 1.5, -0.1}) {
    m.ratio = bad;
    EXPECT_NE(error_of([&] { m.validate(); }).find("ratio"), std::string::npos) << bad;
  }
  m = method(gc::SyncKind::power_sgd);
  m.rank = 0;
  EXPECT_NE(error_of([&] { m.validate(); }).find("rank"), std::string::npos);
  m.rank = 2;
  m.min_compression_rate = 0.0;
  EXPECT_NE(error_of([&] { m.validate(); }).find("min_compression_rate"), std::string::npos);
  EXPECT_NE(error_of([] { gc::parse_sync_kind("dgc"); }).find("top_k"), std::string::npos);
  // A field of another kind is not checked: the default all-reduce ignores period.
  m = method(gc::SyncKind::all_reduce);
  m.period = 0.0;
  EXPECT_EQ(error_of([&] { m.validate(); }), "");
}

TEST(CostSync, MethodJsonRoundTripsAndDescribes) {
  auto m = method(gc::SyncKind::power_sgd);
  m.rank = 4;
  m.hierarchical = true;
  EXPECT_EQ(gc::sync_method_from_json(gc::to_json(m), "$"), m);
  EXPECT_EQ(m.describe(), "power_sgd(rank=4, hierarchical)");
  auto bad = gc::to_json(m);
  bad["rank"] = -1;
  EXPECT_THROW(gc::sync_method_from_json(bad, "$"), PlanningError);
  EXPECT_EQ(gc::parse_sync_kind("topk"), gc::SyncKind::top_k);
}

TEST(CostSync, EveryKindIsDescribedOnceAndParsesBack) {
  // The registry names each kind of the enum, by the name its model gives, and the parser reads
  // every name and alias back; an unknown name lists them all.
  const std::vector<gc::SyncKind> kinds = gc::all_sync_kinds();
  ASSERT_EQ(kinds.size(), 4u);
  for (gc::SyncKind kind : kinds) {
    const gc::SyncKindModel& model = gc::sync_kind_model(kind);
    EXPECT_EQ(gc::to_string(kind), model.name());
    EXPECT_EQ(gc::parse_sync_kind(std::string(model.name())), kind);
    for (std::string_view alias : model.aliases()) EXPECT_EQ(gc::parse_sync_kind(std::string(alias)), kind);
    gc::SyncMethod m;
    m.kind = kind;
    EXPECT_NO_THROW(m.validate());
    EXPECT_EQ(m.describe().rfind(model.name(), 0), 0u) << m.describe();
  }
  EXPECT_TRUE(gc::sync_kind_model(gc::SyncKind::local_sgd).local_updates());
  EXPECT_TRUE(gc::sync_kind_model(gc::SyncKind::power_sgd).needs_shapes());
  EXPECT_THROW(gc::sync_kind_model(gc::SyncKind::end), PlanningError);
  try {
    gc::parse_sync_kind("fp8");
    FAIL() << "an unknown kind was parsed";
  } catch (const PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce, local_sgd, top_k, power_sgd"), std::string::npos) << e.what();
  }
}

TEST(CostSync, BucketsFollowTheRuntimesRule) {
  // Parameters in registration order; the runtime walks them from the last: e, (d frozen), c, b, a.
  const std::vector<ParamShape> params = {param("a", {300}), param("b", {10, 10}), param("c", {50}, "float16", 2),
                                          param("d", {7}, "float32", 4, false), param("e", {10})};
  // Cap 1000 B: e (40 B) opens the float32 bucket, c opens the float16 one, b joins (440 B), a
  // joins too (the bucket held less than the cap) and passes it: 1640 B.
  auto wide = gc::gradient_buckets(params, 1000.0);
  ASSERT_EQ(wide.size(), 2u);
  EXPECT_EQ(wide[0].parameters, (std::vector<int>{4, 1, 0}));
  EXPECT_EQ(wide[0].numel, 410);
  EXPECT_DOUBLE_EQ(wide[0].bytes(), 1640.0);
  EXPECT_EQ(wide[1].dtype, "float16");
  EXPECT_EQ(wide[1].parameters, (std::vector<int>{2}));
  // Cap 400 B: after b the float32 bucket holds 440 B >= 400, so a opens a third bucket.
  auto narrow = gc::gradient_buckets(params, 400.0);
  ASSERT_EQ(narrow.size(), 3u);
  EXPECT_EQ(narrow[0].parameters, (std::vector<int>{4, 1}));
  EXPECT_EQ(narrow[2].parameters, (std::vector<int>{0}));
  // A bucket that holds exactly the cap is closed: a opens a third bucket at 440 B too.
  EXPECT_EQ(gc::gradient_buckets(params, 440.0).size(), 3u);
  EXPECT_EQ(gc::gradient_buckets(params, 441.0).size(), 2u);
  // No cap: one bucket per dtype.
  EXPECT_EQ(gc::gradient_buckets(params, 0.0).size(), 2u);
}

TEST(CostSync, TheFirstBucketIsDdpsSmallOne) {
  // DDP's sizes: the first bucket of each (dtype, device) closes at 1 MiB, the others at the cap.
  // Float32 parameters of 0.5, 0.75, 8, 8 and 8 MiB, registered in that order (walked from the
  // last): 8 MiB opens the first bucket and passes 1 MiB alone; the next two 8 MiB share the
  // second (16 MiB >= 10 MiB closes it); 0.75 and 0.5 MiB open the third.
  const double mib = gc::kFirstBucketBytes;
  const std::int64_t quarter = 65536;  // float32 elements in 0.25 MiB
  const std::vector<ParamShape> params = {param("a", {2 * quarter}), param("b", {3 * quarter}),
                                          param("c", {32 * quarter}), param("d", {32 * quarter}),
                                          param("e", {32 * quarter})};
  auto buckets = gc::gradient_buckets(params, 10 * mib);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].parameters, (std::vector<int>{4}));
  EXPECT_EQ(buckets[1].parameters, (std::vector<int>{3, 2}));
  EXPECT_EQ(buckets[2].parameters, (std::vector<int>{1, 0}));
  // A cap under 1 MiB caps the first bucket too; the default cap is DDP's 25 MiB.
  EXPECT_DOUBLE_EQ(gc::first_bucket_cap(0.5 * mib), 0.5 * mib);
  EXPECT_DOUBLE_EQ(gc::first_bucket_cap(gc::kDefaultBucketBytes), mib);
  EXPECT_DOUBLE_EQ(gc::kDefaultBucketBytes, 25 * mib);
  // Without shapes: 1 MiB, then the rest in equal buckets of at most the cap.
  EXPECT_EQ(gc::bucket_sizes(0.0), std::vector<double>{});
  EXPECT_EQ(gc::bucket_sizes(0.5 * mib), (std::vector<double>{0.5 * mib}));
  EXPECT_EQ(gc::bucket_sizes(41 * mib, 25 * mib), (std::vector<double>{mib, 20 * mib, 20 * mib}));
  EXPECT_EQ(gc::bucket_sizes(41 * mib, 0.0), (std::vector<double>{41 * mib}));
}

TEST(CostSync, ExposedSyncFollowsTheBucketsReadyTimes) {
  // One bucket: the whole sum after the backward.
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(3.0, 10.0, {5.0}), 3.0);
  // Four equal buckets, ready at 2.5, 5, 7.5 and 10 s, each 1 s: only the last one is exposed.
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(4.0, 10.0, {1.0, 1.0, 1.0, 1.0}), 1.0);
  // Sums longer than their spacing queue up: 4 s each from 2.5 s, back to back, end at 18.5 s.
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(16.0, 10.0, {1.0, 1.0, 1.0, 1.0}), 8.5);
  // A small first bucket and a large last one: the last one's share is exposed.
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(4.0, 10.0, {1.0, 3.0}), 3.0);
}

TEST(CostSync, BucketSpansQueueCompressionAndCollectives) {
  // A backward from 10 to 20 s fills buckets of 1, 1 and 2 bytes: ready at 12.5, 15 and 20 s.
  // Compression 3 s each (one after another): 12.5-15.5, 15.5-18.5, 20-23; collectives 1 s
  // each after their compression and the previous bucket's collectives.
  const auto spans = gc::bucket_spans(10.0, 20.0, {1.0, 1.0, 2.0}, {3.0, 3.0, 3.0}, {1.0, 1.0, 1.0});
  ASSERT_EQ(spans.size(), 3U);
  EXPECT_DOUBLE_EQ(spans[0].ready, 12.5);
  EXPECT_DOUBLE_EQ(spans[1].ready, 15.0);
  EXPECT_DOUBLE_EQ(spans[1].compress_start, 15.5);  // waits for the first bucket's compression
  EXPECT_DOUBLE_EQ(spans[1].end, 19.5);
  EXPECT_DOUBLE_EQ(spans[2].compress_start, 20.0);
  EXPECT_DOUBLE_EQ(spans[2].start, 23.0);
  EXPECT_DOUBLE_EQ(spans[2].end, 24.0);
  // Without compression a bucket starts when it is ready or when the previous one ends.
  const auto plain = gc::bucket_spans(0.0, 10.0, {1.0, 1.0}, {0.0, 0.0}, {6.0, 1.0});
  EXPECT_DOUBLE_EQ(plain[0].compress_end, plain[0].ready);
  EXPECT_DOUBLE_EQ(plain[1].start, 11.0);
  // No bytes at all: every bucket is ready when the backward ends.
  EXPECT_DOUBLE_EQ(gc::bucket_spans(0.0, 10.0, {0.0}, {0.0}, {2.0})[0].end, 12.0);
}

TEST(CostSync, OverlapLossChargesTheCollectivesBesideTheBackward) {
  // A backward from 0 to 10 s fills two equal buckets: the first's sum runs 5-7 s, beside it;
  // the second's 10-13 s, after it. Only the first costs the rank: loss x 2 s.
  const auto spans = gc::bucket_spans(0.0, 10.0, {1.0, 1.0}, {0.0, 0.0}, {2.0, 3.0});
  EXPECT_DOUBLE_EQ(gc::overlap_loss_seconds(spans, 10.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(gc::overlap_loss_seconds(spans, 10.0, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(gc::overlap_loss_seconds(spans, 10.0, 1.5), 3.0);
  EXPECT_DOUBLE_EQ(gc::overlap_loss_seconds(spans, 6.0, 1.0), 1.0);  // compute ends halfway through the first
  // The closed form: the last bucket's share past the backward (2.5 s of a 5 s sum), and with
  // loss 1 the first bucket's 2.5 s beside it again.
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(5.0, 10.0, {1.0, 1.0}), 2.5);
  EXPECT_DOUBLE_EQ(gc::exposed_sync_seconds(5.0, 10.0, {1.0, 1.0}, 1.0), 5.0);
}

TEST(CostSync, AllGatherClosedForms) {
  gc::Devices d = two_level(8, 4);
  const double c = 1e6;
  // A flat ring over two nodes waits for its inter-node links: 7 steps of c.
  auto ring = gc::ring_all_gather(d, first(8), c);
  EXPECT_NEAR(ring.seconds, 7.0 * (20e-6 + c / 10e9), 1e-12);
  EXPECT_NEAR(ring.intra_node_bytes_per_device + ring.inter_node_bytes_per_device, 7.0 * c, 1e-6);
  EXPECT_NEAR(ring.inter_node_bytes_per_device, 7.0 * c * 2.0 / 8.0, 1e-6);
  // Two levels: one step of c across nodes (n = 2), then 3 steps of 2c inside each node.
  auto two = gc::hierarchical_all_gather(d, first(8), c);
  EXPECT_NEAR(two.seconds, (20e-6 + c / 10e9) + 3.0 * (2e-6 + 2.0 * c / 100e9), 1e-12);
  EXPECT_DOUBLE_EQ(two.inter_node_bytes_per_device, c);
  EXPECT_DOUBLE_EQ(two.intra_node_bytes_per_device, 3.0 * 2.0 * c);
  EXPECT_LT(two.seconds, ring.seconds);
  EXPECT_EQ(gc::ring_all_gather(d, {3}, c).seconds, 0.0);
  EXPECT_THROW(gc::ring_all_gather(d, {0, 9}, c), PlanningError);
}

TEST(CostSync, AllReducePricesEveryBucket) {
  gc::Devices d = two_level(4, 4);
  const std::vector<ParamShape> params = {param("w", {1000, 1000}), param("b", {1000})};
  // Cap 1 MB: b (4 kB) opens the bucket, w joins: one bucket of 4.004 MB.
  auto cost = gc::stage_sync_cost(method(gc::SyncKind::all_reduce), d, first(4), params, 0.0, 1e6);
  ASSERT_EQ(cost.buckets.size(), 1u);
  EXPECT_DOUBLE_EQ(cost.payload_bytes, 4.004e6);
  EXPECT_DOUBLE_EQ(cost.comm_seconds, gc::best_all_reduce(d, first(4), 4.004e6).seconds);
  EXPECT_EQ(cost.compute_seconds, 0.0);
  EXPECT_EQ(cost.sync_step_seconds, cost.seconds());
  // One replica: nothing to synchronise.
  EXPECT_EQ(gc::stage_sync_cost(method(gc::SyncKind::all_reduce), d, {2}, params, 0.0, 1e6).seconds(), 0.0);
}

TEST(CostSync, TopKSendsCeilOfRatioEntriesPerBucket) {
  gc::Devices d = two_level(4, 4);
  auto m = method(gc::SyncKind::top_k);
  m.ratio = 0.01;
  // Two buckets (cap 0 puts each dtype in one): 1000 float32 entries -> k = 10; 1001 float16
  // entries -> k = ceil(10.01) = 11.
  const std::vector<ParamShape> params = {param("h", {1001}, "float16", 2), param("f", {1000})};
  auto cost = gc::stage_sync_cost(m, d, first(4), params, 0.0, 0.0);
  ASSERT_EQ(cost.buckets.size(), 2u);
  // Values and int32 positions, packed (as runtime/topk_hook.cpp sends them).
  EXPECT_DOUBLE_EQ(cost.buckets[0].payload_bytes, 10.0 * (4 + 4));
  EXPECT_DOUBLE_EQ(cost.buckets[1].payload_bytes, 11.0 * (2 + 4));
  EXPECT_DOUBLE_EQ(cost.payload_bytes, 80.0 + 66.0);
  EXPECT_DOUBLE_EQ(cost.collectives, 2.0);  // one packed all-gather per bucket
  // Communication: one ring all-gather of the packed entries.
  const double comm0 = gc::ring_all_gather(d, first(4), 80.0).seconds;
  EXPECT_NEAR(cost.buckets[0].comm_seconds, comm0, 1e-15);
  EXPECT_NEAR(comm0, 3.0 * (2e-6 + 80.0 / 100e9), 1e-15);
  // Compute over 1 GB/s: 12 passes over 4000 B, 10 entries written, 4 x 10 entries scattered.
  const double traffic = 12.0 * 4000.0 + 10.0 * 8.0 + 4.0 * 10.0 * (3.0 * 4.0 + 4.0);
  EXPECT_NEAR(cost.buckets[0].compute_seconds, traffic / 1e9, 1e-15);
  // The same bytes as the payload function, which needs no devices.
  EXPECT_DOUBLE_EQ(gc::sync_payload_bytes(m, params, 0.0, 0.0, 4), cost.payload_bytes);
  EXPECT_EQ(gc::sync_payload_bytes(m, params, 0.0, 0.0, 1), 0.0);
}

TEST(CostSync, PowerSgdCompressesOnlyWhereTorchWould) {
  // torch's rule: (rows + cols) r' min_rate < rows cols, r' = min(rows, cols, rank).
  auto w = gc::power_sgd_matrix({64, 32}, 4, 2.0);  // 96 * 4 * 2 = 768 < 2048
  EXPECT_TRUE(w.compressed);
  EXPECT_EQ(w.p_numel(), 64 * 4);
  EXPECT_EQ(w.q_numel(), 32 * 4);
  EXPECT_FALSE(gc::power_sgd_matrix({64}, 4, 2.0).compressed);    // a bias: 64 x 1
  EXPECT_FALSE(gc::power_sgd_matrix({}, 4, 2.0).compressed);      // a scalar
  EXPECT_FALSE(gc::power_sgd_matrix({8, 8}, 4, 2.0).compressed);  // 128 > 64
  EXPECT_FALSE(gc::power_sgd_matrix({8, 8}, 4, 1.0).compressed);  // 64 < 64 is false: strict
  EXPECT_TRUE(gc::power_sgd_matrix({8, 8}, 3, 1.0).compressed);   // 48 < 64
  auto conv = gc::power_sgd_matrix({16, 3, 3, 3}, 2, 2.0);        // 16 x 27, 43 * 2 * 2 = 172 < 432
  EXPECT_TRUE(conv.compressed);
  EXPECT_EQ(conv.cols, 27);
  EXPECT_EQ(conv.q_numel(), 54);
  auto thin = gc::power_sgd_matrix({3, 100}, 4, 2.0);  // r' = 3: 618 > 300
  EXPECT_EQ(thin.rank, 3);
  EXPECT_FALSE(thin.compressed);
}

TEST(CostSync, PowerSgdBytesAndSecondsOfABucket) {
  gc::Devices d = two_level(4, 4);
  auto m = method(gc::SyncKind::power_sgd);
  m.rank = 4;
  const std::vector<ParamShape> params = {param("w", {64, 32}), param("b", {64})};
  auto cost = gc::stage_sync_cost(m, d, first(4), params, 0.0, 1e6);
  ASSERT_EQ(cost.buckets.size(), 1u);
  // Uncompressed: the bias (64); P: 64 x 4; Q: 32 x 4; float32.
  EXPECT_DOUBLE_EQ(cost.payload_bytes, (64.0 + 256.0 + 128.0) * 4.0);
  EXPECT_DOUBLE_EQ(cost.collectives, 3.0);
  const double comm = gc::best_all_reduce(d, first(4), 256.0).seconds +
                      gc::best_all_reduce(d, first(4), 1024.0).seconds +
                      gc::best_all_reduce(d, first(4), 512.0).seconds;
  EXPECT_NEAR(cost.comm_seconds, comm, 1e-15);
  // Compute at 1 GFLOP/s and 1 GB/s: three products of 2 * 64 * 32 * 4 flops (compute bound),
  // orthogonalising Q (32 * 4 * 9 flops) and P (64 * 4 * 9), error feedback's 8 passes over the
  // bucket's 8448 bytes and the 4 x 256 bytes of packing the bias.
  const double matrix = 3.0 * 16384e-9 + 1152e-9 + 2304e-9;
  EXPECT_NEAR(gc::power_sgd_matrix_seconds(gc::power_sgd_matrix({64, 32}, 4, 2.0), 4, d), matrix, 1e-15);
  EXPECT_NEAR(cost.compute_seconds, matrix + (8.0 * 8448.0 + 1024.0) / 1e9, 1e-15);
  // Far below the all-reduce of the gradients on a large matrix.
  const std::vector<ParamShape> big = {param("w", {4096, 4096})};
  auto plain = gc::stage_sync_cost(method(gc::SyncKind::all_reduce), d, first(4), big, 0.0, 0.0);
  auto compressed = gc::stage_sync_cost(m, d, first(4), big, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(compressed.payload_bytes, 2.0 * 4096.0 * 4.0 * 4.0);
  EXPECT_LT(compressed.comm_seconds * 10.0, plain.comm_seconds);
}

TEST(CostSync, PowerSgdNeedsShapes) {
  gc::Devices d = two_level(4, 4);
  const std::string message =
      error_of([&] { gc::stage_sync_cost(method(gc::SyncKind::power_sgd), d, first(4), {}, 4e6, 1e6); });
  EXPECT_NE(message.find("shapes"), std::string::npos) << message;
  // The other methods fall back to equal flat buckets of the parameter bytes.
  auto flat = gc::stage_sync_cost(method(gc::SyncKind::all_reduce), d, first(4), {}, 4e6, 1e6);
  EXPECT_EQ(flat.buckets.size(), 4u);
  EXPECT_DOUBLE_EQ(flat.payload_bytes, 4e6);
}

TEST(CostSync, LocalSgdAmortisesOneAveragingOverThePeriod) {
  gc::Devices d = two_level(4, 4);
  d.op_overhead_seconds = 1e-6;
  const std::vector<ParamShape> params = {param("w", {1000, 1000}), param("b", {1000}),
                                          param("f", {5}, "float32", 4, false)};
  const double trained = 4.004e6;  // the frozen parameter is not averaged
  auto m = method(gc::SyncKind::local_sgd);
  m.period = 4.0;
  // Buckets do not matter: the averaging flattens every parameter into one buffer.
  auto cost = gc::stage_sync_cost(m, d, first(4), params, 0.0, 1e5);
  ASSERT_EQ(cost.buckets.size(), 1u);
  const double averaging = gc::best_all_reduce(d, first(4), trained).seconds + 6.0 * trained / 1e9 + (2.0 + 2.0) * 1e-6;
  EXPECT_NEAR(cost.sync_step_seconds, averaging, 1e-12);
  EXPECT_NEAR(cost.seconds(), averaging / 4.0, 1e-12);
  EXPECT_DOUBLE_EQ(cost.sync_step_payload_bytes, trained);
  EXPECT_DOUBLE_EQ(cost.payload_bytes, trained / 4.0);
  EXPECT_DOUBLE_EQ(gc::sync_payload_bytes(m, params, 0.0, 1e5, 4, true), trained);
  // Period 1: the parameters' all-reduce every step, the gradients' bytes.
  m.period = 1.0;
  auto every = gc::stage_sync_cost(m, d, first(4), params, 0.0, 1e5);
  EXPECT_NEAR(every.seconds(), averaging, 1e-12);
  EXPECT_DOUBLE_EQ(every.payload_bytes,
                   gc::stage_sync_cost(method(gc::SyncKind::all_reduce), d, first(4), params, 0.0, 1e5).payload_bytes);
}

TEST(CostSync, HierarchicalForcesTheTwoLevelAlgorithms) {
  // 8 devices on 2 nodes of 4: the all-reduce's and the all-gather's two-level byte counts.
  gc::Devices d = two_level(8, 4);
  auto m = method(gc::SyncKind::all_reduce);
  m.hierarchical = true;
  const double B = 4e6;
  auto cost = gc::stage_sync_cost(m, d, first(8), {param("w", {1000, 1000})}, 0.0, 0.0);
  EXPECT_DOUBLE_EQ(cost.comm_seconds, gc::hierarchical_all_reduce(d, first(8), B).seconds);
  EXPECT_DOUBLE_EQ(cost.intra_node_bytes_per_device, 2.0 * 3.0 * B / 4.0);
  EXPECT_DOUBLE_EQ(cost.inter_node_bytes_per_device, 2.0 * 1.0 * B / 8.0);
  auto k = method(gc::SyncKind::top_k);
  k.ratio = 0.5;
  k.hierarchical = true;
  auto topk = gc::stage_sync_cost(k, d, first(8), {param("w", {1000})}, 0.0, 0.0);
  // 500 entries: 2000 B of values and 2000 B of int32 positions, gathered across then within nodes.
  EXPECT_DOUBLE_EQ(topk.inter_node_bytes_per_device, 2000.0 + 2000.0);
  EXPECT_DOUBLE_EQ(topk.intra_node_bytes_per_device, 3.0 * 2.0 * (2000.0 + 2000.0));
}

TEST(CostSync, HierarchicalPayloadIsWhatTheRuntimeHandsOver) {
  // runtime/hierarchical_hook.h: all-to-all of L chunks of c = ceil(n / L), all-reduce of one
  // chunk across nodes, all-gather of it inside the node; steps on one-rank groups skipped.
  EXPECT_DOUBLE_EQ(gc::hierarchical_all_reduce_payload(1001, 4, 2, 2), (2 * 501 + 501 + 501) * 4.0);
  EXPECT_DOUBLE_EQ(gc::hierarchical_all_reduce_payload(10, 4, 4, 1), (4 * 3 + 3) * 4.0);
  EXPECT_DOUBLE_EQ(gc::hierarchical_all_reduce_payload(10, 2, 1, 4), 10 * 2.0);
  auto m = method(gc::SyncKind::all_reduce);
  m.hierarchical = true;
  EXPECT_DOUBLE_EQ(gc::sync_payload_bytes(m, {param("w", {1001})}, 0.0, 0.0, 4, false, 2), 8016.0);
  m.hierarchical = false;
  EXPECT_DOUBLE_EQ(gc::sync_payload_bytes(m, {param("w", {1001})}, 0.0, 0.0, 4, false, 2), 4004.0);
}
