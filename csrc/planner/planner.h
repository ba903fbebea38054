// planner: the plan whose simulated step is least, among every candidate the partitioners make.
//
// The closed form that partition() ranks candidates by, (M + depth - 1) x slowest stage +
// optimizer tail, cannot match the simulator everywhere: it ignores how stage DAGs overlap,
// transfers that queue on a link, and the bucketed all-reduce as the runtime overlaps it with
// the last backward. This layer sits above sim (common <- graph <- cost <- plan <- partition <-
// schedule <- sim <- planner) so that it can judge candidates by the same simulation the user
// runs: it asks partition for every candidate of every micro-batch size that fits in memory
// (partition::CandidateSet, with Options::every_candidate), generates each one's schedule under
// the policy the plan will run with, simulates it (sim::simulate, with the given options) and
// returns the least simulated step. The returned Plan's predicted_iteration_seconds is that
// simulation, so planner and simulator agree by construction.
//
// Cost: a candidate's lower bound (RankedCandidate::pipeline_bound: one micro-batch's forwards
// into a stage, M x the stage's compute, its backwards back out; compute_bound, M x the slowest
// stage's compute, under a split backward) orders the simulations, and the search stops at the
// first candidate whose bound is not below the best simulated step so far: the result is the
// least simulated step over all candidates (branch and bound), after a few simulations. The
// plain pools below are listed only after the replicated ones have been searched, and only where
// their floor (partition::candidate_floor: a bound on every candidate they could list, found
// without listing any) is below the best step simulated so far; the choice is the same as with
// every pool listed. The replicated pools themselves list their micro-batch sizes in two turns:
// the four of least floor, then only those of the rest whose floor is not above the pool's
// fastest candidate simulated so far (CandidateSet::list_below); a size left out holds no
// candidate, nor grown plan, as fast as that one, so the pool's fastest and the plan chosen are
// the same (MMT at paper size onto 64 V100s: its one-sample micro-batches are left out).
//
// Never worse with more devices: the candidate list for a device budget holds every candidate
// of the list for a smaller one (the partitioners' lists only grow with the budget, greedy
// replica allocations' intermediate states included), and a candidate's simulated step depends
// only on the devices it uses; so the least simulated step over the list never grows with the
// budget.
//
// Replicas granted by simulation (replica_refinement.h, PlannerOptions::grow_replicas): after
// the ranking, for each pool with replicas and each power-of-two device budget up to the count,
// the least simulated candidate of that pool's search on the budget's first ranks grows, one
// stage at a time, onto free ranks while the simulation rewards it, and the result replaces the
// chosen plan where it simulates faster. The budgets only grow with the count, and each budget's
// growth is planned on its first ranks alone, as for that smaller cluster, so its grown plan is
// the same at every larger count: the argument above carries over.
//
// Which schedule: PlannerOptions::policies lists the schedules a plan may run under; each
// candidate is simulated under each (from the candidates the partitioner makes for that
// schedule), and the plan records the one of least step (Plan::schedule). With one policy, the
// plan is that policy's.
//
// Replicas allowed means replicas optional: with Options::replicate the one-device-per-stage
// candidates join the list (for every partitioner but manual), made at every power-of-two device
// budget up to the device count and at most PlannerOptions::plain_budget_limit, 8 unless set, and
// at every count up to plain_every_up_to, none unless set (the plain searches are not monotone in
// the budget, and this set of budgets only grows with the device count; past 8 the plain DP costs
// up to seconds and the replicated search covers those budgets). So allowing replicas never
// returns a plan that simulates slower than the plan without them on any of those budgets, as far
// as there are devices.
//
// Ties (equal simulated steps within a relative 1e-12) go to the candidate listed first: the
// policies in their order, for each the plain candidates then the replicated ones (a tie leaves
// devices idle rather than replicate for nothing), each in the order partition() prefers
// (CandidateSet's order). When nothing fits, partition()'s error is raised; when nothing fits
// with PlannerOptions::min_devices, a PlanningError says so.
#pragma once

#include <cstddef>
#include <limits>
#include <optional>
#include <vector>

#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "plan/fold.h"
#include "plan/plan.h"
#include "schedule/generate.h"
#include "sim/simulate.h"

