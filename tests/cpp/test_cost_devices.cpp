#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "cost/devices_json.h"
#include "cost/presets.h"

using namespace graphpipe;
using namespace graphpipe::cost;

TEST(CostDevices, V100PresetHasNodeLinks) {
  Devices d = v100(8);
  EXPECT_EQ(d.count, 8);
  EXPECT_DOUBLE_EQ(d.link_bandwidth[0][1], 50e9);    // same node of 4
  EXPECT_DOUBLE_EQ(d.link_bandwidth[0][4], 12.5e9);  // across nodes
  EXPECT_DOUBLE_EQ(d.transfer_seconds(0, 0, 1e9), 0.0);
  EXPECT_NEAR(d.transfer_seconds(0, 1, 50e9), 1.0 + 5e-6, 1e-12);
  EXPECT_DOUBLE_EQ(d.slowest_link_bandwidth(), 12.5e9);
  EXPECT_DOUBLE_EQ(d.slowest_link_latency(), 10e-6);
}

TEST(CostDevices, H100PresetEightPerNode) {
  Devices d = h100(16);
  EXPECT_DOUBLE_EQ(d.link_bandwidth[0][7], 450e9);
  EXPECT_DOUBLE_EQ(d.link_bandwidth[7][8], 50e9);
  EXPECT_GT(d.memory_bytes, v100(1).memory_bytes);
}

TEST(CostDevices, CpuRankMeasuredIsValid) {
  Devices measured = cpu_rank(2);
  EXPECT_GT(measured.flops_per_second, 1e8);
  EXPECT_GT(measured.memory_bandwidth, 1e8);
  Devices fixed = cpu_rank(2, false);
  EXPECT_DOUBLE_EQ(fixed.flops_per_second, 20e9);
  EXPECT_NO_THROW(fixed.validate());
}

TEST(CostDevices, PresetByNameAndBadCounts) {
  EXPECT_EQ(preset("h100", 2).name, "h100");
  EXPECT_THROW(preset("tpu", 2), PlanningError);
  try {
    v100(0);
    FAIL();
  } catch (const PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("at least 1"), std::string::npos) << e.what();
  }
}

TEST(CostDevices, ValidateNamesTheField) {
  Devices d = v100(2);
  d.link_bandwidth[0][1] = 0.0;
  try {
    d.validate();
    FAIL();
  } catch (const PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("link_bandwidth[0][1]"), std::string::npos) << e.what();
  }
  d = v100(2);
  d.count = 3;
  EXPECT_THROW(d.validate(), PlanningError);
}

TEST(CostDevices, JsonRoundTrip) {
  Devices d = h100(12);
  Devices back = loads_devices(dumps(d));
  EXPECT_EQ(back.name, d.name);
  EXPECT_EQ(back.count, 12);
  EXPECT_EQ(back.link_bandwidth, d.link_bandwidth);
  EXPECT_EQ(back.link_latency, d.link_latency);
  EXPECT_DOUBLE_EQ(back.op_overhead_seconds, d.op_overhead_seconds);
}

TEST(CostDevices, MeasuredRuntimeCostsRoundTripAndOlderFilesReadAsUnmeasured) {
  Devices d = v100(4, 2);
  d.instruction_overhead_seconds = 171e-6;
  d.step_overhead_seconds = 0.024;
  const Devices back = loads_devices(dumps(d));
  EXPECT_DOUBLE_EQ(back.instruction_overhead_seconds, 171e-6);
  EXPECT_DOUBLE_EQ(back.step_overhead_seconds, 0.024);
  // A file written before the fields existed: unmeasured, 0.
  nlohmann::json doc = nlohmann::json::parse(dumps(d));
  doc.erase("instruction_overhead_seconds");
  doc.erase("step_overhead_seconds");
  const Devices older = devices_from_json(doc);
  EXPECT_EQ(older.instruction_overhead_seconds, 0.0);
  EXPECT_EQ(older.step_overhead_seconds, 0.0);
  doc["step_overhead_seconds"] = -1.0;
  EXPECT_THROW(devices_from_json(doc), FormatError);
}

TEST(CostDevices, OverlapLossRoundTripsIsAbsentUnlessMeasuredAndNeverNegative) {
  Devices d = v100(4, 2);
  EXPECT_FALSE(to_json(d).contains("collective_overlap_loss"));
  EXPECT_EQ(loads_devices(dumps(d)).collective_overlap_loss, 0.0);
  d.collective_overlap_loss = 0.93;
  EXPECT_DOUBLE_EQ(loads_devices(dumps(d)).collective_overlap_loss, 0.93);
  nlohmann::json doc = to_json(d);
  doc["collective_overlap_loss"] = -0.5;
  EXPECT_THROW(devices_from_json(doc), FormatError);
  d.collective_overlap_loss = std::nan("");
  EXPECT_THROW(d.validate(), PlanningError);
}

