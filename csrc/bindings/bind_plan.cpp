// Python view of csrc/plan: Stage, StageEdge and Plan (readable, JSON, validation).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings/bindings.h"
#include "graph/precision.h"
#include "plan/plan.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"
#include "plan/rank_memory.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using plan::Plan;
using plan::Stage;
using plan::StageEdge;

namespace {

// A stage and the operator edges between two stages.
void bind_stages(py::module_& m) {
  py::class_<Stage>(m, "Stage", "One stage of a plan: convex operators on a set of devices.")
      .def(py::init<>())
      .def_readwrite("id", &Stage::id)
      .def_readwrite("nodes", &Stage::nodes)
      .def_readwrite("devices", &Stage::devices)
      .def_readwrite("forward_seconds", &Stage::forward_seconds)
      .def_readwrite("backward_seconds", &Stage::backward_seconds)
      .def_readwrite("backward_input_seconds", &Stage::backward_input_seconds)
      .def_readwrite("backward_weight_seconds", &Stage::backward_weight_seconds)
      .def_readwrite("transfer_seconds", &Stage::transfer_seconds)
      .def_readwrite("param_bytes", &Stage::param_bytes)
      .def_readwrite("static_bytes", &Stage::static_bytes)
      .def_readwrite("activation_bytes", &Stage::activation_bytes)
      .def_readwrite("in_flight", &Stage::in_flight)
      .def_readwrite("memory_bytes", &Stage::memory_bytes)
      .def_readwrite("all_reduce_seconds", &Stage::all_reduce_seconds)
      .def_readwrite("recompute", &Stage::recompute)
      .def_readwrite("parameters", &Stage::parameters,
                     "The stage module's parameters in the runtime's order (ParamShape list; empty without shapes).")
      .def_readonly("modules", &Stage::modules,
                    "The top-level modules the stage's operators belong to, in order of first appearance.")
      .def("__repr__", [](const Stage& s) {
        std::string devices;
        for (std::size_t i = 0; i < s.devices.size(); ++i) devices += (i ? "," : "") + std::to_string(s.devices[i]);
        return "<Stage " + std::to_string(s.id) + ": " + std::to_string(s.nodes.size()) + " operators on devices [" +
               devices + "]>";
      });

  py::class_<StageEdge>(m, "StageEdge", "Operator edges from one stage to another.")
      .def(py::init<>())
      .def_readwrite("src", &StageEdge::src)
      .def_readwrite("dst", &StageEdge::dst)
      .def_readwrite("edges", &StageEdge::edges)
      .def_readwrite("bytes", &StageEdge::bytes)
      .def_readwrite("tensors", &StageEdge::tensors)
      .def("__repr__", [](const StageEdge& e) {
        return "<StageEdge " + std::to_string(e.src) + " -> " + std::to_string(e.dst) + ">";
      });
}

}  // namespace

