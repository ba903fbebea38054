// Python view of the sync methods' pricing: SyncMethod (what graphpipe.sync's methods describe
// themselves as), the runtime's gradient bucket layout, and the per-step cost of a stage's sync
// (cost/sync_method.h, cost/gradient_buckets.h, cost/sync_cost.h).
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <sstream>

#include "bindings/bindings.h"
#include "cost/gradient_buckets.h"
#include "cost/sync_cost.h"
#include "cost/sync_kind.h"
#include "cost/sync_method.h"
#include "plan/plan.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using cost::SyncMethod;

namespace {

std::string method_repr(const SyncMethod& s) {
  std::ostringstream out;
  out << "SyncMethod(kind='" << cost::to_string(s.kind) << "'";
  for (const cost::SyncArgument& argument : cost::sync_kind_model(s.kind).arguments(s)) {
    out << ", " << argument.name << "=" << argument.value;
  }
  if (s.hierarchical) out << ", hierarchical=True";
  out << ")";
  return out.str();
}

cost::SyncCost stage_cost(const SyncMethod& method, const plan::Stage& stage, const cost::Devices& devices,
                          std::optional<std::vector<int>> group, double bucket_bytes) {
  return cost::stage_sync_cost(method, devices, group.value_or(stage.devices), stage.parameters, stage.param_bytes,
                               bucket_bytes);
}

}  // namespace

