// default_search: how graphpipe.plan's `replicate` chooses the search, defined once for every
// front door (graphpipe.plan, graphpipe.wrap, the command line; the binding's
// plan_by_simulation(replicate=None)).
//
//   replicate false   plans without replicas, with the PlannerOptions as given;
//   replicate true    replicas allowed, with the PlannerOptions as given (the plain budgets: every
//                     power of two up to 8, planner.h);
//   not given         replicas allowed with the widened search (widened_search): the plans
//                     without replicas weighed on every count of devices up to 16 (not past
//                     it: on the paper models at 32-64 V100s no plain plan on 32 or 64 devices
//                     was ever the pick, and the plain DP onto 64 stages cost MMT 2 s of its
//                     planning; docs/results.md), and replicas granted by simulation,
//                     so that the planner's list for more devices holds every candidate of the
//                     list for fewer and the default never returns a slower plan for more devices
//                     (planner.h). Where the replicated planning refuses, the plan without
//                     replicas stands. A partitioner that places by the user (manual) runs as
//                     asked: without replicas beyond those its stage_devices give.
//
// Never worse than its baselines: with `replicate` not given, the default partitioner
// (partition::Options{}.partitioner, graphpipe) also weighs, as candidates, the plans of
// every baseline partitioner (Partitioner::is_baseline: sequential, piper) under their own
// default search, and plain data parallelism (one stage, via the manual partitioner) on the
// first 1, 2, 4, ... ranks up to the device count, except on those whose floor (every plan on
// them, replicated or not) is above the step to beat: none of their plans could be taken. A
// baseline's plan is returned where it simulates strictly faster (Plan::partitioner then names
// it), so the default plan's simulated step is never longer than any of theirs on the same
// devices; ties keep the graph plan. Every set weighed only grows with the device count, and
// each baseline's default search is itself never slower with more devices, so the default stays
// so too. It costs the baselines' searches (MMT at paper size onto 64 V100s: see
// docs/design.md §4.10).
//
// Several stages per device: with PlannerOptions::stages_per_rank k > 1 (unless set, 2 in the
// default search and 1 elsewhere: stages_per_rank_for), whatever `replicate` says, the
// partitioner's plans folded j stages per device (j = 2..k, in a V and looping, or the one
// PlannerOptions::folds names; folded_search.h) on the first b ranks, for every power of two b
// from 2 up to the device count and PlannerOptions::fold_budget_limit (8 unless set), are
// weighed too, and one wins where it simulates strictly faster. A budget is skipped where the
// floor of every plan without replicas on it is above the step chosen so far (MMT at paper size
// onto 64 V100s: all three, at no cost). The budgets only grow with the device count and a fold
// on the first b ranks is the same plan at every larger count, so folding keeps the search never
// worse with more devices.
//
// Each search weighed beside the partitioner's own is told the step to beat
// (PlannerOptions::to_beat), so it skips the micro-batch sizes and pools that cannot beat it.
//
// Before, the default was the faster of the plan without replicas on every device and the plan
// with them; the plain searches are not monotone in the device count, and DLRM at paper size
// got a plan 23% slower on 8 V100s than on 7.
#pragma once

#include <optional>

#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "planner/planner.h"

namespace graphpipe::planner {

// `search` with the default's budgets: plain_every_up_to 16 and plain_budget_limit 16 (every count
// up to 16, none past it), grow_replicas.
PlannerOptions widened_search(PlannerOptions search);

// The most stages per device the search weighs: search.stages_per_rank where set; unset, 2 in
// the default search (the default partitioner, replicate unset),
// which weighs every plan it can, and 1 for a partitioner asked for by name or with `replicate`
// given, whose plans are that search's own (what comparing partitioners and replica choices
// measures). Folding is the default there because the simulator prices folds and one-stage
// plans alike: on 2 real CPU ranks it read the V plans 3-15% fast and the one-stage plans
// 13-17% fast in the same runs (docs/results.md).
int stages_per_rank_for(const PlannerOptions& search, const partition::Options& options, std::optional<bool> replicate);

// The plan as `replicate` says (above); `options.replicate` is set here.
PlannerResult plan_with_replication(const graph::OpGraph& graph, const cost::Devices& devices,
                                    partition::Options options, const PlannerOptions& given,
                                    std::optional<bool> replicate);

}  // namespace graphpipe::planner