void bind_plan(py::module_& m) {
  bind_stages(m);
  py::class_<Plan>(m, "Plan", "Stages of an OpGraph forming a DAG (see plan/plan.h).")
      .def(py::init<>())
      .def_readwrite("partitioner", &Plan::partitioner)
      .def_property_readonly(
          "fold",
          [](const Plan& p) -> std::optional<std::string> {
            if (!p.fold) return std::nullopt;
            return std::string(plan::fold_key(*p.fold));
          },
          "'v' or 'looping' where the planner folded a plan for more devices onto these (plan/fold.h), else None")
      .def_readwrite("graph_fingerprint", &Plan::graph_fingerprint)
      .def_readwrite("num_graph_nodes", &Plan::num_graph_nodes)
      .def_readwrite("batch_size", &Plan::batch_size)
      .def_readwrite("micro_batch_size", &Plan::micro_batch_size)
      .def_readwrite("num_micro_batches", &Plan::num_micro_batches)
      .def_readwrite("num_devices", &Plan::num_devices)
      .def_readwrite("device_nodes", &Plan::device_nodes,
                     "The node of each device, as the device description had it when the plan was made "
                     "(empty: not recorded).")
      .def("stage_nodes", &Plan::stage_nodes, py::arg("stage"),
           "The distinct nodes of a stage's devices, ascending (empty when device_nodes is).")
      .def_property_readonly("num_device_nodes", &Plan::num_device_nodes,
                             "How many nodes the plan's devices sit on (0: not recorded).")
      .def_readwrite("stages", &Plan::stages)
      .def_readwrite("edges", &Plan::edges)
      .def_readwrite("bottleneck_seconds_per_sample", &Plan::bottleneck_seconds_per_sample)
      .def_readwrite("depth", &Plan::depth)
      .def_readwrite("predicted_iteration_seconds", &Plan::predicted_iteration_seconds)
      .def_readwrite("memory_limit_bytes", &Plan::memory_limit_bytes)
      .def_readwrite("optimizer", &Plan::optimizer)
      .def_readwrite("chain", &Plan::chain)
      .def_readwrite("schedule", &Plan::schedule)
      .def_readwrite("sync", &Plan::sync, "The sync method the plan was priced for (SyncMethod).")
      .def_property(
          "compute_dtype", [](const Plan& p) { return graph::to_string(p.precision); },
          [](Plan& p, const std::string& name) { p.precision = graph::parse_precision(name); },
          "The precision the plan was priced in ('float32', 'bfloat16', ...): its graph's compute precision.")
      .def_readwrite("compute_flops_per_second", &Plan::compute_flops_per_second,
                     "The analytic compute rate the plan was priced at (0: not recorded).")
      .def_property_readonly("num_stages", [](const Plan& p) { return p.stages.size(); })
      .def("rank_memory_bytes", &plan::rank_memory_bytes, py::arg("rank"),
           "The predicted peak of `rank`: the sum of memory_bytes over the stages it runs (plan/rank_memory.h).")
      .def("memory_headroom", &plan::rank_memory_headroom, py::arg("rank"),
           "memory_limit_bytes less rank_memory_bytes(rank), never below 0; inf without a limit: what the "
           "runtime may spend on receive buffers posted ahead (plan/rank_memory.h).")
      .def(
          "to_string", [](const Plan& p, const graph::OpGraph& g) { return plan::to_string(p, g); }, py::arg("graph"),
          "Readable table with operator names.")
      .def("validate", &plan::validate_plan, py::arg("graph"),
           "Checks the plan against a graph; raises PlanningError naming the problem.")
      .def(
          "to_json", [](const Plan& p, const graph::OpGraph& g, int indent) { return plan::dumps(p, g, indent); },
          py::arg("graph"), py::arg("indent") = -1)
      .def_static("from_json", &plan::loads_plan, py::arg("text"), py::arg("graph"),
                  py::arg("drop_input_edges") = false,
                  "Reads and validates a plan's JSON for `graph`. drop_input_edges: a plan saved before model "
                  "inputs stopped making stage edges is brought to that rule instead of refused.")
      .def(
          "save", [](const Plan& p, const graph::OpGraph& g, const std::string& path) { plan::save(p, g, path); },
          py::arg("graph"), py::arg("path"))
      .def_static("load", &plan::load_plan, py::arg("path"), py::arg("graph"))
      .def("__str__", [](const Plan& p) { return plan::to_string(p); })
      .def("__repr__", [](const Plan& p) {
        const int nodes = p.num_device_nodes();
        return "<Plan " + p.partitioner + ": " + std::to_string(p.stages.size()) + " stages on " +
               std::to_string(p.num_devices) + " devices" +
               (nodes ? " (" + std::to_string(nodes) + (nodes == 1 ? " node)" : " nodes)") : std::string()) +
               ", depth " + std::to_string(p.depth) + ", " + std::to_string(p.num_micro_batches) + " x " +
               std::to_string(p.micro_batch_size) + ">";
      });
}

}  // namespace graphpipe::bindings
