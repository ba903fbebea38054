// Python view of csrc/graph: OpGraph, its nodes and edges, series-parallel decomposition, JSON.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "graph/graph_json.h"
#include "graph/op_graph.h"
#include "graph/precision.h"
#include "graph/series_parallel.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using graph::Edge;
using graph::Node;
using graph::NodeId;
using graph::OpGraph;
using graph::ParamShape;
using graph::ProfileSample;
using graph::SPDecomposition;
using graph::SPNode;
using graph::SPTree;

namespace {

// Measured times and parameter shapes, which nodes carry.
void bind_profile_types(py::module_& m) {
  py::class_<ProfileSample>(m, "ProfileSample", "Measured time of one operator at one batch size.")
      .def(py::init([](std::int64_t batch_size, double forward_seconds, double backward_seconds,
                       double backward_input_seconds, double backward_weight_seconds) {
             return ProfileSample{batch_size, forward_seconds, backward_seconds, backward_input_seconds,
                                  backward_weight_seconds};
           }),
           py::arg("batch_size"), py::arg("forward_seconds"), py::arg("backward_seconds"),
           py::arg("backward_input_seconds") = 0.0, py::arg("backward_weight_seconds") = 0.0)
      .def_readwrite("batch_size", &ProfileSample::batch_size)
      .def_readwrite("forward_seconds", &ProfileSample::forward_seconds)
      .def_readwrite("backward_seconds", &ProfileSample::backward_seconds)
      .def_readwrite("backward_input_seconds", &ProfileSample::backward_input_seconds)
      .def_readwrite("backward_weight_seconds", &ProfileSample::backward_weight_seconds)
      .def("__repr__", [](const ProfileSample& p) {
        return "ProfileSample(batch_size=" + std::to_string(p.batch_size) +
               ", forward_seconds=" + std::to_string(p.forward_seconds) +
               ", backward_seconds=" + std::to_string(p.backward_seconds) +
               ", backward_input_seconds=" + std::to_string(p.backward_input_seconds) +
               ", backward_weight_seconds=" + std::to_string(p.backward_weight_seconds) + ")";
      });

  py::class_<ParamShape>(m, "ParamShape",
                         "One parameter tensor as the sync pricing needs it: name, shape, dtype, element size, "
                         "whether it is trained (graph/op_graph.h).")
      .def(py::init([](std::string name, std::vector<std::int64_t> shape, std::string dtype, int element_size,
                       bool requires_grad) {
             return ParamShape{std::move(name), std::move(shape), std::move(dtype), element_size, requires_grad};
           }),
           py::arg("name"), py::arg("shape"), py::arg("dtype") = "float32", py::arg("element_size") = 4,
           py::arg("requires_grad") = true)
      .def_readwrite("name", &ParamShape::name)
      .def_readwrite("shape", &ParamShape::shape)
      .def_readwrite("dtype", &ParamShape::dtype)
      .def_readwrite("element_size", &ParamShape::element_size)
      .def_readwrite("requires_grad", &ParamShape::requires_grad)
      .def_property_readonly("numel", &ParamShape::numel)
      .def_property_readonly("bytes", &ParamShape::bytes)
      .def("__repr__", [](const ParamShape& p) {
        std::string dims;
        for (std::size_t i = 0; i < p.shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(p.shape[i]);
        return "ParamShape(" + p.name + ", [" + dims + "], " + p.dtype + (p.requires_grad ? "" : ", frozen") + ")";
      });
}

// One operator and one tensor between two.
void bind_node_and_edge(py::module_& m) {
  py::class_<Node>(m, "Node", "One operator of the traced model (quantities per sample).")
      .def(py::init<>())
      .def_readwrite("name", &Node::name)
      .def_readwrite("op", &Node::op)
      .def_readwrite("target", &Node::target)
      .def_readwrite("module", &Node::module)
      .def_readwrite("forward_flops", &Node::forward_flops)
      .def_readwrite("param_bytes", &Node::param_bytes)
      .def_readwrite("params", &Node::params)
      .def_readwrite("shared_params", &Node::shared_params)
      .def_readwrite("param_shapes", &Node::param_shapes, "Shapes of the owned parameters, one per entry of params.")
      .def_readwrite("buffer_bytes", &Node::buffer_bytes)
      .def_readwrite("output_bytes", &Node::output_bytes)
      .def_readwrite("is_input", &Node::is_input)
      .def_readwrite("is_output", &Node::is_output)
      .def_readwrite("profile", &Node::profile)
      .def("__repr__", [](const Node& n) {
        return "Node(" + n.name + ", " + n.op + " " + n.target + (n.module.empty() ? "" : " in " + n.module) + ")";
      });

  py::class_<Edge>(m, "Edge", "A tensor flowing between two operators (bytes per sample).")
      .def_readonly("src", &Edge::src)
      .def_readonly("dst", &Edge::dst)
      .def_readonly("bytes", &Edge::bytes)
      .def("__repr__", [](const Edge& e) {
        return "Edge(" + std::to_string(e.src) + " -> " + std::to_string(e.dst) + ", bytes=" + std::to_string(e.bytes) +
               ")";
      });
}

// The series-parallel decomposition tree.
void bind_series_parallel(py::module_& m) {
  py::class_<SPNode> sp_node(m, "SPNode", "A node of a series-parallel decomposition tree.");
  py::enum_<SPNode::Kind>(sp_node, "Kind")
      .value("leaf", SPNode::Kind::leaf)
      .value("series", SPNode::Kind::series)
      .value("parallel", SPNode::Kind::parallel);
  sp_node.def_readonly("kind", &SPNode::kind)
      .def_readonly("op", &SPNode::op)
      .def_readonly("children", &SPNode::children);

  py::class_<SPTree>(m, "SPTree", "Series-parallel decomposition tree of an OpGraph.")
      .def_readonly("nodes", &SPTree::nodes)
      .def_readonly("root", &SPTree::root)
      .def("leaves", &SPTree::leaves, py::arg("index"))
      .def("widest_parallel", &SPTree::widest_parallel)
      .def("to_string", &SPTree::to_string, py::arg("graph"));

  py::class_<SPDecomposition>(m, "SPDecomposition")
      .def_readonly("is_series_parallel", &SPDecomposition::is_series_parallel)
      .def_readonly("tree", &SPDecomposition::tree)
      .def_readonly("irreducible", &SPDecomposition::irreducible)
      .def_readonly("report", &SPDecomposition::report);
}

// The operator DAG, its queries and its JSON.
void bind_op_graph(py::module_& m) {
  py::class_<OpGraph>(m, "OpGraph", "The operator DAG of a traced model (see graph/op_graph.h).")
      .def(py::init<>())
      .def("add_node", &OpGraph::add_node, py::arg("node"))
      .def("add_edge", &OpGraph::add_edge, py::arg("src"), py::arg("dst"), py::arg("bytes_per_sample"))
      .def_property_readonly("num_nodes", &OpGraph::num_nodes)
      .def_property_readonly("num_edges", &OpGraph::num_edges)
      .def("node", &OpGraph::node, py::arg("id"), py::return_value_policy::copy)
      .def("edge", &OpGraph::edge, py::arg("id"), py::return_value_policy::copy)
      .def_property_readonly("nodes", &OpGraph::nodes)
      .def_property_readonly("edges", &OpGraph::edges)
      .def("find", &OpGraph::find, py::arg("name"))
      .def("successors", &OpGraph::successors, py::arg("id"))
      .def("predecessors", &OpGraph::predecessors, py::arg("id"))
      .def("sources", &OpGraph::sources)
      .def("sinks", &OpGraph::sinks)
      .def("inputs", &OpGraph::inputs)
      .def("outputs", &OpGraph::outputs)
      .def("topological_order", &OpGraph::topological_order)
      .def("find_cycle", &OpGraph::find_cycle)
      .def("validate", &OpGraph::validate)
      .def("reachable_from", &OpGraph::reachable_from, py::arg("id"))
      .def("reaches", &OpGraph::reaches, py::arg("src"), py::arg("dst"))
      .def("total_forward_flops", &OpGraph::total_forward_flops)
      .def("total_param_bytes", &OpGraph::total_param_bytes)
      .def("fingerprint", &OpGraph::fingerprint)
      .def("summary", &OpGraph::summary)
      .def(
          "set_profile",
          [](OpGraph& g, NodeId id, std::vector<ProfileSample> samples) {
            g.mutable_node(id).profile = std::move(samples);
          },
          py::arg("id"), py::arg("samples"), "Replaces the measured profile of one node.")
      .def(
          "set_output", [](OpGraph& g, NodeId id, bool is_output) { g.mutable_node(id).is_output = is_output; },
          py::arg("id"), py::arg("is_output") = true, "Marks (or unmarks) a node as a graph output.")
      .def(
          "series_parallel", [](const OpGraph& g) { return graph::decompose_series_parallel(g); },
          "Series-parallel decomposition (see graph/series_parallel.h).")
      .def_readwrite("model_name", &OpGraph::model_name)
      .def_readwrite("trace_batch_size", &OpGraph::trace_batch_size)
      .def_property(
          "compute_dtype", [](const OpGraph& g) { return graph::to_string(g.compute_precision); },
          [](OpGraph& g, const std::string& name) { g.compute_precision = graph::parse_precision(name); },
          "The precision the model computes in ('float32', 'bfloat16', 'float16', 'float64'): the autocast "
          "dtype the trace ran under, else the parameters' (graph/precision.h). Setting an unknown name raises "
          "GraphError.")
      .def(
          "to_json", [](const OpGraph& g, int indent) { return graph::dumps(g, indent); }, py::arg("indent") = -1)
      .def_static("from_json", &graph::loads, py::arg("text"))
      .def(
          "save", [](const OpGraph& g, const std::string& path) { graph::save(g, path); }, py::arg("path"))
      .def_static("load", &graph::load, py::arg("path"))
      .def("__len__", &OpGraph::num_nodes)
      .def("__str__", &OpGraph::summary)
      .def("__repr__", [](const OpGraph& g) {
        return "<OpGraph" + (g.model_name.empty() ? std::string() : " " + g.model_name) + ": " +
               std::to_string(g.num_nodes()) + " nodes, " + std::to_string(g.num_edges()) + " edges>";
      });
}

}  // namespace

void bind_graph(py::module_& m) {
  bind_profile_types(m);
  bind_node_and_edge(m);
  bind_series_parallel(m);
  bind_op_graph(m);
}

}  // namespace graphpipe::bindings
