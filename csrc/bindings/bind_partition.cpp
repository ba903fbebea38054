// Python view of csrc/partition: Plan (readable, JSON, validation) and partition().
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>

#include "bindings/bindings.h"
#include "partition/partitioner.h"
#include "plan/plan.h"
#include "plan/plan_format.h"
#include "plan/plan_io.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using plan::Plan;
using plan::Stage;
using plan::StageEdge;

void bind_partition(py::module_& m) {
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
        return "<Stage " + std::to_string(s.id) + ": " + std::to_string(s.nodes.size()) + " operators>";
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

  py::class_<Plan>(m, "Plan", "Stages of an OpGraph forming a DAG (see plan/plan.h).")
      .def(py::init<>())
      .def_readwrite("partitioner", &Plan::partitioner)
      .def_readwrite("graph_fingerprint", &Plan::graph_fingerprint)
      .def_readwrite("num_graph_nodes", &Plan::num_graph_nodes)
      .def_readwrite("batch_size", &Plan::batch_size)
      .def_readwrite("micro_batch_size", &Plan::micro_batch_size)
      .def_readwrite("num_micro_batches", &Plan::num_micro_batches)
      .def_readwrite("num_devices", &Plan::num_devices)
      .def_readwrite("stages", &Plan::stages)
      .def_readwrite("edges", &Plan::edges)
      .def_readwrite("bottleneck_seconds_per_sample", &Plan::bottleneck_seconds_per_sample)
      .def_readwrite("depth", &Plan::depth)
      .def_readwrite("predicted_iteration_seconds", &Plan::predicted_iteration_seconds)
      .def_readwrite("memory_limit_bytes", &Plan::memory_limit_bytes)
      .def_readwrite("optimizer", &Plan::optimizer)
      .def_readwrite("chain", &Plan::chain)
      .def_readwrite("sync", &Plan::sync, "The sync method the plan was priced for (SyncMethod).")
      .def_property_readonly("num_stages", [](const Plan& p) { return p.stages.size(); })
      .def("to_string", [](const Plan& p, const graph::OpGraph& g) { return plan::to_string(p, g); },
           py::arg("graph"), "Readable table with operator names.")
      .def("validate", &plan::validate_plan, py::arg("graph"),
           "Checks the plan against a graph; raises PlanningError naming the problem.")
      .def("to_json", [](const Plan& p, const graph::OpGraph& g, int indent) { return plan::dumps(p, g, indent); },
           py::arg("graph"), py::arg("indent") = -1)
      .def_static("from_json", &plan::loads_plan, py::arg("text"), py::arg("graph"))
      .def("save", [](const Plan& p, const graph::OpGraph& g, const std::string& path) { plan::save(p, g, path); },
           py::arg("graph"), py::arg("path"))
      .def_static("load", &plan::load_plan, py::arg("path"), py::arg("graph"))
      .def("__str__", [](const Plan& p) { return plan::to_string(p); })
      .def("__repr__", [](const Plan& p) {
        return "<Plan " + p.partitioner + ": " + std::to_string(p.stages.size()) + " stages, depth " +
               std::to_string(p.depth) + ", " + std::to_string(p.num_micro_batches) + " x " +
               std::to_string(p.micro_batch_size) + ">";
      });

  m.def(
      "partition",
      [](const graph::OpGraph& g, const cost::Devices& devices, const std::string& partitioner,
         std::int64_t batch_size, std::optional<std::int64_t> micro_batch_size,
         std::optional<std::int64_t> num_micro_batches, std::optional<double> memory_limit,
         const std::string& optimizer, std::optional<partition::ManualMapping> manual, int max_stages,
         double tolerance, int seed, bool refine, bool replicate,
         std::optional<std::map<int, std::vector<int>>> stage_devices, bool zero_bubble, const cost::SyncMethod& sync) {
        partition::Options o;
        o.sync = sync;
        o.zero_bubble = zero_bubble;
        o.partitioner = partitioner;
        o.batch_size = batch_size;
        o.micro_batch_size = micro_batch_size.value_or(0);
        o.num_micro_batches = num_micro_batches.value_or(0);
        o.memory_limit = memory_limit.value_or(0.0);
        o.optimizer = cost::parse_optimizer(optimizer);
        if (manual) o.manual = *manual;
        o.max_stages = max_stages;
        o.tolerance = tolerance;
        o.seed = seed;
        o.refine = refine;
        o.replicate = replicate;
        if (stage_devices) o.stage_devices = *stage_devices;
        py::gil_scoped_release release;
        return partition::partition(g, devices, o);
      },
      py::arg("graph"), py::arg("devices"), py::arg("partitioner") = "graphpipe", py::arg("batch_size") = 0,
      py::arg("micro_batch_size") = py::none(), py::arg("num_micro_batches") = py::none(),
      py::arg("memory_limit") = py::none(), py::arg("optimizer") = "adam", py::arg("manual") = py::none(),
      py::arg("max_stages") = 0, py::arg("tolerance") = 1e-3, py::arg("seed") = 0, py::arg("refine") = true,
      py::arg("replicate") = false, py::arg("stage_devices") = py::none(), py::arg("zero_bubble") = false,
      py::arg("sync") = cost::SyncMethod{},
      "Cuts the graph into stages (see partition/partitioner.h). batch_size 0 takes the graph's "
      "trace_batch_size; manual is a list of (module prefix, stage) pairs; replicate lets stages "
      "run as data-parallel replicas; stage_devices (manual) maps stages to device ids.");
  m.def("partitioner_names", &partition::partitioner_names);
}

}  // namespace graphpipe::bindings
