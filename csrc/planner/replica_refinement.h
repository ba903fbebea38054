// Replica refinement: more replicas for a chosen candidate where the simulator says they pay.
//
// Why: the partitioners grant replicas by the closed form (replica_allocation.h, the DPs'
// replica_stage_time), which charges a stage every transfer it takes part in one after another,
// and takes a step to be its slowest stage's time repeated. The simulator moves the edges of
// different stages at once and follows the schedule's fill and drain. Where the two disagree on
// which stage bounds the step, the closed form's allocation can stop with devices left whose
// replicas the simulation would reward: CANDLE-Uno at paper size on 32 V100s at 256 samples per
// GPU (2 micro-batches) got 26 devices, as the closed form's slowest stage (the top tower,
// 7 inbound activations) could not get its next count; the last stage's replicas on the 6 left
// shorten the simulated step by 6% (docs/design.md §4.10, "Replicas granted by simulation").
//
// How: greedily. Each round simulates every one-step growth (CandidateSet::replica_growths: one
// stage at its next replica count on free ranks, its own nodes' first, the other stages where
// they are, within the device budget) and keeps the fastest, if it is faster than the plan so far by more than a
// relative 1e-6 and still fits in memory (a replica holds the stage's whole static memory, and a smaller shard of its
// activations, so it does); it stops when no growth is. At most (devices left) rounds of at most (stages) simulations.
// Candidates without replicas allowed (plain pools) or with the user's stage devices are left as they are.
#pragma once

#include <cstddef>

#include "cost/devices.h"
#include "partition/partitioner.h"
#include "plan/plan.h"
#include "schedule/generate.h"
#include "sim/simulate.h"

namespace graphpipe::planner {

struct Refinement {
  plan::Plan plan;            // predicted_iteration_seconds: the closed form
  double step = 0.0;          // its simulated step
  int rounds = 0;             // growths kept (0: the candidate as listed)
  std::size_t simulated = 0;  // growths simulated
};

// candidates()[index] of `set`, whose simulated step under `policy` is `step`, with replicas
// grown while the simulation rewards them (above).
Refinement refine_replicas(const partition::CandidateSet& set, std::size_t index, double step,
                           const cost::Devices& devices, schedule::Policy policy, const sim::SimOptions& options);

}  // namespace graphpipe::planner
