// Plan JSON round trip, validation against the graph it is applied to (another model, a
// tampered file: each problem named), and the readable table.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/partitioner.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

struct Fixture {
  gp::graph::OpGraph g = tst::random_sp_graph(7, 24);
  graphpipe::plan::Plan plan;
  Fixture() {
    pt::Options o;
    o.batch_size = 16;
    plan = pt::partition(g, gp::cost::v100(4), o);
  }
};

void expect_format_error(const nlohmann::json& doc, const gp::graph::OpGraph& g, const std::string& needle) {
  try {
    graphpipe::plan::loads_plan(doc.dump(), g);
    FAIL() << "accepted a plan that should fail with: " << needle;
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(PartitionPlanIo, JsonRoundTrip) {
  Fixture f;
  std::string text = graphpipe::plan::dumps(f.plan, f.g, 2);
  graphpipe::plan::Plan back = graphpipe::plan::loads_plan(text, f.g);
  EXPECT_EQ(graphpipe::plan::dumps(back, f.g, 2), text);
  EXPECT_EQ(back.stages.size(), f.plan.stages.size());
  EXPECT_EQ(back.depth, f.plan.depth);
  EXPECT_EQ(back.micro_batch_size, f.plan.micro_batch_size);
  auto doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["format"], "graphpipe.plan");
  EXPECT_EQ(doc["schema_version"], graphpipe::plan::kPlanSchemaVersion);
}

// Stages name the top-level modules of their operators; the JSON keeps them, an older plan
// without the field gets them from the graph, and the table printed without the graph shows them.
TEST(PartitionPlanIo, StageModulesRoundTrip) {
  gp::graph::OpGraph g = tst::random_sp_graph(7, 24);
  const auto order = g.topological_order();
  // First half of the operators in tower "a", the rest in tower "b", the sources in the root.
  for (std::size_t i = 0; i < order.size(); ++i) {
    auto& node = g.mutable_node(order[i]);
    if (node.is_input) continue;
    node.module = (i < order.size() / 2 ? "a.layers." : "b.block.") + std::to_string(i % 3);
  }
  pt::Options o;
  o.batch_size = 16;
  const graphpipe::plan::Plan plan = pt::partition(g, gp::cost::v100(4), o);
  ASSERT_GE(plan.stages.size(), 2u);
  std::vector<std::string> all;
  for (const auto& st : plan.stages) {
    std::vector<std::string> expected;
    for (auto v : st.nodes) {
      const std::string& m = g.node(v).module;
      if (m.empty()) continue;
      std::string top = m.substr(0, 1);
      if (std::find(expected.begin(), expected.end(), top) == expected.end()) expected.push_back(top);
    }
    EXPECT_EQ(st.modules, expected) << "stage " << st.id;
    all.insert(all.end(), st.modules.begin(), st.modules.end());
  }
  EXPECT_NE(std::find(all.begin(), all.end(), "a"), all.end());
  EXPECT_NE(std::find(all.begin(), all.end(), "b"), all.end());

  const nlohmann::json doc = graphpipe::plan::to_json(plan, g);
  for (std::size_t s = 0; s < plan.stages.size(); ++s) {
    EXPECT_EQ(doc["stages"][s]["modules"].get<std::vector<std::string>>(), plan.stages[s].modules);
  }
  const graphpipe::plan::Plan back = graphpipe::plan::loads_plan(doc.dump(), g);
  for (std::size_t s = 0; s < plan.stages.size(); ++s) EXPECT_EQ(back.stages[s].modules, plan.stages[s].modules);
  EXPECT_EQ(graphpipe::plan::to_json(back, g), doc);

  // The JSON is what the loaded plan says, not a recomputation from the graph.
  auto renamed = doc;
  renamed["stages"][0]["modules"] = {"renamed_tower"};
  EXPECT_EQ(graphpipe::plan::loads_plan(renamed.dump(), g).stages[0].modules,
            std::vector<std::string>{"renamed_tower"});
  // Written before the field existed: derived from the graph, the same as build_plan's.
  auto old = doc;
  for (auto& st : old["stages"]) st.erase("modules");
  EXPECT_EQ(graphpipe::plan::to_json(graphpipe::plan::loads_plan(old.dump(), g), g), doc);
  auto bad = doc;
  bad["stages"][1]["modules"] = {"a", 3};
  expect_format_error(bad, g, "$.stages[1].modules[1]: expected a string");

  const std::string table = graphpipe::plan::to_string(back);  // without the graph
  EXPECT_NE(table.find("modules"), std::string::npos) << table;
  for (const auto& st : plan.stages) {
    // The stage's row ends with its modules, comma-separated.
    std::string joined;
    for (const auto& m : st.modules) joined += (joined.empty() ? "" : ", ") + m;
    const auto row = table.find("\n  " + std::to_string(st.id) + " ");
    ASSERT_NE(row, std::string::npos) << table;
    const auto end = table.find('\n', row + 1);
    EXPECT_EQ(table.substr(end - joined.size(), joined.size()), joined) << table;
  }
}

TEST(PartitionPlanIo, SaveAndLoadFile) {
  Fixture f;
  std::string path = ::testing::TempDir() + "/plan_io_test.json";
  graphpipe::plan::save(f.plan, f.g, path);
  EXPECT_EQ(graphpipe::plan::dumps(graphpipe::plan::load_plan(path, f.g), f.g), graphpipe::plan::dumps(f.plan, f.g));
  EXPECT_THROW(graphpipe::plan::load_plan(path + ".missing", f.g), gp::FormatError);
}

TEST(PartitionPlanIo, RejectsPlanForAnotherGraph) {
  Fixture f;
  auto other = tst::random_sp_graph(8, 24);
  try {
    graphpipe::plan::loads_plan(graphpipe::plan::dumps(f.plan, f.g), other);
    FAIL();
  } catch (const gp::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("made for another graph"), std::string::npos) << e.what();
  }
}

