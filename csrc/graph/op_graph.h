// OpGraph: the operator DAG of a traced model, the input of every later layer.
//
// A node is one operator of the traced model (a leaf-module call, a function or a method; graph
// inputs are nodes of op "input"). An edge is a tensor (or value) flowing from the node that
// produces it to a node that consumes it; a producer consumed twice by the same node gives one
// edge. Quantities that scale with the batch are stored *per sample* (the traced batch size is
// kept in `trace_batch_size`); parameters are counted once graph-wide: the first node (in trace
// order) that uses a parameter owns its bytes, later users list it in `shared_params`.
//
// Invariants (checked by validate(), which every loader calls):
//   - node names are unique and non-empty; edges join existing, distinct nodes; no duplicate edge;
//   - the graph is acyclic (a cycle is reported with its nodes, in order);
//   - every node marked as output is reachable from a node marked as input (or from a source
//     when no input is marked);
//   - a node's param_shapes are empty or name its params in order and add up to param_bytes.
// Costs: adding nodes and edges is amortised O(1); topological_order and validate are
// O(V log V + E); reaches() is one O(V + E) search per call.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/precision.h"

namespace graphpipe::graph {

using NodeId = std::int32_t;
using EdgeId = std::int32_t;

// One parameter tensor as the sync pricing needs it (cost/sync_cost.h): its shape (PowerSGD
// compresses by shape), its dtype (the runtime's gradient buckets hold one dtype each), its element
// size in bytes, and whether it is trained (the runtime sums only the gradients of trained ones).
struct ParamShape {
  std::string name;                 // qualified name, as in Node::params
  std::vector<std::int64_t> shape;  // empty: a scalar
  std::string dtype = "float32";    // torch's name without "torch." ("float32", "bfloat16", ...)
  int element_size = 4;             // bytes per element
  bool requires_grad = true;
  std::int64_t numel() const;
  std::int64_t bytes() const { return numel() * element_size; }
};

// Measured time of one operator at one batch size (medians over repeats, in seconds).
struct ProfileSample {
  std::int64_t batch_size = 0;
  double forward_seconds = 0.0;
  double backward_seconds = 0.0;
  // The backward split as a zero-bubble schedule's runtime runs it (graphpipe/profile.py):
  // input gradients alone (I), then weight gradients alone (W; 0 without parameters). Both 0:
  // not profiled (profiles from before the split existed); the cost model then splits
  // backward_seconds by its rule (cost/cost_model.h).
  double backward_input_seconds = 0.0;
  double backward_weight_seconds = 0.0;
};

struct Node {
  std::string name;                        // unique within the graph
  std::string op;                          // "input", "call_module", "call_function" or "call_method"
  std::string target;                      // what is called: module class ("Linear"), function ("torch.cat"), method
  std::string module;                      // qualified name of the owning module ("" is the root module)
  double forward_flops = 0.0;              // forward FLOPs per sample
  std::int64_t param_bytes = 0;            // bytes of the parameters this node owns
  std::vector<std::string> params;         // qualified names of the parameters it owns
  std::vector<std::string> shared_params;  // parameters it uses that another node owns
  // The owned parameters' shapes, one per entry of `params` in the same order, or empty (graphs
  // traced before shapes were recorded: the sync pricing then treats param_bytes as one flat
  // float32 tensor). When given, their bytes add up to param_bytes (checked by add_node).
  std::vector<ParamShape> param_shapes;
  std::int64_t buffer_bytes = 0;  // bytes of non-trainable buffers it owns
  double output_bytes = 0.0;      // output activation bytes per sample
  bool is_input = false;
  bool is_output = false;
  std::vector<ProfileSample> profile;  // sorted by batch size, one sample per size
};

struct Edge {
  NodeId src = -1;
  NodeId dst = -1;
  double bytes = 0.0;  // bytes per sample carried from src to dst
};

class OpGraph {
 public:
  // Adds a node; throws GraphError on an empty or duplicate name, or on param_shapes that do not
  // match params and param_bytes (naming the parameter).
  NodeId add_node(Node node);
  // Adds an edge; throws GraphError on an unknown node, a self loop, a duplicate edge or
  // negative bytes.
  EdgeId add_edge(NodeId src, NodeId dst, double bytes_per_sample);

