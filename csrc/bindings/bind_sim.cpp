// Python view of csrc/sim: simulate(plan, schedule, devices) and its result.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "bindings/bindings.h"
#include "cost/gradient_buckets.h"
#include "sim/simulate.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using sim::RankStats;
using sim::SimResult;
using sim::StageStats;
using sim::Task;

namespace {

py::dict task_dict(const Task& t) {
  py::dict d;
  d["name"] = sim::task_name(t);
  d["kind"] = std::string(sim::task_kind_name(t.kind));
  d["rank"] = t.rank;
  d["peer"] = t.peer;
  d["stage"] = t.stage;
  d["micro_batch"] = t.micro_batch;
  d["edge"] = t.edge;
  d["start"] = t.start;
  d["end"] = t.end;
  return d;
}

// Plain Python data (what graphpipe.viz and JSON writers take).
py::dict result_dict(const SimResult& r) {
  py::dict d;
  d["overlap"] = r.overlap;
  d["iteration_seconds"] = r.iteration_seconds;
  d["amortized_iteration_seconds"] = r.amortized_iteration_seconds;
  d["sync"] = r.sync.describe();
  d["samples"] = r.samples;
  d["samples_per_second"] = r.samples_per_second;
  py::list tasks;
  for (const auto& t : r.tasks) tasks.append(task_dict(t));
  d["tasks"] = tasks;
  py::list ranks;
  for (const auto& s : r.ranks) {
    py::dict x;
    x["rank"] = s.rank;
    x["stage"] = s.stage;
    x["busy_seconds"] = s.busy_seconds;
    x["comm_seconds"] = s.comm_seconds;
    x["bubble_seconds"] = s.bubble_seconds;
    x["busy_share"] = s.busy_share;
    x["comm_share"] = s.comm_share;
    x["bubble_share"] = s.bubble_share;
    x["idle_share"] = s.idle_share;
    ranks.append(x);
  }
  d["ranks"] = ranks;
  py::list stages;
  for (const auto& s : r.stages) {
    py::dict x;
    x["stage"] = s.stage;
    x["rank"] = s.rank;
    x["peak_in_flight"] = s.peak_in_flight;
    x["peak_activation_bytes"] = s.peak_activation_bytes;
    stages.append(x);
  }
  d["stages"] = stages;
  d["critical_path"] = r.critical_path;
  return d;
}

// The parts of a result: tasks, each rank's time shares, each stage's peak memory.
void bind_sim_parts(py::module_& m) {
  py::class_<Task>(m, "SimTask", "One simulated task: a forward, backward, transfer or optimizer step.")
      .def_property_readonly("kind", [](const Task& t) { return std::string(sim::task_kind_name(t.kind)); })
      .def_readonly("rank", &Task::rank)
      .def_readonly("peer", &Task::peer)
      .def_readonly("stage", &Task::stage)
      .def_readonly("micro_batch", &Task::micro_batch)
      .def_readonly("edge", &Task::edge)
      .def_readonly("start", &Task::start)
      .def_readonly("end", &Task::end)
      .def_readonly("cause", &Task::cause)
      .def_property_readonly("name", &sim::task_name)
      .def("to_dict", &task_dict)
      .def("__repr__", [](const Task& t) {
        return "<SimTask " + sim::task_name(t) + " rank " + std::to_string(t.rank) + " [" + std::to_string(t.start) +
               ", " + std::to_string(t.end) + "]>";
      });

  py::class_<RankStats>(m, "SimRankStats", "Time shares of one rank over the iteration.")
      .def_readonly("rank", &RankStats::rank)
      .def_readonly("stage", &RankStats::stage)
      .def_readonly("busy_seconds", &RankStats::busy_seconds)
      .def_readonly("comm_seconds", &RankStats::comm_seconds)
      .def_readonly("bubble_seconds", &RankStats::bubble_seconds)
      .def_readonly("busy_share", &RankStats::busy_share)
      .def_readonly("comm_share", &RankStats::comm_share)
      .def_readonly("bubble_share", &RankStats::bubble_share)
      .def_readonly("idle_share", &RankStats::idle_share);

  py::class_<StageStats>(m, "SimStageStats", "Peak activation memory of one stage.")
      .def_readonly("stage", &StageStats::stage)
      .def_readonly("rank", &StageStats::rank)
      .def_readonly("peak_in_flight", &StageStats::peak_in_flight)
      .def_readonly("peak_activation_bytes", &StageStats::peak_activation_bytes);
}

void bind_sim_result(py::module_& m) {
  py::class_<SimResult>(m, "SimResult", "Prediction of one iteration (see sim/simulate.h).")
      .def_readonly("overlap", &SimResult::overlap)
      .def_readonly("iteration_seconds", &SimResult::iteration_seconds, "Of the simulated step.")
      .def_readonly("amortized_iteration_seconds", &SimResult::amortized_iteration_seconds,
                    "Mean over a local-SGD period (iteration_seconds for the other methods).")
      .def_readonly("sync", &SimResult::sync, "The sync method simulated.")
      .def_readonly("samples", &SimResult::samples)
      .def_readonly("samples_per_second", &SimResult::samples_per_second)
      .def_readonly("tasks", &SimResult::tasks)
      .def_readonly("ranks", &SimResult::ranks)
      .def_readonly("stages", &SimResult::stages)
      .def_readonly("critical_path", &SimResult::critical_path, "Task indices, first to last.")
      .def_property_readonly("critical_path_tasks",
                             [](const SimResult& r) {
                               std::vector<Task> out;
                               for (int k : r.critical_path) out.push_back(r.tasks[k]);
                               return out;
                             })
      .def("summary", &SimResult::summary)
      .def("to_dict", &result_dict, "Plain dicts and lists (tasks included), for viz and JSON.")
      .def("__str__", &SimResult::summary)
      .def("__repr__", [](const SimResult& r) {
        return "<SimResult iteration " + std::to_string(r.iteration_seconds) + " s, " +
               std::to_string(r.samples_per_second) + " samples/s>";
      });
}

}  // namespace

