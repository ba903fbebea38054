// cost/all_reduce.h: the ring and hierarchical all-reduce against their closed forms, the choice
// between them, and the node grouping the presets and JSON carry.
#include <gtest/gtest.h>

#include <vector>

#include "common/error.h"
#include "cost/all_reduce.h"
#include "cost/devices_json.h"
#include "cost/presets.h"

namespace gc = graphpipe::cost;

namespace {

// `count` devices, `per_node` to a node, with round link figures.
gc::Devices two_level(int count, int per_node, double intra_bw = 100e9, double inter_bw = 10e9) {
  gc::Devices d = gc::v100(count, per_node);
  gc::set_node_links(d, per_node, intra_bw, 2e-6, inter_bw, 20e-6);
  return d;
}

std::vector<int> first(int n) {
  std::vector<int> g(n);
  for (int i = 0; i < n; ++i) g[i] = i;
  return g;
}

}  // namespace

TEST(CostAllReduce, OneDeviceOrNoBytesCostNothing) {
  gc::Devices d = two_level(8, 4);
  EXPECT_EQ(gc::best_all_reduce(d, {3}, 1e9).seconds, 0.0);
  EXPECT_EQ(gc::ring_all_reduce(d, first(8), 0.0).seconds, 0.0);
  EXPECT_EQ(gc::hierarchical_all_reduce(d, {5}, 1e9).seconds, 0.0);
}

TEST(CostAllReduce, RingInsideOneNodeIsTheClosedForm) {
  gc::Devices d = two_level(8, 4);
  const double bytes = 400e6;
  // 2 (d - 1) steps of bytes / d over intra-node links.
  const double expected = 2.0 * 3.0 * (2e-6 + (bytes / 4.0) / 100e9);
  gc::AllReduceCost ring = gc::ring_all_reduce(d, first(4), bytes);
  EXPECT_NEAR(ring.seconds, expected, 1e-12);
  EXPECT_NEAR(ring.intra_node_bytes_per_device, 2.0 * 3.0 * bytes / 4.0, 1e-3);
  EXPECT_EQ(ring.inter_node_bytes_per_device, 0.0);
  // On one node the hierarchical algorithm is the same ring.
  EXPECT_NEAR(gc::hierarchical_all_reduce(d, first(4), bytes).seconds, expected, 1e-12);
}

TEST(CostAllReduce, RingAcrossNodesWaitsForItsSlowestLink) {
  gc::Devices d = two_level(8, 4);
  const double bytes = 400e6;
  const double expected = 2.0 * 7.0 * (20e-6 + (bytes / 8.0) / 10e9);
  EXPECT_NEAR(gc::ring_all_reduce(d, first(8), bytes).seconds, expected, 1e-12);
  // The ring crosses the node boundary twice (0..3 -> 4..7 -> back): 2 of 8 devices send
  // across nodes, whatever order the group was given in.
  gc::AllReduceCost shuffled = gc::ring_all_reduce(d, {5, 0, 7, 2, 4, 1, 6, 3}, bytes);
  EXPECT_NEAR(shuffled.inter_node_bytes_per_device, 2.0 * 7.0 * (bytes / 8.0) * 2.0 / 8.0, 1e-3);
}

TEST(CostAllReduce, HierarchicalIsTheThreePhaseClosedForm) {
  gc::Devices d = two_level(8, 4);
  const double bytes = 400e6;
  const double L = 4.0, n = 2.0;
  const double intra = (L - 1.0) * (2e-6 + (bytes / L) / 100e9);
  const double inter = 2.0 * (n - 1.0) * (20e-6 + (bytes / (L * n)) / 10e9);
  gc::AllReduceCost h = gc::hierarchical_all_reduce(d, first(8), bytes);
  EXPECT_NEAR(h.seconds, 2.0 * intra + inter, 1e-12);
  EXPECT_NEAR(h.inter_node_bytes_per_device, 2.0 * (n - 1.0) * bytes / (L * n), 1e-3);
  EXPECT_NEAR(h.intra_node_bytes_per_device, 2.0 * (L - 1.0) * bytes / L, 1e-3);
  // Slow inter-node links and a large buffer: the hierarchy sends a quarter as much across nodes
  // per device, and wins.
  gc::AllReduceCost best = gc::best_all_reduce(d, first(8), bytes);
  EXPECT_EQ(best.algorithm, gc::AllReduceAlgorithm::hierarchical);
  EXPECT_LT(best.seconds, gc::ring_all_reduce(d, first(8), bytes).seconds);
}

