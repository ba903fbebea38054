// graphpipe._C runtime bindings: the Executor (one rank's program of a Schedule over a c10d
// process group), the timings it records, and the runtime's error classes.
//
// The Executor takes the Schedule object itself, the one graphpipe.schedule generates for the
// Plan (and graphpipe.simulate predicts), so that what runs is what was simulated.
//
// Compiled against torch's bundled pybind11, so a torch.distributed ProcessGroup passes in as
// c10::intrusive_ptr<c10d::ProcessGroup> and tensors as at::Tensor.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <limits>
#include <tuple>

#include "bindings/bindings.h"
#include "cost/gradient_buckets.h"
#include "runtime/comm_hook.h"
#include "runtime/errors.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/flight_recorder.h"
#include "runtime/gradient_buckets.h"
#include "runtime/split_backward.h"
#include "schedule/check.h"
#include "schedule/instruction.h"
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

// The stages' Python forward, called once per forward instruction with the GIL taken: the
// stage and micro-batch, and the received tensors as a list per incoming edge, go in; (outputs per outgoing edge, loss
// or None) comes back. Built and read with the Python C API directly (no generic pybind11 casters): it runs on every
// forward of every micro-batch.
runtime::StageOutput call_stage(const py::function& forward, int stage, int micro_batch,
                                std::vector<std::vector<at::Tensor>>& inputs) {
  py::gil_scoped_acquire gil;
  py::list edges(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    py::list tensors(inputs[i].size());
    for (std::size_t k = 0; k < inputs[i].size(); ++k) {
      PyList_SET_ITEM(tensors.ptr(), static_cast<Py_ssize_t>(k), THPVariable_Wrap(inputs[i][k]));
    }
    PyList_SET_ITEM(edges.ptr(), static_cast<Py_ssize_t>(i), tensors.release().ptr());
  }
  py::object result = forward(stage, micro_batch, edges);
  if (!PyTuple_Check(result.ptr()) || PyTuple_GET_SIZE(result.ptr()) != 2) {
    throw Error("graphpipe runtime: a stage forward must return (outputs, loss)");
  }
  runtime::StageOutput out;
  py::handle outputs = PyTuple_GET_ITEM(result.ptr(), 0);
  py::handle loss = PyTuple_GET_ITEM(result.ptr(), 1);
  if (!py::isinstance<py::sequence>(outputs)) {
    throw Error("graphpipe runtime: a stage forward's outputs must be a list of tensor lists, one per outgoing edge");
  }
  for (py::handle edge : py::reinterpret_borrow<py::sequence>(outputs)) {
    if (!py::isinstance<py::sequence>(edge)) {
      throw Error("graphpipe runtime: a stage forward's outputs must be a list of tensor lists, one per outgoing edge");
    }
    auto& tensors = out.edges.emplace_back();
    for (py::handle t : py::reinterpret_borrow<py::sequence>(edge)) {
      if (!THPVariable_Check(t.ptr())) {
        throw Error(std::string("graphpipe runtime: a stage forward returned a ") + Py_TYPE(t.ptr())->tp_name +
                    " among the tensors of outgoing edge " + std::to_string(out.edges.size() - 1));
      }
      tensors.push_back(THPVariable_Unpack(t.ptr()));
    }
  }
  if (!loss.is_none()) {
    if (!THPVariable_Check(loss.ptr()))
      throw Error("graphpipe runtime: a stage forward's loss must be a tensor or None");
    out.loss = THPVariable_Unpack(loss.ptr());
  }
  return out;
}

void bind_runtime_errors(py::module_& m) {
  py::object base = m.attr("GraphpipeError");
  auto& peer = py::register_exception<runtime::PeerError>(m, "PeerError", base.ptr());
  py::register_exception<runtime::PipelineTimeout>(m, "PipelineTimeout", peer.ptr());
  py::register_exception<runtime::TransferMismatch>(m, "TransferMismatch", base.ptr());
  py::register_exception<runtime::InjectedFaultError>(m, "InjectedFault", base.ptr());

#if GRAPHPIPE_WITH_CUDA
  m.attr("runtime_with_cuda") = true;
#else
  m.attr("runtime_with_cuda") = false;
#endif
}

