// graphpipe._C runtime bindings: the Executor (one rank's program over a c10d process group),
// the runtime's error classes, and a schedule generator for stage-level plans that the Python
// runtime (graphpipe/runtime) builds from a Plan.
//
// Compiled against torch's bundled pybind11, so a torch.distributed ProcessGroup passes in as
// c10::intrusive_ptr<c10d::ProcessGroup> and tensors as at::Tensor.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <chrono>

#include "bindings/bindings.h"
#include "partition/plan.h"
#include "runtime/errors.h"
#include "runtime/executor.h"
#include "schedule/check.h"
#include "schedule/generate.h"
#include "schedule/schedule_json.h"
#if GRAPHPIPE_WITH_CUDA
#include "runtime/cuda/cuda_streams.h"
#endif

namespace py = pybind11;

namespace graphpipe::bindings {

namespace {

std::chrono::milliseconds to_ms(double seconds) {
  if (!(seconds > 0.0)) throw Error("graphpipe runtime: the timeout must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

// A stage-level Plan (what the scheduler reads: stages, their ranks and costs, stage edges).
partition::Plan stage_plan(const std::vector<std::vector<int>>& stage_devices,
                           const std::vector<std::pair<int, int>>& edges, std::int64_t num_micro_batches,
                           std::int64_t micro_batch_size, const std::vector<double>& forward_seconds,
                           const std::vector<double>& backward_seconds, int num_devices) {
  partition::Plan plan;
  plan.partitioner = "manual";
  plan.num_micro_batches = num_micro_batches;
  plan.micro_batch_size = micro_batch_size;
  plan.batch_size = num_micro_batches * micro_batch_size;
  plan.num_devices = num_devices;
  for (std::size_t s = 0; s < stage_devices.size(); ++s) {
    partition::Stage stage;
    stage.id = static_cast<int>(s);
    stage.devices = stage_devices[s];
    stage.forward_seconds = s < forward_seconds.size() ? forward_seconds[s] : 1.0;
    stage.backward_seconds = s < backward_seconds.size() ? backward_seconds[s] : 2.0;
    plan.stages.push_back(std::move(stage));
  }
  for (const auto& [a, b] : edges) {
    partition::StageEdge e;
    e.src = a;
    e.dst = b;
    plan.edges.push_back(e);
  }
  return plan;
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::object base = m.attr("GraphpipeError");
  auto& peer = py::register_exception<runtime::PeerError>(m, "PeerError", base.ptr());
  py::register_exception<runtime::PipelineTimeout>(m, "PipelineTimeout", peer.ptr());
  py::register_exception<runtime::TransferMismatch>(m, "TransferMismatch", base.ptr());

  m.def(
      "runtime_schedule",
      [](const std::vector<std::vector<int>>& stage_devices, const std::vector<std::pair<int, int>>& edges,
         std::int64_t num_micro_batches, std::int64_t micro_batch_size, const std::string& policy,
         const std::vector<double>& forward_seconds, const std::vector<double>& backward_seconds,
         int num_devices) {
        auto plan = stage_plan(stage_devices, edges, num_micro_batches, micro_batch_size, forward_seconds,
                               backward_seconds, num_devices);
        auto schedule = schedule::generate(plan, policy);
        schedule::require_deadlock_free(schedule);
        return schedule::dumps(schedule);
      },
      py::arg("stage_devices"), py::arg("edges"), py::arg("num_micro_batches"), py::arg("micro_batch_size"),
      py::arg("policy"), py::arg("forward_seconds") = std::vector<double>{},
      py::arg("backward_seconds") = std::vector<double>{}, py::arg("num_devices") = 0,
      "Generates and checks the schedule (JSON text) of a stage-level plan: the stages' devices, the "
      "stage edges (src, dst), micro-batches and a policy ('1f1b', 'fill_drain', '1f1b_greedy').");

#if GRAPHPIPE_WITH_CUDA
  m.attr("runtime_with_cuda") = true;
#else
  m.attr("runtime_with_cuda") = false;
#endif

  py::class_<runtime::InstructionTiming>(m, "InstructionTiming")
      .def_readonly("token", &runtime::InstructionTiming::token)
      .def_readonly("start", &runtime::InstructionTiming::start)
      .def_readonly("end", &runtime::InstructionTiming::end)
      .def("__repr__", [](const runtime::InstructionTiming& t) {
        return "InstructionTiming(" + t.token + ", " + std::to_string(t.start) + ", " + std::to_string(t.end) + ")";
      });

  py::class_<runtime::Executor>(m, "Executor",
                                "Runs one rank's instruction list of a schedule (runtime/executor.h).")
      .def(py::init([](const std::string& schedule_json, int rank,
                       c10::intrusive_ptr<c10d::ProcessGroup> group, double timeout_seconds) {
             return std::make_unique<runtime::Executor>(schedule::loads(schedule_json), rank, std::move(group),
                                                        to_ms(timeout_seconds));
           }),
           py::arg("schedule_json"), py::arg("rank"), py::arg("group"), py::arg("timeout"))
      .def_property_readonly("rank", &runtime::Executor::rank)
      .def_property_readonly("stage", &runtime::Executor::stage)
      .def_property_readonly("in_edges", &runtime::Executor::in_edges)
      .def_property_readonly("out_edges", &runtime::Executor::out_edges)
      .def_property_readonly("program",
                             [](const runtime::Executor& e) {
                               std::vector<std::string> tokens;
                               for (const auto& ins : e.program()) tokens.push_back(schedule::to_token(ins));
                               return tokens;
                             })
      .def("schedule_table", [](const runtime::Executor& e) { return e.schedule().to_string(); })
      .def("set_edge_specs", &runtime::Executor::set_edge_specs, py::arg("specs"))
      .def(
          "use_cuda",
          [](runtime::Executor& e, int device) {
#if GRAPHPIPE_WITH_CUDA
            runtime::cuda::use_cuda(e, static_cast<c10::DeviceIndex>(device));
#else
            (void)e;
            throw Error("graphpipe was built without its CUDA path (GPU " + std::to_string(device) +
                        " asked for): rebuild with -DGRAPHPIPE_WITH_CUDA=ON against a CUDA build of torch");
#endif
          },
          py::arg("device"),
          "Transfers on their own CUDA stream of GPU `device`, ordered with events; receive buffers "
          "on that GPU (runtime/cuda/cuda_streams.h). Needs the CUDA build.")
      .def("set_host_staging", &runtime::Executor::set_host_staging, py::arg("on"),
           "Send and receive GPU tensors through CPU copies, for a backend that moves only CPU "
           "memory (Gloo), e.g. several ranks sharing one GPU (runtime/transport.h).")
      .def("set_timeout", [](runtime::Executor& e, double seconds) { e.set_timeout(to_ms(seconds)); })
      .def(
          "run",
          [](runtime::Executor& e, py::function forward, bool train, bool record) {
            runtime::ForwardFn fn = [&forward](int micro_batch, std::vector<std::vector<at::Tensor>>& inputs) {
              py::gil_scoped_acquire gil;
              py::object result = forward(micro_batch, inputs);
              auto pair = result.cast<py::tuple>();
              if (pair.size() != 2) throw Error("graphpipe runtime: a stage forward must return (outputs, loss)");
              runtime::StageOutput out;
              out.edges = pair[0].cast<std::vector<std::vector<at::Tensor>>>();
              if (!pair[1].is_none()) out.loss = pair[1].cast<at::Tensor>();
              return out;
            };
            py::gil_scoped_release release;
            return e.run(fn, train, record);
          },
          py::arg("forward"), py::arg("train") = true, py::arg("record") = false,
          "Runs the program once. forward(micro_batch, inputs_per_in_edge) -> (outputs_per_out_edge, "
          "loss or None). The GIL is released except inside forward.");
}

}  // namespace graphpipe::bindings
