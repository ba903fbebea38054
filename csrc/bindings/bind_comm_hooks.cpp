// graphpipe._C communication hooks for replicated stages' gradients (runtime/comm_hook.h): the
// CommHook objects GradientBuckets runs per bucket, their factories, and the counting process
// group that measures their traffic (runtime/counting_group.h).
//
// torch's own Python hooks (PowerSGD, fp16 compression) run unchanged through torch's
// c10d::PythonCommHook (torch/csrc/distributed/c10d/python_comm_hook.h, in libtorch_python, so
// its adapter lives here with the other Python-facing code). The hooks written in C++ are in
// csrc/runtime/.
#include <torch/csrc/distributed/c10d/python_comm_hook.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "bindings/bindings.h"
#include "common/error.h"
#include "runtime/all_reduce_hook.h"
#include "runtime/comm_hook.h"
#include "runtime/counting_group.h"
#include "runtime/hierarchical_hook.h"
#include "runtime/topk_hook.h"

namespace py = pybind11;

namespace graphpipe::bindings {

namespace {

// A Python hook `hook(state, bucket) -> torch.futures.Future[Tensor]` run by torch's
// PythonCommHook (which takes the GIL itself). On attach it checks that the process group the
// state names (the state itself when it is a group, as for default_hooks' hooks, or its
// `process_group` attribute, as for PowerSGDState) is the stage's counting group: another group
// would leave the traffic unmeasured and could sum over other ranks than the stage's replicas.
class PythonHook final : public runtime::CommHook {
 public:
  PythonHook(py::object state, py::object hook, bool average, bool serial)
      : state_(state), average_(average), serial_(serial) {
    py::object name = py::getattr(hook, "__qualname__", py::getattr(hook, "__name__", py::none()));
    name_ = "python(" + (name.is_none() ? std::string(py::str(py::repr(hook))) : name.cast<std::string>()) + ")";
    torch_hook_ = std::make_unique<c10d::PythonCommHook>(std::move(state), std::move(hook));
  }
  ~PythonHook() override {
    py::gil_scoped_acquire gil;
    state_ = py::object();
    torch_hook_.reset();
  }

  std::string name() const override { return name_; }
  runtime::HookResult convention() const override {
    return average_ ? runtime::HookResult::average : runtime::HookResult::sum;
  }
  bool serial() const override { return serial_; }

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    return torch_hook_->runHook(bucket);
  }
  at::Tensor parseHookResult(const c10::IValue& result) override { return torch_hook_->parseHookResult(result); }

 protected:
  void on_attach(const c10::intrusive_ptr<runtime::CountingGroup>& group, std::chrono::milliseconds) override {
    py::gil_scoped_acquire gil;
    py::object group_type = py::module_::import("torch.distributed").attr("ProcessGroup");
    py::object named = state_;
    std::string where = "the hook's state";
    if (!state_.is_none() && !py::isinstance(state_, group_type) && py::hasattr(state_, "process_group")) {
      named = state_.attr("process_group");
      where = "the hook state's process_group";
    } else if (!state_.is_none() && !py::isinstance(state_, group_type)) {
      return;  // a state of its own kind: its collectives are counted if they use the stage's group
    }
    const std::string advice =
        "make the group with graphpipe._C.counting_group(group), give it to the state (e.g. "
        "PowerSGDState(process_group=counted), or as the state of default_hooks.fp16_compress_hook) and pass the "
        "same group to GradientBuckets";
    if (named.is_none()) {
      throw Error("graphpipe runtime: python_comm_hook " + name_ + ": " + where +
                  " is None, so torch's hook would communicate over the default (world) group, not the stage's "
                  "replicas; " +
                  advice);
    }
    if (!py::isinstance(named, group_type) ||
        named.cast<c10::intrusive_ptr<c10d::ProcessGroup>>().get() != group.get()) {
      throw Error("graphpipe runtime: python_comm_hook " + name_ + ": " + where +
                  " is not the stage's counting group given to GradientBuckets, so its traffic would not be measured "
                  "and its sum could be over other ranks; " +
                  advice);
    }
  }

 private:
  py::object state_;
  std::string name_;
  bool average_;
  bool serial_;
  std::unique_ptr<c10d::PythonCommHook> torch_hook_;
};

std::string convention_name(runtime::HookResult r) { return r == runtime::HookResult::sum ? "sum" : "average"; }

}  // namespace