namespace {

// SyncMethod and the kinds it accepts.
void bind_sync_method(py::module_& m) {
  py::class_<SyncMethod>(m, "SyncMethod",
                         "How a replicated stage's replicas synchronise, as the cost model prices it "
                         "(cost/sync_method.h): kind all_reduce, local_sgd (period), top_k (ratio) or "
                         "power_sgd (rank, min_compression_rate); hierarchical forces the two-level algorithms.")
      .def(py::init([](const std::string& kind, double period, double ratio, int rank, double min_compression_rate,
                       bool hierarchical) {
             SyncMethod s;
             s.kind = cost::parse_sync_kind(kind);
             s.period = period;
             s.ratio = ratio;
             s.rank = rank;
             s.min_compression_rate = min_compression_rate;
             s.hierarchical = hierarchical;
             s.validate();
             return s;
           }),
           py::kw_only(), py::arg("kind") = "all_reduce", py::arg("period") = 1.0, py::arg("ratio") = 0.01,
           py::arg("rank") = 1, py::arg("min_compression_rate") = 2.0, py::arg("hierarchical") = false)
      .def_property(
          "kind", [](const SyncMethod& s) { return cost::to_string(s.kind); },
          [](SyncMethod& s, const std::string& kind) { s.kind = cost::parse_sync_kind(kind); })
      .def_readwrite("period", &SyncMethod::period)
      .def_readwrite("ratio", &SyncMethod::ratio)
      .def_readwrite("rank", &SyncMethod::rank)
      .def_readwrite("min_compression_rate", &SyncMethod::min_compression_rate)
      .def_readwrite("hierarchical", &SyncMethod::hierarchical)
      .def("validate", &SyncMethod::validate, "Raises PlanningError naming a bad field.")
      .def("describe", &SyncMethod::describe)
      .def(
          "cost_method", [](const SyncMethod& s) { return s; }, "Itself (what graphpipe.sync's methods return).")
      .def("to_json", [](const SyncMethod& s) { return cost::to_json(s).dump(); })
      .def_static(
          "from_json",
          [](const std::string& text) { return cost::sync_method_from_json(nlohmann::json::parse(text), "$"); },
          py::arg("text"))
      .def(py::self == py::self)
      .def("__repr__", &method_repr)
      .def(py::pickle(
          [](const SyncMethod& s) { return cost::to_json(s).dump(); },
          [](const std::string& text) { return cost::sync_method_from_json(nlohmann::json::parse(text), "$"); }));
  m.def("sync_kinds", &cost::sync_kind_names, "The kinds SyncMethod accepts.");
}

// The runtime's gradient bucket layout.
void bind_gradient_buckets(py::module_& m) {
  py::class_<cost::GradientBucket>(m, "GradientBucket", "One bucket of the runtime's layout (cost/gradient_buckets.h).")
      .def_readonly("dtype", &cost::GradientBucket::dtype)
      .def_readonly("element_size", &cost::GradientBucket::element_size)
      .def_readonly("numel", &cost::GradientBucket::numel)
      .def_readonly("parameters", &cost::GradientBucket::parameters, "Indices into the parameter list.")
      .def_property_readonly("bytes", &cost::GradientBucket::bytes)
      .def("__repr__", [](const cost::GradientBucket& b) {
        return "<GradientBucket " + b.dtype + " x" + std::to_string(b.numel) + ", " +
               std::to_string(b.parameters.size()) + " parameters>";
      });
  m.def("gradient_buckets", &cost::gradient_buckets, py::arg("parameters"),
        py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
        "The runtime's gradient buckets of `parameters` (ParamShape list in the stage module's order).");
}

// What a stage's sync costs per step, per bucket and in all.
void bind_sync_costs(py::module_& m) {
  py::class_<cost::BucketCost>(m, "BucketCost", "One bucket's sync on one replica (cost/sync_cost.h).")
      .def_readonly("payload_bytes", &cost::BucketCost::payload_bytes)
      .def_readonly("collectives", &cost::BucketCost::collectives)
      .def_readonly("compute_seconds", &cost::BucketCost::compute_seconds)
      .def_readonly("comm_seconds", &cost::BucketCost::comm_seconds)
      .def_readonly("intra_node_bytes", &cost::BucketCost::intra_node_bytes)
      .def_readonly("inter_node_bytes", &cost::BucketCost::inter_node_bytes)
      .def_property_readonly("seconds", &cost::BucketCost::seconds);
  py::class_<cost::SyncCost>(m, "SyncCost",
                             "Per step cost of a stage's sync on one replica (cost/sync_cost.h); local SGD "
                             "amortised over its period, sync_step_* on a step that averages.")
      .def_readonly("buckets", &cost::SyncCost::buckets)
      .def_readonly("payload_bytes", &cost::SyncCost::payload_bytes)
      .def_readonly("collectives", &cost::SyncCost::collectives)
      .def_readonly("compute_seconds", &cost::SyncCost::compute_seconds)
      .def_readonly("comm_seconds", &cost::SyncCost::comm_seconds)
      .def_readonly("intra_node_bytes_per_device", &cost::SyncCost::intra_node_bytes_per_device)
      .def_readonly("inter_node_bytes_per_device", &cost::SyncCost::inter_node_bytes_per_device)
      .def_readonly("sync_step_payload_bytes", &cost::SyncCost::sync_step_payload_bytes)
      .def_readonly("sync_step_seconds", &cost::SyncCost::sync_step_seconds)
      .def_property_readonly("seconds", &cost::SyncCost::seconds)
      .def("__repr__", [](const cost::SyncCost& c) {
        return "<SyncCost " + std::to_string(c.seconds() * 1e3) + " ms, " + std::to_string(c.payload_bytes) +
               " bytes per step>";
      });
}

// Pricing a sync from parameter shapes or from a plan stage.
void bind_sync_pricing(py::module_& m) {
  m.def(
      "sync_cost",
      [](const SyncMethod& method, const std::vector<graph::ParamShape>& parameters, const cost::Devices& devices,
         const std::vector<int>& group,
         double bucket_bytes) { return cost::stage_sync_cost(method, devices, group, parameters, 0.0, bucket_bytes); },
      py::arg("method"), py::arg("parameters"), py::arg("devices"), py::arg("group"),
      py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
      "Per step cost of syncing `parameters` (ParamShape list, stage module order) over the ranks `group`.");
  m.def("sync_cost", &stage_cost, py::arg("method"), py::arg("stage"), py::arg("devices"),
        py::arg("group") = py::none(), py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
        "Per step cost of a plan stage's sync (its parameters, or its param_bytes without shapes) over its devices.");
  m.def(
      "sync_payload_bytes",
      [](const SyncMethod& method, const std::vector<graph::ParamShape>& parameters, double bucket_bytes, int replicas,
         bool sync_step, int replicas_per_node) {
        return cost::sync_payload_bytes(method, parameters, 0.0, bucket_bytes, replicas, sync_step, replicas_per_node);
      },
      py::arg("method"), py::arg("parameters"), py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
      py::arg("replicas") = 2, py::arg("sync_step") = false, py::arg("replicas_per_node") = 0,
      "Bytes one replica hands to collectives per step (local SGD: amortised, or on a step that averages); "
      "replicas_per_node (0: one node) shapes a hierarchical all-reduce.");
  m.def(
      "sync_payload_bytes",
      [](const SyncMethod& method, const plan::Stage& stage, double bucket_bytes, std::optional<int> replicas,
         bool sync_step) {
        return cost::sync_payload_bytes(method, stage.parameters, stage.param_bytes, bucket_bytes,
                                        replicas.value_or(static_cast<int>(stage.devices.size())), sync_step);
      },
      py::arg("method"), py::arg("stage"), py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
      py::arg("replicas") = py::none(), py::arg("sync_step") = false,
      "The same for a plan stage (replicas: its device count by default).");
}

}  // namespace

void bind_sync(py::module_& m) {
  bind_sync_method(m);
  bind_gradient_buckets(m);
  bind_sync_costs(m);
  bind_sync_pricing(m);
}

}  // namespace graphpipe::bindings