namespace graphpipe::planner {

struct PlannerOptions {
  // The schedules the plan may run under (one: the schedule it will run under); the planner
  // keeps the candidate and schedule of least simulated step.
  std::vector<schedule::Policy> policies = {schedule::Policy::one_f_one_b};
  sim::SimOptions sim;  // as graphpipe.simulate will be called
  // Only candidates whose stages use at least this many devices together (0: all). For a user
  // who must occupy the devices, and to measure what using them would cost.
  int min_devices = 0;
  // With replicas allowed, the device budgets of the plans without replicas: every count up to
  // plain_every_up_to, then the powers of two up to the device count and at most
  // plain_budget_limit (0: no limit). The more budgets, the more plain searches may run (each
  // only where its floor is below the best step so far). graphpipe.plan's default replicate
  // asks for every count up to 16 (both 16).
  int plain_budget_limit = 8;
  int plain_every_up_to = 0;
  // Replicas granted by simulation (above, replica_refinement.h): at every power-of-two budget,
  // the least simulated candidate of each pool with replicas grows while the simulation rewards
  // it, and the chosen plan gives way to a faster result. Off unless asked: it searches the
  // smaller budgets again (MMT at paper size onto 64 V100s: 0.7 s more); graphpipe.plan's
  // default replicate asks for it.
  bool grow_replicas = false;
  // The most stages one device may hold (1: one stage per device). From 2 up, the search also
  // weighs the partitioner's plans for j x b devices folded onto b, in a V and looping, for every
  // j from 2 to it and every fold budget b (default_search.h); the fastest simulated plan wins.
  // Unset: 2 in the default search (the default partitioner, replicate unset), the one that
  // weighs every plan it can, and 1 for a partitioner asked for by name or with replicate given,
  // whose plans are that search's alone (what comparing partitioners, baselines and replica
  // choices measures); default_search.h, stages_per_rank_for.
  std::optional<int> stages_per_rank;
  // The fold budgets: the powers of two from 2 up to the device count and at most this (0: no
  // limit). Folded plans have no replicas, so on many devices the replicated plans beat them; the
  // limit bounds what folding costs there (a fold plans on twice the devices), and a set of
  // budgets that only grows with the device count keeps the planner never worse with more.
  int fold_budget_limit = 8;
  // The folds weighed (fold.h): both by default; one where the user names it (plan(fold=)).
  std::vector<plan::Fold> folds = plan::all_folds();
  // Only a plan that simulates below this step is wanted (infinity: any plan). The default search
  // passes the best step it has found to the searches it weighs beside it (baselines, folds),
  // whose plans it takes only where they simulate faster: their plain pools and micro-batch
  // sizes whose floor is above it are not listed, nor, without grow_replicas, their replicated
  // pools' sizes (growth starts from a pool's fastest candidate, which must stay listed), nor
  // growth on a smaller budget whose floor is above it; none of them could be taken, so the plan
  // taken is the same. Where nothing is listed, NoPlanBelow says so.
  double to_beat = std::numeric_limits<double>::infinity();
};

// What plan_by_simulation throws where PlannerOptions::to_beat leaves nothing to list: no plan
// of the search could be taken. A PlanningError, told apart from "nothing fits" so that a caller
// falling back to another search on that error does not (default_search.h).
class NoPlanBelow : public PlanningError {
 public:
  using PlanningError::PlanningError;
};

struct PlannerResult {
  plan::Plan plan;                   // predicted_iteration_seconds: its simulated step
  double closed_form = 0.0;          // the closed-form predicted step of the same plan
  std::size_t candidates = 0;        // candidates that fit, over every micro-batch size, in the pools listed
  std::size_t simulated = 0;         // (candidate, schedule) pairs simulated before the bound stopped the search
  std::size_t growth_simulated = 0;  // simulations of grow_replicas: growths, smaller budgets' searches
};

// The least simulated step's plan (see above). `options.every_candidate` is set here, and
// `options.zero_bubble` per policy (true for zb_graph).
PlannerResult plan_by_simulation(const graph::OpGraph& graph, const cost::Devices& devices,
                                 const partition::Options& options, const PlannerOptions& given = {});

// The distinct devices the plan occupies (a device holding several stages counts once): what
// PlannerOptions::min_devices bounds.
int plan_devices(const plan::Plan& plan);

// The step a plan's simulation gives under `policy` with the simulator's `options`: the figure
// plan_by_simulation ranks by.
double simulated_step(const plan::Plan& plan, const cost::Devices& devices, schedule::Policy policy,
                      const sim::SimOptions& options);

}  // namespace graphpipe::planner