  std::size_t num_nodes() const { return nodes_.size(); }
  std::size_t num_edges() const { return edges_.size(); }
  const Node& node(NodeId id) const;
  Node& mutable_node(NodeId id);
  // edge, out_edges and in_edges are inline: partitioners call them in their inner loops.
  const Edge& edge(EdgeId id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= edges_.size()) [[unlikely]]
      throw_bad_edge(id);
    return edges_[id];
  }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  std::optional<NodeId> find(std::string_view name) const;

  // Whether operator edge `id` moves a tensor between two stages that hold its ends. An edge out
  // of a model input moves nothing: every rank has the batch, and the runtime hands each stage the
  // inputs it reads. So such an edge is no stage edge of a plan (no transfer, no dependency on
  // the stage that holds the input) and costs no time or bytes in the planner. The one rule for
  // plan, planner and simulator.
  bool edge_moves_data(EdgeId id) const { return !nodes_[edge(id).src].is_input; }

  const std::vector<EdgeId>& out_edges(NodeId id) const {
    check_node(id);
    return out_[id];
  }
  const std::vector<EdgeId>& in_edges(NodeId id) const {
    check_node(id);
    return in_[id];
  }
  std::vector<NodeId> successors(NodeId id) const;
  std::vector<NodeId> predecessors(NodeId id) const;

  std::vector<NodeId> sources() const;  // nodes without incoming edges, by id
  std::vector<NodeId> sinks() const;    // nodes without outgoing edges, by id
  std::vector<NodeId> inputs() const;   // nodes marked is_input, by id
  std::vector<NodeId> outputs() const;  // nodes marked is_output, by id

  // Kahn's order, ties broken by smallest id (so the order is deterministic and keeps trace
  // order where the graph allows). Throws GraphError naming a cycle.
  std::vector<NodeId> topological_order() const;
  // One cycle as its nodes in edge order (first node not repeated), if the graph has one.
  std::optional<std::vector<NodeId>> find_cycle() const;
  // Checks every invariant listed at the top of this header; throws GraphError.
  void validate() const;

  // reachable_from(a)[b] is true iff a path a -> ... -> b exists (a reaches itself).
  std::vector<bool> reachable_from(NodeId from) const;
  bool reaches(NodeId from, NodeId to) const;

  double total_forward_flops() const;  // per sample
  std::int64_t total_param_bytes() const;

  // A stable hash of names, ops and edges: a plan records it to detect being applied to
  // another model. Costs and profiles are not part of it.
  std::string fingerprint() const;
  // A few lines: counts, inputs, outputs, totals, widest level, series-parallel or not.
  std::string summary() const;

  std::string model_name;             // free text, e.g. the model class
  std::int64_t trace_batch_size = 1;  // batch size of the example inputs
  // The precision the model computes in (graph/precision.h): the autocast dtype the trace ran
  // under, else the dtype of the model's floating parameters. The recorded output and edge bytes
  // are already those of activations in it; the cost model picks the device's compute rate by it.
  // Not part of the fingerprint: a plan made for another precision is the same cut.
  Precision compute_precision = Precision::float32;

 private:
  void check_node(NodeId id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= nodes_.size()) [[unlikely]]
      throw_bad_node(id);
  }
  [[noreturn]] void throw_bad_node(NodeId id) const;
  [[noreturn]] static void throw_bad_edge(EdgeId id);

  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<std::vector<EdgeId>> out_;
  std::vector<std::vector<EdgeId>> in_;
  std::unordered_map<std::string, NodeId> by_name_;
};

// "name (op target)" for messages.
std::string describe(const OpGraph& graph, NodeId id);

}  // namespace graphpipe::graph