// A timing carries the instruction it measured (schedule/instruction.h), so readers use its
// fields rather than parsing the token.
void bind_timings(py::module_& m) {
  py::class_<runtime::InstructionTiming>(m, "InstructionTiming")
      .def_readonly("instruction", &runtime::InstructionTiming::instruction)
      .def_property_readonly("kind", [](const runtime::InstructionTiming& t) { return t.instruction.kind; })
      .def_property_readonly("stage", [](const runtime::InstructionTiming& t) { return t.instruction.stage; })
      .def_property_readonly("micro_batch",
                             [](const runtime::InstructionTiming& t) { return t.instruction.micro_batch; })
      .def_property_readonly("edge", [](const runtime::InstructionTiming& t) { return t.instruction.edge; })
      .def_property_readonly("token",
                             [](const runtime::InstructionTiming& t) { return schedule::to_token(t.instruction); })
      .def_readonly("start", &runtime::InstructionTiming::start)
      .def_readonly("end", &runtime::InstructionTiming::end)
      .def("__repr__", [](const runtime::InstructionTiming& t) {
        return "InstructionTiming(" + schedule::to_token(t.instruction) + ", " + std::to_string(t.start) + ", " +
               std::to_string(t.end) + ")";
      });
}

// The runtime's split backward (runtime/split_backward.h), for the profiler and the benchmarks
// to time I and W exactly as the executor runs them.
void bind_split_backward(py::module_& m) {
  py::class_<runtime::PendingWeights>(m, "PendingWeights",
                                      "What a split backward's I leaves for its W (run() computes the "
                                      "parameters' gradients and frees the graph).")
      .def("run", &runtime::PendingWeights::run, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_roots", &runtime::PendingWeights::num_roots)
      .def_property_readonly("empty", &runtime::PendingWeights::empty);
  m.def(
      "backward_input",
      [](const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params) {
        std::vector<at::Tensor> got;
        runtime::PendingWeights pending;
        {
          py::gil_scoped_release release;
          pending = runtime::backward_input(roots, grads, inputs, params, &got);
        }
        py::list out;
        for (const auto& g : got) {
          if (g.defined()) {
            out.append(py::cast(g));
          } else {
            out.append(py::none());
          }
        }
        return py::make_tuple(out, std::move(pending));
      },
      py::arg("roots"), py::arg("grads"), py::arg("inputs"), py::arg("params"),
      "A split backward's I: the gradients of roots (seeded with grads) with respect to inputs (None "
      "where none reaches one), and the PendingWeights whose run() is its W for params.");
}

void bind_gradient_buckets(py::module_& m) {
  py::class_<runtime::GradientBuckets, std::shared_ptr<runtime::GradientBuckets>>(
      m, "GradientBuckets",
      "Synchronises a replicated stage's gradients over its replicas in buckets that start during the last "
      "backward, through a communication hook (runtime/gradient_buckets.h).")
      .def(py::init([](std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::ProcessGroup> group,
                       double timeout_seconds, double bucket_bytes, std::shared_ptr<runtime::CommHook> hook) {
             const auto timeout = to_ms(timeout_seconds);
             // Attaching a hook may communicate (and wait); Python hooks take the GIL themselves.
             py::gil_scoped_release release;
             return std::make_shared<runtime::GradientBuckets>(std::move(parameters), std::move(group), timeout,
                                                               bucket_bytes, std::move(hook));
           }),
           py::arg("parameters"), py::arg("group"), py::arg("timeout"),
           py::arg("bucket_bytes") = cost::kDefaultBucketBytes, py::arg("hook") = py::none(),
           "`group`: the stage's process group, or a CountingGroup over it (graphpipe._C.counting_group), which "
           "a Python hook's state must name. `hook`: a CommHook (default: all_reduce_hook(), the exact sum).")
      .def_property_readonly("num_buckets", &runtime::GradientBuckets::num_buckets)
      .def_property_readonly("bytes", &runtime::GradientBuckets::bytes,
                             "Gradient bytes synchronised per iteration (the buckets' sizes).")
      .def_property_readonly("group", &runtime::GradientBuckets::group, "The CountingGroup the hook communicates over.")
      .def_property_readonly("hook", &runtime::GradientBuckets::hook)
      .def_property_readonly("bytes_communicated", &runtime::GradientBuckets::bytes_communicated,
                             "Payload bytes this rank's hook handed to collectives (input tensor sizes), cumulative "
                             "since construction or reset_traffic() (runtime/counting_group.h).")
      .def_property_readonly("collectives", &runtime::GradientBuckets::collectives,
                             "Collectives the hook issued, cumulative since construction or reset_traffic().")
      .def("reset_traffic", &runtime::GradientBuckets::reset_traffic)
      .def("arm", &runtime::GradientBuckets::arm,
           "The next backward is the iteration's last: buckets start as their gradients become final.")
      .def(
          "finish", [](runtime::GradientBuckets& b) { b.finish(); }, py::call_guard<py::gil_scoped_release>(),
          "Starts the buckets left, waits for every bucket (within the timeout) and writes the results into the "
          "gradients.")
      .def("abandon", &runtime::GradientBuckets::abandon,
           "Disarms and forgets the buckets in flight (after a failed iteration).")
      .def_property_readonly("armed", &runtime::GradientBuckets::armed,
                             "Whether the backward running now is the iteration's last (between arm and finish).");
  m.attr("default_bucket_bytes") = cost::kDefaultBucketBytes;
  m.attr("whole_step_bytes") = runtime::kWholeStepBytes;
}

// A flight record as the dumps write it (graphpipe/runtime/flight.py): plain types only.
py::dict flight_record_dict(const runtime::FlightRecord& r) {
  py::dict d;
  d["id"] = r.id;
  d["run"] = r.run;
  d["token"] = schedule::to_token(r.instruction);
  d["kind"] = std::string(schedule::kind_name(r.instruction.kind));
  d["what"] = schedule::describe(r.instruction);
  d["stage"] = r.instruction.stage;
  d["micro_batch"] = r.instruction.micro_batch;
  d["edge"] = r.instruction.edge;
  d["peers"] = r.peers;
  d["bytes"] = r.bytes;
  d["state"] = std::string(runtime::flight_state_name(r.state));
  d["start"] = r.start;
  d["end"] = r.end;
  d["note"] = r.note;
  return d;
}

void bind_flight_recorder(py::module_& m) {
  py::class_<runtime::FlightRecorder, std::shared_ptr<runtime::FlightRecorder>>(
      m, "FlightRecorder",
      "A rank's last executor instructions and collectives (runtime/flight_recorder.h); it outlives the "
      "executor that writes it.")
      .def_property("capacity", &runtime::FlightRecorder::capacity, &runtime::FlightRecorder::set_capacity,
                    "How many records are kept (0: off). Setting it drops the records kept.")
      .def_property_readonly("run", &runtime::FlightRecorder::run, "The number of the executor's current or last run.")
      .def(
          "records",
          [](const runtime::FlightRecorder& f) {
            py::list out;
            for (const auto& r : f.records()) out.append(flight_record_dict(r));
            return out;
          },
          "The records kept, oldest first, as dicts: id, run, token, kind, what, stage, micro_batch, edge, peers, "
          "bytes, state (posted, waiting, running, completed, failed), start, end (seconds since the epoch; end 0 "
          "while open), note.")
      .def(
          "current",
          [](const runtime::FlightRecorder& f) -> py::object {
            auto r = f.current();
            if (!r) return py::none();
            return flight_record_dict(*r);
          },
          "The record the rank is running or waiting on now (the failed one after a failure), or None.")
      .def(
          "last",
          [](const runtime::FlightRecorder& f) -> py::object {
            auto r = f.last();
            if (!r) return py::none();
            return flight_record_dict(*r);
          },
          "The newest record, or None.");
}

void bind_executor_running(py::class_<runtime::Executor>& executor);

void bind_executor(py::module_& m) {
  py::enum_<runtime::ReceivePosting>(m, "ReceivePosting",
                                     "When a tag-matching backend's receives are posted (runtime/executor.h).")
      .value("one_ahead", runtime::ReceivePosting::one_ahead)
      .value("whole_step", runtime::ReceivePosting::whole_step);
  auto executor =
      py::class_<runtime::Executor>(m, "Executor",
                                    "Runs one rank's instruction list of a schedule (runtime/executor.h).")
          .def(py::init([](const schedule::Schedule& schedule, int rank, c10::intrusive_ptr<c10d::ProcessGroup> group,
                           double timeout_seconds) {
                 // Only a schedule proven not to hang runs: a hang across ranks would surface as a
                 // timeout far from its cause, the checker names the instruction instead.
                 schedule::require_deadlock_free(schedule);
                 return std::make_unique<runtime::Executor>(schedule, rank, std::move(group), to_ms(timeout_seconds));
               }),
               py::arg("schedule"), py::arg("rank"), py::arg("group"), py::arg("timeout"),
               "Runs `rank`'s program of `schedule` (a Schedule, e.g. graphpipe.schedule(plan, kind)); "
               "raises ScheduleError if the schedule can hang.")
          .def_property_readonly("rank", &runtime::Executor::rank)
          .def_property_readonly("stage", &runtime::Executor::stage, "Its first stage (-1: it holds none).")
          .def_property_readonly("stages", &runtime::Executor::stages, "Every stage this rank holds, ascending.")
          .def("in_edges", &runtime::Executor::in_edges, py::arg("stage"),
               "The stage's incoming edges, in the order forward() receives their tensors.")
          .def("out_edges", &runtime::Executor::out_edges, py::arg("stage"),
               "The stage's outgoing edges, in the order forward() returns their tensors.")
          .def_property_readonly("program",
                                 [](const runtime::Executor& e) {
                                   std::vector<std::string> tokens;
                                   for (const auto& ins : e.program()) tokens.push_back(schedule::to_token(ins));
                                   return tokens;
                                 })
          // A copy: a reference would keep the executor, and with it the process group, alive.
          .def_property_readonly(
              "schedule", [](const runtime::Executor& e) { return e.schedule(); }, "The Schedule it runs (a copy).")
          .def("schedule_table", [](const runtime::Executor& e) { return e.schedule().to_string(); })
          .def_property_readonly("replica", &runtime::Executor::replica)
          .def(
              "my_rows",
              [](const runtime::Executor& e, std::int64_t rows) {
                const auto r = e.my_rows(rows);
                return std::make_pair(r.begin, r.end);
              },
              py::arg("rows"), "This rank's rows [begin, end) of a micro-batch of `rows` rows.")
          .def("set_edge_specs", &runtime::Executor::set_edge_specs, py::arg("specs"), py::arg("rows") = 0)
          .def("set_parameters", &runtime::Executor::set_parameters, py::arg("stage"), py::arg("parameters"),
               "A stage's trainable parameters, whose gradients its W instructions compute (an empty "
               "list: a stage without any).")
          .def("set_local_updates", &runtime::Executor::set_local_updates, py::arg("on"),
               "The replicas of this rank's stage update locally (local SGD): AR waits for nothing.")
          .def_property_readonly("held_micro_batches", &runtime::Executor::held_micro_batches,
                                 "Micro-batches whose state (activations, outputs, graphs kept between an "
                                 "I and its W) the executor holds: 0 after every run().")
          .def("set_gradient_buckets", &runtime::Executor::set_gradient_buckets, py::arg("buckets"),
               "The replicas' gradient sum of this rank's replicated stage (GradientBuckets).");
  bind_executor_running(executor);
}

// The executor's device, deadline, failure and run methods.
void bind_executor_running(py::class_<runtime::Executor>& executor) {
  executor
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
      .def("set_receive_posting", &runtime::Executor::set_receive_posting, py::arg("posting"),
           py::arg("memory_headroom_bytes") = std::numeric_limits<double>::infinity(),
           "When receives are posted over a backend that matches by tag (Gloo): one_ahead (each with the "
           "next of its stream) or whole_step (the receives of a step at its start while their buffers fit "
           "min(memory_headroom_bytes, whole_step_bytes), the rest one ahead; runtime/executor.h). The headroom "
           "is what the plan leaves of its memory limit on this rank (Plan.memory_headroom). whole_step over "
           "a backend that matches by order raises.")
      .def_property_readonly("receive_posting", &runtime::Executor::receive_posting)
      .def_property_readonly("whole_step_budget_bytes", &runtime::Executor::whole_step_budget_bytes,
                             "The most bytes of receive buffers whole_step posts at a run's start.")
      .def_property_readonly("posted_at_start_bytes", &runtime::Executor::posted_at_start_bytes,
                             "The bytes of receive buffers the last run posted at its start.")
      .def("set_timeout", [](runtime::Executor& e, double seconds) { e.set_timeout(to_ms(seconds)); })
      .def_property_readonly("flight_recorder", &runtime::Executor::flight_recorder,
                             "This rank's FlightRecorder (shared: keeping it does not keep the executor).")
      .def(
          "flight_records", [](const runtime::Executor& e) { return py::cast(e.flight_recorder()).attr("records")(); },
          "flight_recorder.records().")
      .def(
          "current_instruction",
          [](const runtime::Executor& e) { return py::cast(e.flight_recorder()).attr("current")(); },
          "flight_recorder.current(): the instruction running or waited on now, or None.")
      .def(
          "set_faults",
          [](runtime::Executor& e,
             const std::vector<std::tuple<std::vector<schedule::OpKind>, std::string, double, std::string>>& faults) {
            std::vector<runtime::InjectedFault> armed;
            for (const auto& [kinds, action, seconds, label] : faults) {
              armed.push_back({kinds, runtime::parse_fault_action(action), seconds, label});
            }
            e.set_faults(std::move(armed));
          },
          py::arg("faults"),
          "Injected faults for the next run only: (kinds, 'raise' | 'hang' | 'kill', hang seconds, label) each, "
          "fired before the first instruction of any of its kinds (graphpipe/runtime/faults.py).")
      .def("disconnect", &runtime::Executor::disconnect,
           "Drops the executor's handles on its process group and gradient buckets (after a "
           "failure, so that closing the groups closes this rank's connections); run() raises "
           "afterwards.")
      .def(
          "run",
          [](runtime::Executor& e, const py::function& forward, bool train, bool record) {
            const runtime::ForwardFn fn = [&forward](int stage, int micro_batch,
                                                     std::vector<std::vector<at::Tensor>>& inputs) {
              return call_stage(forward, stage, micro_batch, inputs);
            };
            py::gil_scoped_release release;
            return e.run(fn, train, record);
          },
          py::arg("forward"), py::arg("train") = true, py::arg("record") = false,
          "Runs the program once. forward(stage, micro_batch, inputs_per_in_edge) -> (outputs_per_out_edge, "
          "loss or None). The GIL is released except inside forward.");
}

}  // namespace

void bind_runtime(py::module_& m) {
  bind_runtime_errors(m);
  bind_timings(m);
  bind_split_backward(m);
  bind_gradient_buckets(m);
  bind_flight_recorder(m);
  bind_executor(m);
}

}  // namespace graphpipe::bindings