void bind_sim(py::module_& m) {
  bind_sim_parts(m);
  bind_sim_result(m);
  m.def(
      "simulate",
      [](const plan::Plan& plan, const schedule::Schedule& schedule, const cost::Devices& devices, bool overlap,
         double optimizer_traffic_factor, double bucket_bytes, std::optional<cost::SyncMethod> sync, bool sync_step,
         const cost::CrossReplica& cross_replica, const std::optional<std::string>& optimizer) {
        sim::SimOptions options;
        if (optimizer) options.optimizer = cost::parse_optimizer(*optimizer);
        options.cross_replica = cross_replica;
        options.sync = sync;
        options.sync_step = sync_step;
        options.overlap = overlap;
        options.optimizer_traffic_factor = optimizer_traffic_factor;
        options.bucket_bytes = bucket_bytes;
        py::gil_scoped_release release;
        return sim::simulate(plan, schedule, devices, options);
      },
      py::arg("plan"), py::arg("schedule"), py::arg("devices"), py::arg("overlap") = true,
      py::arg("optimizer_traffic_factor") = 4.0, py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
      py::arg("sync") = py::none(), py::arg("sync_step") = true, py::arg("cross_replica") = cost::CrossReplica{},
      py::arg("optimizer") = py::none(),
      "Predicts one iteration of `plan` run by `schedule` on `devices` (sim/simulate.h); sync: the replicated "
      "stages' SyncMethod (default the plan's); sync_step: for local SGD, simulate a step that averages; "
      "cross_replica: fault-tolerant replicas of the whole pipeline (sim/cross_replica_tail.h); optimizer: the one "
      "the step runs, priced per parameter tensor (default the plan's).");
}

}  // namespace graphpipe::bindings
