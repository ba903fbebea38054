// The compute precision an OpGraph records (graph/precision.h): names, element sizes, its JSON
// field (and graphs written before it existed, which computed in float32).
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "graph/graph_json.h"
#include "graph/precision.h"

namespace gg = graphpipe::graph;

namespace {

gg::OpGraph tiny() {
  gg::OpGraph g;
  gg::Node x;
  x.name = "x";
  x.op = "input";
  x.is_input = true;
  g.add_node(x);
  gg::Node y;
  y.name = "y";
  y.op = "call_function";
  y.is_output = true;
  g.add_node(y);
  g.add_edge(0, 1, 8);
  return g;
}

}  // namespace

TEST(GraphPrecision, NamesAndSizes) {
  for (const std::string& name : gg::precision_names()) EXPECT_EQ(gg::to_string(gg::parse_precision(name)), name);
  EXPECT_EQ(gg::parse_precision("torch.bfloat16"), gg::Precision::bfloat16);
  EXPECT_EQ(gg::element_size(gg::Precision::bfloat16), 2);
  EXPECT_EQ(gg::element_size(gg::Precision::float16), 2);
  EXPECT_EQ(gg::element_size(gg::Precision::float32), 4);
  EXPECT_EQ(gg::element_size(gg::Precision::float64), 8);
  EXPECT_TRUE(gg::is_half(gg::Precision::float16));
  EXPECT_FALSE(gg::is_half(gg::Precision::float32));
  try {
    gg::parse_precision("int8");
    FAIL() << "accepted int8";
  } catch (const graphpipe::GraphError& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16"), std::string::npos) << e.what();  // names the choices
  }
}

TEST(GraphPrecision, JsonRoundTripAndOldFiles) {
  gg::OpGraph g = tiny();
  EXPECT_EQ(g.compute_precision, gg::Precision::float32);  // the default
  g.compute_precision = gg::Precision::bfloat16;
  const std::string text = gg::dumps(g);
  EXPECT_EQ(gg::loads(text).compute_precision, gg::Precision::bfloat16);
  EXPECT_EQ(gg::loads(text).fingerprint(), tiny().fingerprint());  // the same operators
  auto doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc["compute_dtype"], "bfloat16");
  doc.erase("compute_dtype");  // a graph written before the precision was recorded
  EXPECT_EQ(gg::loads(doc.dump()).compute_precision, gg::Precision::float32);
  doc["compute_dtype"] = "float8";
  try {
    gg::loads(doc.dump());
    FAIL() << "loaded an unknown precision";
  } catch (const graphpipe::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("$.compute_dtype"), std::string::npos) << e.what();
  }
}