TEST(PartitionPlanIo, RejectsTamperedFiles) {
  Fixture f;
  ASSERT_GE(f.plan.stages.size(), 2u);
  const nlohmann::json good = graphpipe::plan::to_json(f.plan, f.g);
  auto doc = good;
  doc["num_graph_nodes"] = 3;
  expect_format_error(doc, f.g, "$.num_graph_nodes");
  doc = good;
  doc["stages"][0]["nodes"].erase(doc["stages"][0]["nodes"].size() - 1);
  expect_format_error(doc, f.g, "is in no stage");
  doc = good;
  doc["stages"][1]["nodes"].push_back(doc["stages"][0]["nodes"][0]);
  expect_format_error(doc, f.g, "is in both stage 0 and stage 1");
  doc = good;
  doc["stages"][0]["nodes"][0] = "no_such_operator";
  expect_format_error(doc, f.g, "no operator named 'no_such_operator'");
  doc = good;
  std::swap(doc["stages"][0], doc["stages"][1]);
  expect_format_error(doc, f.g, "stage ids must be 0..S-1");
  doc = good;
  // Move the last operator of stage 0 (one that feeds later stages) to the last stage.
  auto last = doc["stages"].size() - 1;
  doc["stages"][last]["nodes"].insert(doc["stages"][last]["nodes"].begin(), doc["stages"][0]["nodes"][0]);
  doc["stages"][0]["nodes"].erase(0);
  expect_format_error(doc, f.g, "back to");
  doc = good;
  // Devices shared by stages: only where each runs on it alone (rank_sharing.h). One micro-batch
  // of all 16 rows, so that two replicas have rows each.
  doc["micro_batch_size"] = 16;
  doc["num_micro_batches"] = 1;
  doc["stages"][1]["devices"] = {0, 0};
  expect_format_error(doc, f.g, "stage 1 lists rank 0 twice");
  doc["stages"][1]["devices"] = {0, 2};  // stage 0 is on device 0 alone; stage 1 replicated onto it
  expect_format_error(doc, f.g, "one of them is replicated");
  doc = good;
  doc["micro_batch_size"] = 3;
  expect_format_error(doc, f.g, "micro-batches do not make up the mini-batch");
  doc = good;
  doc["depth"] = 99;
  expect_format_error(doc, f.g, "says depth 99");
  doc = good;
  doc["edges"].erase(0);
  expect_format_error(doc, f.g, "stage edges");
  doc = good;
  doc["edges"][0]["tensors"] = doc["edges"][0]["tensors"].get<int>() + 1;
  expect_format_error(doc, f.g, "tensors");
  doc = good;
  for (auto& edge : doc["edges"]) edge.erase("tensors");  // written before the field: derived
  EXPECT_EQ(graphpipe::plan::to_json(graphpipe::plan::loads_plan(doc.dump(), f.g), f.g), good);
  doc = good;
  doc["edges"][0]["tensors"] = 0;
  expect_format_error(doc, f.g, "$.edges[0].tensors: must be at least 1");
  doc = good;
  doc["schema_version"] = 2;
  expect_format_error(doc, f.g, "$.schema_version");
  doc = good;
  doc["stages"][0].erase("memory_bytes");
  expect_format_error(doc, f.g, "$.stages[0]: missing field 'memory_bytes'");
}

TEST(PartitionPlanIo, ReadableTable) {
  Fixture f;
  std::string text = graphpipe::plan::to_string(f.plan, f.g);
  EXPECT_NE(text.find("Plan (" + f.plan.partitioner + ")"), std::string::npos) << text;
  EXPECT_NE(text.find("depth " + std::to_string(f.plan.depth)), std::string::npos) << text;
  EXPECT_NE(text.find("stage edges:"), std::string::npos) << text;
  EXPECT_NE(text.find(f.g.node(f.plan.stages[0].nodes.front()).name), std::string::npos) << text;
  // one row per stage
  std::size_t rows = 0;
  for (std::size_t at = text.find("\n  0 "); at != std::string::npos; at = text.find("\n", at + 1)) ++rows;
  EXPECT_GE(rows, f.plan.stages.size());
}