void bind_comm_hooks(py::module_& m) {
  // torch.distributed registers ProcessGroup's Python type, the base of CountingGroup.
  py::module_::import("torch.distributed");

  py::class_<runtime::CountingGroup, c10d::ProcessGroup, c10::intrusive_ptr<runtime::CountingGroup>>(
      m, "CountingGroup",
      "A process group that forwards to another and counts the payload bytes and collectives this rank hands "
      "to it (runtime/counting_group.h). torch.distributed accepts it as group=.")
      .def_property_readonly("bytes_communicated", &runtime::CountingGroup::bytes_communicated,
                             "Input bytes this rank handed to collectives through the group, cumulative.")
      .def_property_readonly("collectives", &runtime::CountingGroup::collectives,
                             "Collectives (and point-to-point operations) issued through the group, cumulative.")
      .def("reset", &runtime::CountingGroup::reset, "Sets both counters to zero.")
      .def_property_readonly("inner", &runtime::CountingGroup::inner, "The process group it forwards to.");
  m.def(
      "counting_group",
      [](c10::intrusive_ptr<c10d::ProcessGroup> group) {
        return c10::make_intrusive<runtime::CountingGroup>(std::move(group));
      },
      py::arg("group"),
      "A CountingGroup over `group`: give it to a Python hook's state and to GradientBuckets so that the hook's "
      "traffic is measured.");

  py::class_<runtime::CommHook, std::shared_ptr<runtime::CommHook>>(
      m, "CommHook",
      "A communication hook that GradientBuckets runs on each gradient bucket (runtime/comm_hook.h). One hook "
      "serves one GradientBuckets.")
      .def_property_readonly("name", &runtime::CommHook::name)
      .def_property_readonly(
          "convention", [](const runtime::CommHook& h) { return convention_name(h.convention()); },
          "'sum' (the result is the replicas' sum) or 'average' (DDP's convention; the buckets then hand over "
          "share x replicas).")
      .def_property_readonly("serial", &runtime::CommHook::serial,
                             "Whether buckets run one after another (a hook that chains collectives).")
      .def_property_readonly("attached", &runtime::CommHook::attached)
      .def("state_dict", &runtime::CommHook::state_dict, "The hook's state by name (tensors, copies).")
      .def("load_state_dict", &runtime::CommHook::load_state_dict, py::arg("state"),
           "Restores what state_dict() returned.")
      .def("__repr__", [](const runtime::CommHook& h) { return "CommHook(" + h.name() + ")"; });

  py::class_<runtime::TopKHook, runtime::CommHook, std::shared_ptr<runtime::TopKHook>>(
      m, "TopKHook", "Top-k sparsification with error feedback (runtime/topk_hook.h).")
      .def_property_readonly("ratio", &runtime::TopKHook::ratio)
      .def("k_for", &runtime::TopKHook::k_for, py::arg("numel"),
           "Entries each rank sends for a bucket of `numel` elements: ceil(ratio x numel), at least 1.");

  m.def(
      "all_reduce_hook",
      []() -> std::shared_ptr<runtime::CommHook> { return std::make_shared<runtime::AllReduceHook>(); },
      "The default hook: one all-reduce (sum) per bucket, the replicas' exact sum (runtime/all_reduce_hook.h).");
  m.def(
      "topk_hook", [](double ratio) { return std::make_shared<runtime::TopKHook>(ratio); }, py::arg("ratio"),
      "Top-k sparsification with error feedback: each rank sends its ceil(ratio x n) largest entries of "
      "bucket + residual by one all-gather; the result is the sum of what the ranks sent (runtime/topk_hook.h).");
  m.def(
      "hierarchical_all_reduce_hook",
      [](c10::intrusive_ptr<c10d::ProcessGroup> intra,
         c10::intrusive_ptr<c10d::ProcessGroup> inter) -> std::shared_ptr<runtime::CommHook> {
        return std::make_shared<runtime::HierarchicalAllReduceHook>(std::move(intra), std::move(inter));
      },
      py::arg("intra_node_group"), py::arg("inter_node_group"),
      "Reduce-scatter inside the node, all-reduce of each rank's chunk across nodes (the group of the ranks with "
      "this rank's local index), all-gather inside the node (runtime/hierarchical_hook.h).");
  m.def(
      "python_comm_hook",
      [](py::object state, py::object hook, bool average, bool serial) -> std::shared_ptr<runtime::CommHook> {
        if (!PyCallable_Check(hook.ptr())) {
          throw Error("graphpipe runtime: python_comm_hook: the hook must be callable as hook(state, bucket), got " +
                      std::string(py::str(py::repr(hook))));
        }
        return std::make_shared<PythonHook>(std::move(state), std::move(hook), average, serial);
      },
      py::arg("state"), py::arg("hook"), py::arg("average") = true, py::arg("serial") = true,
      "A Python DDP communication hook hook(state, bucket) -> Future[Tensor], run by torch's PythonCommHook, "
      "e.g. torch's powerSGD_hook with a PowerSGDState or default_hooks.fp16_compress_hook. average=True: the "
      "hook returns the average of the replicas' buckets (DDP's convention; torch's hooks), so the buckets hand "
      "over share x replicas. serial=True: bucket k + 1 starts when bucket k's future completed, needed by hooks "
      "that issue collectives from callbacks (PowerSGD); False only for hooks that issue all of theirs inside "
      "the call. The state must communicate over the counting group given to GradientBuckets.");
}

}  // namespace graphpipe::bindings
