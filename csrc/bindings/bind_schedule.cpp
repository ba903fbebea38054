// Python view of csrc/schedule: instructions, Schedule (generate, print, parse, JSON, check).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "plan/plan.h"
#include "schedule/check.h"
#include "schedule/fits_plan.h"
#include "schedule/generate.h"
#include "schedule/schedule_json.h"
#include "schedule/shards.h"

namespace py = pybind11;

namespace graphpipe::bindings {

using plan::Plan;
using schedule::BlockedRank;
using schedule::CheckResult;
using schedule::Instruction;
using schedule::OpKind;
using schedule::Schedule;

namespace {

std::vector<std::vector<std::string>> programs(const Schedule& s) {
  std::vector<std::vector<std::string>> out;
  for (const auto& program : s.ranks) {
    out.emplace_back();
    for (const auto& i : program) out.back().push_back(schedule::to_token(i));
  }
  return out;
}

// stage_ranks: per stage, a rank or a list of ranks (its replicas, lead first).
Schedule from_programs(const std::string& kind, int num_micro_batches, const py::list& stage_ranks,
                       const std::vector<std::pair<int, int>>& edges,
                       const std::vector<std::vector<std::string>>& tokens) {
  Schedule s;
  s.kind = kind;
  s.num_micro_batches = num_micro_batches;
  for (const auto& entry : stage_ranks) {
    if (py::isinstance<py::int_>(entry)) {
      s.stage_ranks.push_back({entry.cast<int>()});
    } else {
      s.stage_ranks.push_back(entry.cast<std::vector<int>>());
    }
  }
  for (const auto& [a, b] : edges) s.edges.push_back({a, b});
  for (const auto& program : tokens) {
    s.ranks.emplace_back();
    for (const auto& t : program) s.ranks.back().push_back(schedule::parse_token(t));
  }
  schedule::validate(s);
  return s;
}

}  // namespace

namespace {

// ScheduleError, instruction kinds and instructions.
void bind_instructions(py::module_& m) {
  py::register_exception<schedule::ScheduleError>(m, "ScheduleError", m.attr("GraphpipeError").ptr());

  py::enum_<OpKind>(m, "OpKind", "What one schedule instruction does.")
      .value("recv_activation", OpKind::recv_activation)
      .value("forward", OpKind::forward)
      .value("send_activation", OpKind::send_activation)
      .value("recv_gradient", OpKind::recv_gradient)
      .value("backward", OpKind::backward)
      .value("send_gradient", OpKind::send_gradient)
      .value("optimizer_step", OpKind::optimizer_step)
      .value("all_reduce", OpKind::all_reduce)
      .value("backward_input", OpKind::backward_input)
      .value("backward_weight", OpKind::backward_weight);

  py::class_<Instruction>(m, "Instruction",
                          "One step of a rank's program (see schedule/instruction.h); prints as a "
                          "token such as '1F0' or '0SF3e2'.")
      .def(py::init([](OpKind kind, int stage, int micro_batch, int edge) {
             return Instruction{kind, stage, micro_batch, edge};
           }),
           py::arg("kind"), py::arg("stage"), py::arg("micro_batch") = -1, py::arg("edge") = -1)
      .def_static("parse", &schedule::parse_token, py::arg("token"))
      .def_readonly("kind", &Instruction::kind)
      .def_readonly("stage", &Instruction::stage)
      .def_readonly("micro_batch", &Instruction::micro_batch)
      .def_readonly("edge", &Instruction::edge)
      .def_property_readonly("token", &schedule::to_token)
      .def("describe", &schedule::describe)
      .def("__eq__", [](const Instruction& a, const Instruction& b) { return a == b; })
      .def("__hash__", [](const Instruction& i) { return py::hash(py::str(schedule::to_token(i))); })
      .def("__str__", &schedule::to_token)
      .def("__repr__", [](const Instruction& i) { return "Instruction(" + schedule::to_token(i) + ")"; });
}

// What Schedule.check() returns.
void bind_check_result(py::module_& m) {
  py::class_<BlockedRank>(m, "BlockedRank", "A rank that cannot finish, and the instruction it blocks on.")
      .def_readonly("rank", &BlockedRank::rank)
      .def_readonly("step", &BlockedRank::step)
      .def_readonly("instruction", &BlockedRank::instruction)
      .def_readonly("reason", &BlockedRank::reason)
      .def("__repr__", [](const BlockedRank& b) {
        return "BlockedRank(rank=" + std::to_string(b.rank) + ", step=" + std::to_string(b.step) + ", " +
               schedule::to_token(b.instruction) + ")";
      });

  py::class_<CheckResult>(m, "CheckResult", "Outcome of Schedule.check() (see schedule/check.h).")
      .def_readonly("ok", &CheckResult::ok)
      .def_readonly("batches", &CheckResult::batches)
      .def_readonly("blocked", &CheckResult::blocked)
      .def("__bool__", [](const CheckResult& r) { return r.ok; })
      .def("__str__", &CheckResult::to_string)
      .def("__repr__",
           [](const CheckResult& r) { return std::string("<CheckResult ") + (r.ok ? "ok" : "hangs") + ">"; });
}

// Schedule: generate, parse, JSON, check, its programs.
void bind_schedule_class(py::module_& m) {
  py::class_<Schedule>(m, "Schedule",
                       "Per-rank programs of one training iteration (see schedule/schedule.h). "
                       "str() is the ranks x steps table, which Schedule.parse reads back.")
      .def(py::init(&from_programs), py::arg("kind"), py::arg("num_micro_batches"), py::arg("stage_ranks"),
           py::arg("edges"), py::arg("programs"), "Builds a schedule from token lists, one per rank; validates it.")
      .def_static(
          "generate", [](const Plan& plan, const std::string& kind) { return schedule::generate(plan, kind); },
          py::arg("plan"), py::arg("kind") = "1f1b",
          "A deadlock-free schedule for `plan` under the policy named `kind` (graphpipe.SCHEDULES lists "
          "them: schedule/generate.h, policies()).")
      .def_static(
          "parse", [](const std::string& text) { return schedule::parse(text); }, py::arg("text"))
      .def_static("from_json", &schedule::loads, py::arg("text"))
      .def_static("load", &schedule::load, py::arg("path"))
      .def(
          "to_json", [](const Schedule& s, int indent) { return schedule::dumps(s, indent); }, py::arg("indent") = -1)
      .def(
          "save", [](const Schedule& s, const std::string& path) { schedule::save(s, path); }, py::arg("path"))
      .def("check", &schedule::check,
           "Replays the programs with matched sends and receives (blocking model of "
           "schedule/check.h): ok, or per stuck rank the instruction it blocks on.")
      .def("validate", &schedule::validate)
      .def("check_fits", &schedule::check_fits, py::arg("plan"),
           "Raises ScheduleError naming the first difference unless this schedule was made for `plan` "
           "(its stages, edges, micro-batch count and stage ranks; schedule/fits_plan.h).")
      .def_readonly("kind", &Schedule::kind)
      .def_readonly("num_micro_batches", &Schedule::num_micro_batches)
      .def_readonly("stage_ranks", &Schedule::stage_ranks)
      .def_property_readonly("edges",
                             [](const Schedule& s) {
                               std::vector<std::pair<int, int>> out;
                               for (const auto& e : s.edges) out.push_back({e.src, e.dst});
                               return out;
                             })
      .def_property_readonly("programs", &programs, "Each rank's program as tokens.")
      .def(
          "instructions", [](const Schedule& s, int rank) { return s.ranks.at(rank); }, py::arg("rank"))
      .def_property_readonly("num_stages", &Schedule::num_stages)
      .def_property_readonly("num_ranks", &Schedule::num_ranks)
      .def("compute_table", &Schedule::compute_table)
      .def("__eq__", [](const Schedule& a, const Schedule& b) { return a == b; })
      .def("__str__", &Schedule::to_string)
      .def("__repr__", [](const Schedule& s) {
        return "<Schedule " + s.kind + ": " + std::to_string(s.num_stages()) + " stages, " +
               std::to_string(s.num_micro_batches) + " micro-batches, " + std::to_string(s.num_instructions()) +
               " instructions>";
      });
}

// The policies and the rules the runtime and the baselines share with the generator.
void bind_policy_helpers(py::module_& m) {
  m.def(
      "in_flight_limits",
      [](const Plan& plan, const std::string& kind) {
        return schedule::in_flight_limits(plan, schedule::parse_policy(kind));
      },
      py::arg("plan"), py::arg("kind") = "1f1b", "Most micro-batches each stage may hold under the schedule kind.");
  m.def("backward_split", &schedule::backward_split, py::arg("stage"),
        "(input-gradient seconds, weight-gradient seconds) of a plan Stage's backward, as the "
        "zero-bubble schedule and the simulator split it (schedule/generate.h).");
  m.def(
      "shard_rows",
      [](std::int64_t rows, int replicas, int index) {
        const auto r = schedule::shard_rows(rows, replicas, index);
        return std::make_pair(r.begin, r.end);
      },
      py::arg("rows"), py::arg("replicas"), py::arg("index"),
      "Rows [begin, end) of replica `index` of `replicas` in a micro-batch of `rows` rows "
      "(schedule/shards.h: torch.tensor_split's split).");
  m.def(
      "parse_schedule_kind",
      [](const std::string& name) { return std::string(schedule::policy_name(schedule::parse_policy(name))); },
      py::arg("name"), "The canonical name of a schedule kind (PlanningError naming the kinds for an unknown one).");
  m.def("schedule_kinds", &schedule::policy_names, "Names of the schedule policies Schedule.generate accepts.");
  m.def("stages_to_sink", &schedule::stages_to_sink, py::arg("plan"),
        "Per stage, the number of stages on the longest path from it to a sink.");
}

}  // namespace

void bind_schedule(py::module_& m) {
  bind_instructions(m);
  bind_check_result(m);
  bind_schedule_class(m);
  bind_policy_helpers(m);
}

}  // namespace graphpipe::bindings