TEST(CostDevices, OptimizerTensorPricesRoundTripPerOptimizerAreAbsentUnlessMeasuredAndNeverNegative) {
  Devices d = v100(4, 2);
  EXPECT_FALSE(to_json(d).contains("optimizer_tensor_seconds"));
  EXPECT_TRUE(loads_devices(dumps(d)).optimizer_tensor_seconds.empty());
  d.optimizer_tensor_seconds = {{"sgd", 7e-6}, {"adam", 2e-5}};
  EXPECT_EQ(loads_devices(dumps(d)).optimizer_tensor_seconds, d.optimizer_tensor_seconds);
  nlohmann::json doc = to_json(d);
  doc["optimizer_tensor_seconds"] = 3e-6;  // the older form: one figure, measured with SGD
  EXPECT_EQ(devices_from_json(doc).optimizer_tensor_seconds, (std::map<std::string, double>{{"sgd", 3e-6}}));
  doc["optimizer_tensor_seconds"] = -1e-6;
  EXPECT_THROW(devices_from_json(doc), FormatError);
  doc["optimizer_tensor_seconds"] = {{"adam", -1e-6}};
  try {
    devices_from_json(doc);
    FAIL() << "a negative price loaded";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.optimizer_tensor_seconds.adam"), std::string::npos) << e.what();
  }
  doc["optimizer_tensor_seconds"] = "fast";
  EXPECT_THROW(devices_from_json(doc), FormatError);
  const auto refused = [](Devices bad, const std::string& named) {
    try {
      bad.validate();
      FAIL() << "validated: " << named;
    } catch (const PlanningError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
    }
  };
  d.optimizer_tensor_seconds = {{"sgd", std::nan("")}};
  refused(d, "optimizer_tensor_seconds['sgd']");
  d.optimizer_tensor_seconds = {{"lion", 1e-6}};
  refused(d, "unknown optimizer 'lion'");
  // adamw is priced as adam: one optimizer, one price, under the name plans give it.
  d.optimizer_tensor_seconds = {{"adamw", 1e-6}};
  refused(d, "'adamw' is priced as 'adam'");
}

TEST(CostDevices, RankSkewRoundTripsIsAbsentUnlessMeasuredAndWaitsOnlyAmongSeveralRanks) {
  Devices d = v100(4, 2);
  EXPECT_FALSE(to_json(d).contains("rank_skew_fraction"));
  EXPECT_EQ(d.rank_skew_seconds(0.05, 4), 0.0);
  d.rank_skew_fraction = 0.03;
  EXPECT_DOUBLE_EQ(loads_devices(dumps(d)).rank_skew_fraction, 0.03);
  EXPECT_DOUBLE_EQ(d.rank_skew_seconds(0.05, 2), 0.0015);
  EXPECT_EQ(d.rank_skew_seconds(0.05, 1), 0.0);
  nlohmann::json doc = to_json(d);
  doc["rank_skew_fraction"] = -0.01;
  EXPECT_THROW(devices_from_json(doc), FormatError);
  d.rank_skew_fraction = std::numeric_limits<double>::infinity();
  try {
    d.validate();
    FAIL() << "an infinite rank_skew_fraction validated";
  } catch (const PlanningError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_skew_fraction"), std::string::npos) << e.what();
  }
}

TEST(CostDevices, ExtraTensorFigureRoundTripsAndIsAbsentUnlessMeasured) {
  Devices d = v100(4, 2);
  EXPECT_FALSE(loads_devices(dumps(d)).extra_tensor_seconds.has_value());
  EXPECT_FALSE(to_json(d).contains("extra_tensor_seconds"));
  EXPECT_DOUBLE_EQ(d.extra_tensor_cost(0, 3), d.link_latency[0][3]);
  d.extra_tensor_seconds = 9.5e-5;
  const Devices back = loads_devices(dumps(d));
  ASSERT_TRUE(back.extra_tensor_seconds.has_value());
  EXPECT_DOUBLE_EQ(*back.extra_tensor_seconds, 9.5e-5);
  EXPECT_DOUBLE_EQ(back.extra_tensor_cost(0, 3), 9.5e-5);
  nlohmann::json doc = to_json(d);
  doc["extra_tensor_seconds"] = -1e-6;
  try {
    devices_from_json(doc);
    FAIL() << "accepted a negative extra_tensor_seconds";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("extra_tensor_seconds"), std::string::npos) << e.what();
  }
  d.extra_tensor_seconds = std::numeric_limits<double>::infinity();
  EXPECT_THROW(d.validate(), PlanningError);
}

TEST(CostDevices, JsonErrorsNameTheField) {
  auto expect_error = [](nlohmann::json doc, const std::string& needle) {
    try {
      loads_devices(doc.dump());
      FAIL() << "accepted " << doc.dump();
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  nlohmann::json good = to_json(v100(2));
  auto doc = good;
  doc.erase("memory_bytes");
  expect_error(doc, "missing field 'memory_bytes'");
  doc = good;
  doc["count"] = "two";
  expect_error(doc, "$.count");
  doc = good;
  doc["link_latency"][1][0] = -1.0;
  expect_error(doc, "$.link_latency[1][0]");
  doc = good;
  doc["link_bandwidth"] = {{1.0, 2.0}};
  expect_error(doc, "$.link_bandwidth: expected 2 rows");
  doc = good;
  doc["flops_per_second"] = 0;
  expect_error(doc, "$.flops_per_second");
  doc = good;
  doc["format"] = "graphpipe.plan";
  expect_error(doc, "$.format");
  EXPECT_THROW(loads_devices("{not json"), FormatError);
}

TEST(CostDevices, FirstRanksAreTheSmallerClusterOfTheSameMachines) {
  const cost::Devices all = cost::v100(20, 8);
  const cost::Devices first = cost::first_ranks(all, 12);
  EXPECT_NO_THROW(first.validate());
  EXPECT_EQ(first.count, 12);
  const cost::Devices smaller = cost::v100(12, 8);
  for (int a = 0; a < 12; ++a) {
    EXPECT_EQ(first.node_of(a), smaller.node_of(a));
    for (int b = 0; b < 12; ++b) {
      EXPECT_DOUBLE_EQ(first.transfer_seconds(a, b, 1e6), smaller.transfer_seconds(a, b, 1e6));
    }
  }
  EXPECT_DOUBLE_EQ(first.flops_per_second, all.flops_per_second);
  EXPECT_EQ(cost::first_ranks(all, 20).count, 20);
  EXPECT_THROW(cost::first_ranks(all, 0), graphpipe::PlanningError);
  EXPECT_THROW(cost::first_ranks(all, 21), graphpipe::PlanningError);
}
