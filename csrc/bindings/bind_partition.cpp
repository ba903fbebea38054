// Python view of csrc/partition and csrc/planner: partition(), plan_by_simulation() and the
// partitioners' names (the Plan they return is bind_plan.cpp's).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "partition/partitioner.h"
#include "partition/registry.h"
#include "plan/fold.h"
#include "plan/plan.h"
#include "planner/default_search.h"
#include "planner/planner.h"
#include "planner/retime.h"

namespace py = pybind11;

namespace graphpipe::bindings {

namespace {

// The Python signature's optional arguments turned into Options.
partition::Options make_options(const std::string& partitioner, std::int64_t batch_size,
                                std::optional<std::int64_t> micro_batch_size,
                                std::optional<std::int64_t> num_micro_batches, std::optional<double> memory_limit,
                                const std::string& optimizer, std::optional<partition::ManualMapping> manual,
                                int max_stages, double tolerance, int seed, bool refine, bool replicate,
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
  return o;
}

plan::Plan partition_graph(const graph::OpGraph& g, const cost::Devices& devices, const std::string& partitioner,
                           std::int64_t batch_size, std::optional<std::int64_t> micro_batch_size,
                           std::optional<std::int64_t> num_micro_batches, std::optional<double> memory_limit,
                           const std::string& optimizer, std::optional<partition::ManualMapping> manual, int max_stages,
                           double tolerance, int seed, bool refine, bool replicate,
                           std::optional<std::map<int, std::vector<int>>> stage_devices, bool zero_bubble,
                           const cost::SyncMethod& sync) {
  partition::Options o =
      make_options(partitioner, batch_size, micro_batch_size, num_micro_batches, memory_limit, optimizer, manual,
                   max_stages, tolerance, seed, refine, replicate, stage_devices, zero_bubble, sync);
  py::gil_scoped_release release;
  return partition::partition(g, devices, o);
}

// plan_by_simulation(): the same arguments, plus the schedule and the simulator's options.
planner::PlannerResult plan_simulated(
    const graph::OpGraph& g, const cost::Devices& devices, const std::string& partitioner, std::int64_t batch_size,
    std::optional<std::int64_t> micro_batch_size, std::optional<std::int64_t> num_micro_batches,
    std::optional<double> memory_limit, const std::string& optimizer, std::optional<partition::ManualMapping> manual,
    int max_stages, double tolerance, int seed, bool refine, std::optional<bool> replicate,
    std::optional<std::map<int, std::vector<int>>> stage_devices, const std::string& schedule,
    const cost::SyncMethod& sync, double bucket_bytes, bool overlap, int min_devices, int plain_budget_limit,
    int plain_every_up_to, bool grow_replicas, std::optional<int> stages_per_rank, int fold_budget_limit,
    const std::optional<std::string>& fold, const cost::CrossReplica& cross_replica) {
  planner::PlannerOptions p;
  // "auto": the planner picks the schedule too, among the policies it weighs (generate.h).
  p.policies = schedule == "auto" ? schedule::planner_policies()
                                  : std::vector<schedule::Policy>{schedule::parse_policy(schedule)};
  // zero_bubble is set per policy by the planner.
  partition::Options o =
      make_options(partitioner, batch_size, micro_batch_size, num_micro_batches, memory_limit, optimizer, manual,
                   max_stages, tolerance, seed, refine, replicate.value_or(false), stage_devices, false, sync);
  p.sim.bucket_bytes = bucket_bytes;
  p.sim.overlap = overlap;
  p.sim.cross_replica = cross_replica;
  p.min_devices = min_devices;
  p.plain_budget_limit = plain_budget_limit;
  p.plain_every_up_to = plain_every_up_to;
  p.grow_replicas = grow_replicas;
  p.stages_per_rank = stages_per_rank;
  p.fold_budget_limit = fold_budget_limit;
  if (fold) p.folds = {plan::parse_fold(*fold)};
  py::gil_scoped_release release;
  return planner::plan_with_replication(g, devices, o, p, replicate);
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
  m.def("retime", &planner::retime, py::arg("plan"), py::arg("graph"), py::arg("devices"),
        "The plan priced again on the graph's current profile and these devices, every decision kept "
        "(planner/retime.h); PlanningError where that would change the plan.");
  m.def("partitioner_names", &partition::partitioner_names);
  m.def("partitioner_places_by_user", &partition::places_by_user, py::arg("name"),
        "Whether the partitioner registered as `name` places stages as the user says (manual).");
  py::class_<planner::PlannerResult>(m, "PlannerResult",
                                     "plan_by_simulation's answer: the plan (predicted step = its simulation), "
                                     "the closed form's step of the same plan, and how many candidates fit and "
                                     "were simulated")
      .def_readonly("plan", &planner::PlannerResult::plan)
      .def_readonly("closed_form_seconds", &planner::PlannerResult::closed_form)
      .def_readonly("candidates", &planner::PlannerResult::candidates)
      .def_readonly("simulated", &planner::PlannerResult::simulated)
      .def_readonly("growth_simulated", &planner::PlannerResult::growth_simulated);
  m.def(
      "plan_by_simulation", &plan_simulated, py::arg("graph"), py::arg("devices"), py::arg("partitioner") = "graphpipe",
      py::arg("batch_size") = 0, py::arg("micro_batch_size") = py::none(), py::arg("num_micro_batches") = py::none(),
      py::arg("memory_limit") = py::none(), py::arg("optimizer") = "adam", py::arg("manual") = py::none(),
      py::arg("max_stages") = 0, py::arg("tolerance") = 1e-3, py::arg("seed") = 0, py::arg("refine") = true,
      py::arg("replicate") = false, py::arg("stage_devices") = py::none(), py::arg("schedule") = "1f1b",
      py::arg("sync") = cost::SyncMethod{}, py::arg("bucket_bytes") = cost::kDefaultBucketBytes,
      py::arg("overlap") = true, py::arg("min_devices") = 0,
      py::arg("plain_budget_limit") = planner::PlannerOptions{}.plain_budget_limit,
      py::arg("plain_every_up_to") = planner::PlannerOptions{}.plain_every_up_to,
      py::arg("grow_replicas") = planner::PlannerOptions{}.grow_replicas, py::arg("stages_per_rank") = py::none(),
      py::arg("fold_budget_limit") = planner::PlannerOptions{}.fold_budget_limit, py::arg("fold") = py::none(),
      py::arg("cross_replica") = cost::CrossReplica{},
      "Every candidate the partitioner makes, simulated under the schedule (planner/planner.h; 'auto': "
      "under 1f1b and zb_graph, the plan recording the faster in Plan.schedule); the least simulated "
      "step's plan, whose predicted_iteration_seconds is that simulation; min_devices keeps only "
      "candidates that use at least that many devices; with replicate, the plans without replicas are "
      "weighed on every count of devices up to plain_every_up_to and every power of two up to "
      "plain_budget_limit (0: up to the device count); grow_replicas grants replicas by simulation at every "
      "power-of-two budget (planner/planner.h). replicate=None is graphpipe.plan's default: replicas allowed "
      "with the widened search, else the plan without them (planner/default_search.h; the search budgets "
      "given are then replaced). stages_per_rank k > 1 also weighs the partitioner's plans folded 2..k stages per "
      "device (None, the default: 2 in the default search, else 1), in a V and looping (planner/folded_search.h; fold 'v' or 'looping': that one alone), on the first 2, 4, ... "
      "ranks up to fold_budget_limit (0: up to the device count; planner/default_search.h). cross_replica: the plan will run as one of "
      "that many fault-tolerant replicas (cost/cross_replica.h): every candidate's simulated step ends "
      "with the average across them.");
}

}  // namespace graphpipe::bindings