TEST(CostAllReduce, OneDevicePerNodeOrUnequalNodesUseTheRing) {
  gc::Devices d = two_level(8, 4);
  const double bytes = 64e6;
  const std::vector<int> spread = {0, 4};  // one device on each node
  EXPECT_NEAR(gc::hierarchical_all_reduce(d, spread, bytes).seconds, gc::ring_all_reduce(d, spread, bytes).seconds,
              1e-12);
  const std::vector<int> unequal = {0, 1, 2, 4};  // three on node 0, one on node 1
  EXPECT_NEAR(gc::hierarchical_all_reduce(d, unequal, bytes).seconds, gc::ring_all_reduce(d, unequal, bytes).seconds,
              1e-12);
}

TEST(CostAllReduce, UniformLinksDifferOnlyInLatency) {
  // Both algorithms move 2 (d - 1) / d of the buffer per device; on uniform links without
  // latency they take the same time, and the ring is kept on a tie.
  gc::Devices d = two_level(8, 4);
  gc::set_node_links(d, 4, 10e9, 0.0, 10e9, 0.0);
  const double bytes = 400e6;
  EXPECT_NEAR(gc::hierarchical_all_reduce(d, first(8), bytes).seconds, gc::ring_all_reduce(d, first(8), bytes).seconds,
              1e-12);
  EXPECT_EQ(gc::best_all_reduce(d, first(8), bytes).algorithm, gc::AllReduceAlgorithm::ring);
  // With a latency per step, the hierarchy's 2 (L - 1) + 2 (n - 1) = 8 steps beat the ring's 14.
  gc::set_node_links(d, 4, 10e9, 5e-6, 10e9, 5e-6);
  EXPECT_NEAR(gc::ring_all_reduce(d, first(8), bytes).seconds - gc::hierarchical_all_reduce(d, first(8), bytes).seconds,
              (14 - 8) * 5e-6, 1e-12);
}

TEST(CostAllReduce, BadGroupsAreNamed) {
  gc::Devices d = two_level(4, 2);
  EXPECT_THROW(gc::ring_all_reduce(d, {0, 4}, 1.0), graphpipe::PlanningError);
  EXPECT_THROW(gc::best_all_reduce(d, {1, 1}, 1.0), graphpipe::PlanningError);
  EXPECT_THROW(gc::parse_all_reduce_algorithm("tree"), graphpipe::PlanningError);
}

TEST(CostAllReduce, PresetsAndJsonCarryNodes) {
  EXPECT_EQ(gc::v100(8).node, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(gc::preset("h100", 4, 2).node, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(gc::cpu_rank(4, false).node, (std::vector<int>{0, 0, 0, 0}));
  gc::Devices hosts = gc::cpu_rank(4, false, 2);
  EXPECT_EQ(hosts.node, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_DOUBLE_EQ(hosts.link_bandwidth[1][2], 1.25e9);
  gc::Devices back = gc::loads_devices(gc::dumps(hosts));
  EXPECT_EQ(back.node, hosts.node);
  // Without "node" every device is on one node; a wrong count is a FormatError with its path.
  auto doc = gc::to_json(hosts);
  doc.erase("node");
  EXPECT_TRUE(gc::devices_from_json(doc).node.empty());
  doc["node"] = {0, 1};
  try {
    gc::devices_from_json(doc);
    FAIL() << "a node list of the wrong length was accepted";
  } catch (const graphpipe::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.node"), std::string::npos) << e.what();
  }
}
