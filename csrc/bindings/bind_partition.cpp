// Python view of csrc/partition: partition() and the partitioners' names (the Plan it returns
// is bind_plan.cpp's).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>

#include "bindings/bindings.h"
#include "partition/partitioner.h"
#include "plan/plan.h"

namespace py = pybind11;

namespace graphpipe::bindings {

namespace {

// partition() with the Python signature's optional arguments turned into Options.
plan::Plan partition_graph(const graph::OpGraph& g, const cost::Devices& devices, const std::string& partitioner,
                           std::int64_t batch_size, std::optional<std::int64_t> micro_batch_size,
                           std::optional<std::int64_t> num_micro_batches, std::optional<double> memory_limit,
                           const std::string& optimizer, std::optional<partition::ManualMapping> manual, int max_stages,
                           double tolerance, int seed, bool refine, bool replicate,
                           std::optional<std::map<int, std::vector<int>>> stage_devices, bool zero_bubble,
                           const cost::SyncMethod& sync) {
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
}

}  // namespace

void bind_partition(py::module_& m) {
  m.def("partition", &partition_graph, py::arg("graph"), py::arg("devices"), py::arg("partitioner") = "graphpipe",
        py::arg("batch_size") = 0, py::arg("micro_batch_size") = py::none(), py::arg("num_micro_batches") = py::none(),
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
