#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "graph/graph_json.h"
#include "graph_builders.h"

using graphpipe::FormatError;
using graphpipe::graph::OpGraph;
using graphpipe::testing::graph_of;
namespace gg = graphpipe::graph;

namespace {

OpGraph sample() {
  auto g = graph_of({{"x", "lin"}, {"lin", "relu"}, {"x", "skip"}, {"relu", "add"}, {"skip", "add"}});
  g.model_name = "Sample";
  g.trace_batch_size = 8;
  auto& x = g.mutable_node(*g.find("x"));
  x.is_input = true;
  x.op = "input";
  auto& lin = g.mutable_node(*g.find("lin"));
  lin.op = "call_module";
  lin.target = "Linear";
  lin.module = "block.lin";
  lin.forward_flops = 2048.5;
  lin.param_bytes = 4096;
  lin.params = {"block.lin.weight", "block.lin.bias"};
  lin.output_bytes = 128.0;
  lin.profile = {{1, 1e-5, 2e-5, 1.5e-5, 1.25e-5}, {4, 2e-5, 3e-5}};
  auto& skip = g.mutable_node(*g.find("skip"));
  skip.shared_params = {"block.lin.weight"};
  skip.buffer_bytes = 16;
  g.mutable_node(*g.find("add")).is_output = true;
  return g;
}

std::string expect_rejected(const std::string& text) {
  try {
    gg::loads(text);
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

}  // namespace

TEST(GraphJson, RoundTripKeepsEverything) {
  OpGraph g = sample();
  OpGraph back = gg::loads(gg::dumps(g));
  EXPECT_EQ(gg::dumps(back), gg::dumps(g));
  EXPECT_EQ(back.fingerprint(), g.fingerprint());
  const auto& lin = back.node(*back.find("lin"));
  EXPECT_EQ(lin.params, (std::vector<std::string>{"block.lin.weight", "block.lin.bias"}));
  EXPECT_DOUBLE_EQ(lin.forward_flops, 2048.5);
  ASSERT_EQ(lin.profile.size(), 2u);
  EXPECT_EQ(lin.profile[1].batch_size, 4);
  EXPECT_DOUBLE_EQ(lin.profile[0].backward_input_seconds, 1.5e-5);
  EXPECT_DOUBLE_EQ(lin.profile[0].backward_weight_seconds, 1.25e-5);
  EXPECT_DOUBLE_EQ(lin.profile[1].backward_input_seconds, 0.0);  // not split
  EXPECT_EQ(back.node(*back.find("skip")).shared_params.size(), 1u);
  EXPECT_EQ(back.trace_batch_size, 8);
  EXPECT_TRUE(back.node(*back.find("x")).is_input);
  EXPECT_EQ(back.num_edges(), g.num_edges());
}

TEST(GraphJson, ProfilesWithoutTheSplitBackwardStillLoad) {
  // A graph profiled before I and W were measured: its samples have neither field.
  auto doc = nlohmann::json::parse(gg::dumps(sample()));
  for (auto& node : doc["nodes"]) {
    for (auto& p : node["profile"]) {
      p.erase("backward_input_seconds");
      p.erase("backward_weight_seconds");
    }
  }
  OpGraph back = gg::loads(doc.dump());
  const auto& lin = back.node(*back.find("lin"));
  ASSERT_EQ(lin.profile.size(), 2u);
  EXPECT_DOUBLE_EQ(lin.profile[0].backward_seconds, 2e-5);
  EXPECT_DOUBLE_EQ(lin.profile[0].backward_input_seconds, 0.0);
  EXPECT_DOUBLE_EQ(lin.profile[0].backward_weight_seconds, 0.0);
}

TEST(GraphJson, SaveAndLoadFile) {
  auto path = std::filesystem::temp_directory_path() / "graphpipe_test_graph.json";
  gg::save(sample(), path.string());
  EXPECT_EQ(gg::dumps(gg::load(path.string())), gg::dumps(sample()));
  std::filesystem::remove(path);
  EXPECT_THROW(gg::load("/nonexistent/graph.json"), FormatError);
}

TEST(GraphJson, MalformedFilesAreRejectedWithTheReason) {
  const std::string good = gg::dumps(sample());
  EXPECT_NE(expect_rejected("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(expect_rejected("[]").find("expected an object"), std::string::npos);

  auto doc = nlohmann::json::parse(good);
  auto edit = [&](auto change) {
    auto copy = doc;
    change(copy);
    return expect_rejected(copy.dump());
  };
  EXPECT_NE(edit([](auto& d) { d["format"] = "other"; }).find("$.format"), std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["schema_version"] = 99; }).find("version 99"), std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["nodes"][1].erase("name"); }).find("$.nodes[1]: missing field 'name'"),
            std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["nodes"][1]["param_bytes"] = "big"; }).find("$.nodes[1].param_bytes"),
            std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["nodes"][1]["output_bytes"] = -3; }).find("must not be negative"), std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["edges"][0]["dst"] = 99; }).find("out of range"), std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["nodes"][2]["name"] = "x"; }).find("duplicate node name"), std::string::npos);
  EXPECT_NE(edit([](auto& d) {
              d["edges"].push_back({{"src", 4}, {"dst", 0}, {"bytes", 1}});
            }).find("cycle"),
            std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["nodes"][1]["profile"][1]["batch_size"] = 1; }).find("increasing"), std::string::npos);
  EXPECT_NE(edit([](auto& d) {
              d["nodes"][1]["profile"][0]["backward_weight_seconds"] = -1e-5;
            }).find("$.nodes[1].profile[0].backward_weight_seconds: must not be negative"),
            std::string::npos);
  EXPECT_NE(edit([](auto& d) { d["trace_batch_size"] = 0; }).find("trace_batch_size"), std::string::npos);
}
