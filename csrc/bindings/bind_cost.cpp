// Python view of csrc/cost: Devices (presets, JSON), CostModel, the 1F1B in-flight rule.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <sstream>
#include <string>

#include "bindings/bindings.h"
#include "cost/all_reduce.h"
#include "cost/cost_model.h"
#include "cost/cross_replica.h"
#include "cost/devices.h"
#include "cost/devices_json.h"
#include "cost/gradient_buckets.h"
#include "cost/in_flight.h"
#include "cost/presets.h"
#include "graph/precision.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using cost::CostModel;
using cost::Devices;

namespace {

void bind_devices(py::module_& m) {
  py::class_<Devices>(m, "Devices", "Devices a plan runs on (see cost/devices.h and cost/presets.h).")
      .def(py::init<>())
      .def_readwrite("name", &Devices::name)
      .def_readwrite("count", &Devices::count)
      .def_readwrite("memory_bytes", &Devices::memory_bytes)
      .def_readwrite("flops_per_second", &Devices::flops_per_second, "Sustained dense float32 FLOP/s of one device.")
      .def_readwrite("bfloat16_flops_per_second", &Devices::bfloat16_flops_per_second,
                     "Sustained dense bfloat16 FLOP/s (0: the float32 rate applies).")
      .def_readwrite("float16_flops_per_second", &Devices::float16_flops_per_second,
                     "Sustained dense float16 FLOP/s (0: the float32 rate applies).")
      .def(
          "flops_for",
          [](const Devices& d, const std::string& dtype) { return d.flops_for(graph::parse_precision(dtype)); },
          py::arg("dtype"), "The analytic compute rate of a model computing in `dtype` (cost/devices.h).")
      .def_readwrite("memory_bandwidth", &Devices::memory_bandwidth)
      .def_readwrite("op_overhead_seconds", &Devices::op_overhead_seconds)
      .def_readwrite("instruction_overhead_seconds", &Devices::instruction_overhead_seconds)
      .def_readwrite("step_overhead_seconds", &Devices::step_overhead_seconds)
      .def_readwrite("relative_speed", &Devices::relative_speed)
      .def_readwrite("collective_latency_seconds", &Devices::collective_latency_seconds,
                     "Latency of one collective ring step (0: collectives priced from the links).")
      .def_readwrite("collective_bandwidth_bytes_per_second", &Devices::collective_bandwidth_bytes_per_second,
                     "Bandwidth of one collective ring step's link (0: collectives priced from the links).")
      .def_readwrite("extra_tensor_seconds", &Devices::extra_tensor_seconds,
                     "What each tensor of one transfer after the first adds (None: one link latency each).")
      .def_readwrite("collective_overlap_loss", &Devices::collective_overlap_loss,
                     "The compute a rank loses per second of a collective beside it (0: none; measured by "
                     "graphpipe.calibration).")
      // A read-only view: an item assigned into a copied dict would change nothing, silently.
      .def_property(
          "optimizer_tensor_seconds",
          [](const Devices& d) {
            return py::module_::import("types").attr("MappingProxyType")(py::cast(d.optimizer_tensor_seconds));
          },
          [](Devices& d, const std::map<std::string, double>& prices) { d.optimizer_tensor_seconds = prices; },
          "What the optimizer step costs per parameter tensor beyond its memory traffic, per optimizer "
          "({'sgd': ..., 'momentum': ..., 'adam': ...}; an optimizer absent: not measured; measured by "
          "graphpipe.calibration). Read-only: assign a whole dict.")
      .def_readwrite("rank_skew_fraction", &Devices::rank_skew_fraction,
                     "How long a step waits for its slowest rank per second of the busiest rank's compute (0: "
                     "not measured; measured by graphpipe.calibration).")
      .def("rank_skew_seconds", &Devices::rank_skew_seconds, py::arg("compute_seconds"), py::arg("ranks"),
           "What a step over `ranks` ranks waits for its slowest one (cost/devices.h).")
      .def_readwrite("link_bandwidth", &Devices::link_bandwidth)
      .def_readwrite("link_latency", &Devices::link_latency)
      .def_readwrite("node", &Devices::node, "Node of each device (empty: one node).")
      .def("transfer_seconds", &Devices::transfer_seconds, py::arg("src"), py::arg("dst"), py::arg("bytes"))
      .def("slowest_link_bandwidth", &Devices::slowest_link_bandwidth)
      .def("slowest_link_latency", &Devices::slowest_link_latency)
      .def("validate", &Devices::validate)
      .def(
          "set_node_links",
          [](Devices& d, int per_node, double intra_bw, double intra_lat, double inter_bw, double inter_lat) {
            cost::set_node_links(d, per_node, intra_bw, intra_lat, inter_bw, inter_lat);
          },
          py::arg("per_node"), py::arg("intra_bandwidth"), py::arg("intra_latency"), py::arg("inter_bandwidth"),
          py::arg("inter_latency"))
      .def_static("v100", &cost::v100, py::arg("count"), py::arg("per_node") = 4,
                  "V100-class GPUs, documented constants (16 GiB, NVLink 2 / EDR InfiniBand).")
      .def_static("a100", &cost::a100, py::arg("count"), py::arg("per_node") = 8,
                  "A100-class GPUs, documented constants (80 GiB, NVLink 3 / HDR InfiniBand).")
      .def_static("h100", &cost::h100, py::arg("count"), py::arg("per_node") = 8,
                  "H100-class GPUs, documented constants (80 GiB, NVLink 4 / NDR InfiniBand).")
      .def_static("cpu_rank", &cost::cpu_rank, py::arg("count"), py::arg("measure") = true, py::arg("per_node") = 0,
                  "CPU ranks (per_node to a host; 0: one host); measure=False gives the documented constants.")
      .def_static("preset", &cost::preset, py::arg("name"), py::arg("count"), py::arg("per_node") = 0)
      .def(
          "to_json", [](const Devices& d, int indent) { return cost::dumps(d, indent); }, py::arg("indent") = -1)
      .def_static("from_json", &cost::loads_devices, py::arg("text"))
      .def(
          "save", [](const Devices& d, const std::string& path) { cost::save(d, path); }, py::arg("path"))
      .def_static("load", &cost::load_devices, py::arg("path"))
      .def("__repr__", [](const Devices& d) {
        return "<Devices " + d.name + " x" + std::to_string(d.count) + ", " +
               std::to_string(static_cast<long long>(d.memory_bytes / (1024.0 * 1024.0 * 1024.0))) + " GiB each>";
      });
}

void bind_cost_model(py::module_& m) {
  py::class_<CostModel>(m, "CostModel", "Predicted operator times and memory (see cost/cost_model.h).")
      .def(py::init([](const graph::OpGraph& g, const Devices& d, const std::string& optimizer) {
             return CostModel(g, d, cost::parse_optimizer(optimizer));
           }),
           py::arg("graph"), py::arg("devices"), py::arg("optimizer") = "adam", py::keep_alive<1, 2>())
      .def_property_readonly("devices", &CostModel::devices)
      .def_property_readonly("optimizer", [](const CostModel& c) { return cost::to_string(c.optimizer()); })
      .def("forward_seconds", &CostModel::forward_seconds, py::arg("node"), py::arg("micro_batch"))
      .def("backward_seconds", &CostModel::backward_seconds, py::arg("node"), py::arg("micro_batch"))
      .def("backward_input_seconds", &CostModel::backward_input_seconds, py::arg("node"), py::arg("micro_batch"))
      .def("backward_weight_seconds", &CostModel::backward_weight_seconds, py::arg("node"), py::arg("micro_batch"))
      .def("compute_seconds", &CostModel::compute_seconds, py::arg("node"), py::arg("micro_batch"))
      .def("is_profiled", &CostModel::is_profiled, py::arg("node"))
      .def("transfer_seconds", py::overload_cast<double>(&CostModel::transfer_seconds, py::const_), py::arg("bytes"))
      .def("static_bytes", &CostModel::static_bytes, py::arg("node"))
      .def("activation_bytes", &CostModel::activation_bytes, py::arg("node"), py::arg("micro_batch"));
}

// AllReduceCost and the module's functions: all-reduce costs, the names of presets and
// optimizers, the 1F1B in-flight rule.
void bind_cost_functions(py::module_& m) {
  py::class_<cost::AllReduceCost>(m, "AllReduceCost", "What an all-reduce costs (see cost/all_reduce.h).")
      .def_property_readonly("algorithm", [](const cost::AllReduceCost& c) { return cost::to_string(c.algorithm); })
      .def_readonly("seconds", &cost::AllReduceCost::seconds)
      .def_readonly("intra_node_bytes_per_device", &cost::AllReduceCost::intra_node_bytes_per_device)
      .def_readonly("inter_node_bytes_per_device", &cost::AllReduceCost::inter_node_bytes_per_device)
      .def("__repr__", [](const cost::AllReduceCost& c) {
        return "<AllReduceCost " + cost::to_string(c.algorithm) + " " + std::to_string(c.seconds * 1e3) + " ms>";
      });
  m.def("gradient_bucket_sizes", &cost::bucket_sizes, py::arg("bytes"), py::arg("cap") = cost::kDefaultBucketBytes,
        "The sizes of the gradient buckets that hold `bytes`, in start order: a first bucket of up to 1 MiB, "
        "then equal buckets of at most `cap` (cost/gradient_buckets.h), as the runtime lays them out.");
  // The bucket timing rule (cost/gradient_buckets.h), for the calibration that times the compute
  // lost to buckets posted as the runtime posts them and divides by what this rule charges.
  py::class_<cost::BucketSpan>(m, "BucketSpan", "When one gradient bucket is ready and when its collectives run.")
      .def_readonly("ready", &cost::BucketSpan::ready)
      .def_readonly("compress_start", &cost::BucketSpan::compress_start)
      .def_readonly("compress_end", &cost::BucketSpan::compress_end)
      .def_readonly("start", &cost::BucketSpan::start)
      .def_readonly("end", &cost::BucketSpan::end);
  m.def("bucket_spans", &cost::bucket_spans, py::arg("backward_start"), py::arg("backward_end"), py::arg("bytes"),
        py::arg("compress_seconds"), py::arg("comm_seconds"),
        "When each bucket of `bytes` is ready over a backward from `backward_start` to `backward_end`, and when "
        "its compression and collectives run (cost::bucket_spans: the simulator's rule).");
  m.def("overlap_loss_seconds", &cost::overlap_loss_seconds, py::arg("spans"), py::arg("compute_end"), py::arg("loss"),
        "`loss` times the seconds of the spans' collectives before `compute_end` (cost::overlap_loss_seconds).");
  m.def(
      "all_reduce_cost",
      [](const Devices& d, const std::vector<int>& group, double bytes, const std::string& algorithm) {
        if (algorithm == "best") return cost::best_all_reduce(d, group, bytes);
        return cost::parse_all_reduce_algorithm(algorithm) == cost::AllReduceAlgorithm::ring
                   ? cost::ring_all_reduce(d, group, bytes)
                   : cost::hierarchical_all_reduce(d, group, bytes);
      },
      py::arg("devices"), py::arg("group"), py::arg("bytes"), py::arg("algorithm") = "best",
      "Cost of summing `bytes` over the devices in `group`: 'ring', 'hierarchical' or the 'best' of both.");
  py::class_<cost::CrossReplica>(m, "CrossReplica",
                                 "Fault-tolerant replicas of the whole pipeline, as the planner and the simulator "
                                 "price them (see cost/cross_replica.h; graphpipe.fault_tolerant runs them).")
      .def(py::init([](int replicas, double link_bandwidth, double link_latency, double coordination_seconds) {
             cost::CrossReplica c{replicas, link_bandwidth, link_latency, coordination_seconds};
             c.validate();
             return c;
           }),
           py::arg("replicas") = 1, py::arg("link_bandwidth") = 0.0, py::arg("link_latency") = 0.0,
           py::arg("coordination_seconds") = 0.0)
      .def_readonly("replicas", &cost::CrossReplica::replicas)
      .def_readonly("link_bandwidth", &cost::CrossReplica::link_bandwidth)
      .def_readonly("link_latency", &cost::CrossReplica::link_latency)
      .def_readonly("coordination_seconds", &cost::CrossReplica::coordination_seconds)
      .def("seconds", &cost::cross_replica_seconds, py::arg("devices"), py::arg("gradient_bytes"),
           "One rank's average across the replicas per step: its gradients' and the loss's all-reduces.")
      .def("__repr__", [](const cost::CrossReplica& c) {
        std::ostringstream out;  // shortest form: a 1e-07 s latency stays 1e-07
        out << "CrossReplica(replicas=" << c.replicas << ", link_bandwidth=" << c.link_bandwidth
            << ", link_latency=" << c.link_latency << ", coordination_seconds=" << c.coordination_seconds << ")";
        return out.str();
      });
  m.def("device_presets", &cost::preset_names, "Names of the device presets Devices.preset accepts.");
  m.def("optimizer_names", &cost::optimizer_names, "Names of the optimizers the cost model prices.");
  m.def("precision_names", &graph::precision_names,
        "Names of the compute precisions the cost model prices (OpGraph.compute_dtype).");
  m.def(
      "optimizer_state_factor",
      [](const std::string& name) { return cost::optimizer_state_factor(cost::parse_optimizer(name)); },
      py::arg("optimizer"));
  m.def("in_flight_1f1b", &cost::in_flight_1f1b, py::arg("num_stages"), py::arg("edges"), py::arg("num_micro_batches"),
        "1F1B depth rule: stages on the longest path to a sink, capped.");
}

}  // namespace

void bind_cost(py::module_& m) {
  bind_devices(m);
  bind_cost_model(m);
  bind_cost_functions(m);
}

}  // namespace graphpipe::bindings
