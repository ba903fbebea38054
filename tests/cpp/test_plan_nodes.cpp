// A plan names the node of each device (Plan::device_nodes): the JSON form keeps them, a plan
// written before they were recorded still loads (nodes unknown), bad node lists are named, and
// the readable table shows each stage's nodes next to its devices.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "graph_builders.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"

namespace gp = graphpipe;
using gp::plan::Plan;

namespace {

// a -> b -> c -> d: stage 0 {a, b} on ranks 0-2 (node 0), stage 1 {c, d} on ranks 3-5, which
// straddle nodes 0 and 1 (3 devices per node).
struct TwoStages {
  gp::graph::OpGraph g = gp::testing::graph_of({{"a", "b"}, {"b", "c"}, {"c", "d"}});
  Plan plan;
  TwoStages() {
    plan.partitioner = "manual";
    plan.graph_fingerprint = g.fingerprint();
    plan.num_graph_nodes = 4;
    plan.batch_size = 12;
    plan.micro_batch_size = 6;
    plan.num_micro_batches = 2;
    plan.num_devices = 6;
    plan.device_nodes = {0, 0, 0, 1, 1, 1};
    plan.optimizer = "sgd";
    plan.depth = 2;
    plan.stages.resize(2);
    plan.stages[0].id = 0;
    plan.stages[0].nodes = {0, 1};
    plan.stages[0].devices = {0, 1, 2};
    plan.stages[1].id = 1;
    plan.stages[1].nodes = {2, 3};
    plan.stages[1].devices = {3, 4, 5};
    gp::plan::StageEdge se;
    se.src = 0;
    se.dst = 1;
    se.edges = {1};
    se.bytes = 24.0;
    plan.edges.push_back(se);
    gp::plan::validate_plan(plan, g);
  }
};

// The stage rows of the table: the lines after the column header, up to the stage edges.
std::vector<std::string> stage_rows(const std::string& table) {
  std::vector<std::string> rows;
  std::size_t at = table.find("\n  stage ");
  at = table.find('\n', at + 1);
  while (at != std::string::npos && at + 1 < table.size()) {
    const std::size_t end = table.find('\n', at + 1);
    const std::string line = table.substr(at + 1, end - at - 1);
    if (line.rfind("  stage edges", 0) == 0) break;
    rows.push_back(line);
    at = end;
  }
  return rows;
}

}  // namespace

TEST(PlanNodes, StageNodesAreTheDistinctNodesOfItsDevices) {
  TwoStages f;
  EXPECT_EQ(f.plan.stage_nodes(f.plan.stages[0]), (std::vector<int>{0}));
  EXPECT_EQ(f.plan.stage_nodes(f.plan.stages[1]), (std::vector<int>{1}));
  f.plan.stages[1].devices = {2, 3};  // moving a rank across the node boundary
  f.plan.stages[0].devices = {0, 1};
  EXPECT_EQ(f.plan.stage_nodes(f.plan.stages[1]), (std::vector<int>{0, 1}));
  EXPECT_EQ(f.plan.num_device_nodes(), 2);
  f.plan.device_nodes.clear();
  EXPECT_TRUE(f.plan.stage_nodes(f.plan.stages[1]).empty());
  EXPECT_EQ(f.plan.num_device_nodes(), 0);
}

TEST(PlanNodes, JsonRoundTripKeepsTheNodes) {
  TwoStages f;
  const std::string text = gp::plan::dumps(f.plan, f.g);
  EXPECT_EQ(nlohmann::json::parse(text)["device_nodes"], nlohmann::json({0, 0, 0, 1, 1, 1}));
  const Plan back = gp::plan::loads_plan(text, f.g);
  EXPECT_EQ(back.device_nodes, f.plan.device_nodes);
  EXPECT_EQ(gp::plan::dumps(back, f.g), text);
}

TEST(PlanNodes, PlanWithoutNodesStillLoads) {
  TwoStages f;
  nlohmann::json doc = gp::plan::to_json(f.plan, f.g);
  doc.erase("device_nodes");
  const Plan back = gp::plan::loads_plan(doc.dump(), f.g);
  EXPECT_TRUE(back.device_nodes.empty());
  const std::string table = gp::plan::to_string(back, f.g);
  EXPECT_NE(table.find("2 stages on 6 devices, depth"), std::string::npos) << table;
  for (const std::string& row : stage_rows(table)) EXPECT_NE(row.find(" ? "), std::string::npos) << row;
}

TEST(PlanNodes, BadNodeListsAreNamed) {
  TwoStages f;
  nlohmann::json doc = gp::plan::to_json(f.plan, f.g);
  doc["device_nodes"] = {0, 0, 1};
  try {
    gp::plan::loads_plan(doc.dump(), f.g);
    FAIL() << "accepted nodes for 3 of 6 devices";
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("names the nodes of 3 devices but has 6"), std::string::npos) << e.what();
  }
  doc["device_nodes"] = {0, 0, 0, -1, 1, 1};
  try {
    gp::plan::loads_plan(doc.dump(), f.g);
    FAIL() << "accepted a negative node";
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("device 3 is on node -1"), std::string::npos) << e.what();
  }
  doc["device_nodes"] = {0, 0, "x", 1, 1, 1};
  try {
    gp::plan::loads_plan(doc.dump(), f.g);
    FAIL() << "accepted a node that is not a number";
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.device_nodes[2]: expected an integer"), std::string::npos) << e.what();
  }
}

TEST(PlanNodes, TableShowsEachStagesDevicesAndNodes) {
  TwoStages f;
  f.plan.stages[0].devices = {0, 1};
  f.plan.stages[1].devices = {2, 3, 4, 5};  // spans both nodes
  gp::plan::validate_plan(f.plan, f.g);
  for (const std::string& table : {gp::plan::to_string(f.plan, f.g), gp::plan::to_string(f.plan)}) {
    EXPECT_NE(table.find("2 stages on 6 devices on 2 nodes"), std::string::npos) << table;
    EXPECT_NE(table.find(" node "), std::string::npos) << table;
    const std::vector<std::string> rows = stage_rows(table);
    ASSERT_EQ(rows.size(), 2u) << table;
    // stage, devices, nodes: the first three columns.
    EXPECT_EQ(rows[0].substr(0, 18), "  0     0,1  0    ") << table;
    EXPECT_EQ(rows[1].substr(0, 18), "  1     2-5  0,1  ") << table;
  }
}
