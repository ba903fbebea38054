// Parameter shapes on graph nodes (graph/op_graph.h): their consistency with params and
// param_bytes, and their JSON form, which old graph files may lack.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "graph/graph_json.h"
#include "graph_builders.h"

namespace gg = graphpipe::graph;
using graphpipe::FormatError;
using graphpipe::GraphError;
using graphpipe::testing::graph_of;

namespace {

gg::Node linear(const std::string& name) {
  gg::Node n;
  n.name = name;
  n.op = "call_module";
  n.params = {name + ".weight", name + ".bias"};
  n.param_shapes = {{name + ".weight", {8, 4}, "float32", 4, true}, {name + ".bias", {8}, "bfloat16", 2, false}};
  n.param_bytes = 8 * 4 * 4 + 8 * 2;
  return n;
}

std::string graph_error(gg::Node n) {
  gg::OpGraph g;
  try {
    g.add_node(std::move(n));
  } catch (const GraphError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GraphParamShapes, MustMatchParamsAndBytes) {
  EXPECT_EQ(graph_error(linear("fc")), "");
  auto n = linear("fc");
  n.param_bytes += 1;
  EXPECT_NE(graph_error(n).find("param_bytes"), std::string::npos);
  n = linear("fc");
  n.param_shapes.pop_back();
  EXPECT_NE(graph_error(n).find("1 parameter shapes for 2"), std::string::npos);
  n = linear("fc");
  n.param_shapes[1].name = "other";
  EXPECT_NE(graph_error(n).find("'other'"), std::string::npos);
  n = linear("fc");
  n.param_shapes[0].element_size = 0;
  EXPECT_NE(graph_error(n).find("element size"), std::string::npos);
  // Without shapes any param_bytes is accepted (graphs traced before shapes were recorded).
  n = linear("fc");
  n.param_shapes.clear();
  EXPECT_EQ(graph_error(n), "");
  EXPECT_EQ(linear("fc").param_shapes[0].numel(), 32);
  const gg::ParamShape scalar{"s", {}, "float32", 4, true};
  EXPECT_EQ(scalar.numel(), 1);
}

TEST(GraphParamShapes, JsonRoundTripAndOldFiles) {
  gg::OpGraph with;
  with.add_node(linear("fc"));
  gg::Node out;
  out.name = "out";
  out.is_output = true;
  with.add_node(out);
  with.add_edge(0, 1, 4.0);
  const gg::OpGraph back = gg::loads(gg::dumps(with));
  const auto& shapes = back.node(0).param_shapes;
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0].shape, (std::vector<std::int64_t>{8, 4}));
  EXPECT_EQ(shapes[1].dtype, "bfloat16");
  EXPECT_EQ(shapes[1].element_size, 2);
  EXPECT_FALSE(shapes[1].requires_grad);
  // A file without the field (written before it existed) loads without shapes.
  auto doc = gg::to_json(with);
  for (auto& node : doc["nodes"]) node.erase("param_shapes");
  EXPECT_TRUE(gg::from_json(doc).node(0).param_shapes.empty());
  // A file whose shapes disagree with its bytes is refused, naming the node.
  doc = gg::to_json(with);
  doc["nodes"][0]["param_bytes"] = 1;
  try {
    gg::from_json(doc);
    FAIL() << "inconsistent shapes were accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'fc'"), std::string::npos) << e.what();
  }
  doc = gg::to_json(with);
  doc["nodes"][0]["param_shapes"][0]["shape"][0] = -3;
  EXPECT_THROW(gg::from_json(doc), FormatError);
}
