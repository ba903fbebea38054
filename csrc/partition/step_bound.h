// A lower bound on the predicted step (Evaluation::iteration_seconds, evaluate.h) of every plan
// of one problem, whatever its cut, depth, replica counts and placement. partition() uses it to
// skip a micro-batch size none of whose plans can beat a plan already found (partitioner.h), so
// that a search over micro-batch sizes costs about the sizes that can still win.
//
// Why it holds. Write op(v) for operator v's forward + backward on one replica, at the cheapest
// shard any replica count within the device budget gives it (ReplicaTable's levels; one device
// per stage: its plain time), and work(v) for the least device-seconds it can cost, min over
// those counts of (count x op(v) at that count's shard). A stage's time per micro-batch is at
// least the op() of each operator in it (its compute; transfers, dispatch and recomputation only
// add), and a stage of r replicas spends r devices that long, so:
//   - slowest stage >= max_v op(v), and >= sum_v work(v) / devices (the devices' busy time);
//   - depth x slowest >= the longest path of op() through the graph: a path's operators lie in
//     a chain of stages (stages are convex), at most depth of them, each no faster than the
//     path's operators in it.
// So the 1F1B step (M + depth - 1) x slowest + tail + fixed is at least the least over depths
// D = 1..devices of (M + D - 1) x max(the two floors above, longest path / D), plus fixed (the
// tail, >= 0, left out). Under the zero-bubble closed form, M x split slowest + (depth - 1)
// x fill + tail + fixed, each operator runs at least its forward and its weight-gradient half
// (backward_halves.h: one I did not run still computes its weights' gradient), which stands for
// op() in the first term; the path term is left out.
#pragma once

#include "partition/problem.h"

namespace graphpipe::partition {

// Seconds; never above the iteration_seconds of any assignment of `problem` on at most
// device_budget devices in all (max_stages without replication).
double step_lower_bound(const Problem& problem);

// A lower bound on the compute_bound (partitioner.h, RankedCandidate) of every plan of `problem`,
// whatever its cut, depth, replica counts and placement, and so on its simulated step under the
// schedule it was planned for: M x the slowest stage's floor above (each operator counted as
// step_lower_bound counts it: its forward and weight-gradient half under the zero-bubble
// schedule, else its whole compute, since every backward then runs whole) + the step's fixed
// cost. step_lower_bound's zero-bubble form.
double compute_lower_bound(const Problem& problem);

// A lower bound on the pipeline_bound (partitioner.h, RankedCandidate) of every plan of
// `problem`, whatever its cut, replica counts and placement: what a schedule whose backwards run
// whole cannot beat. Write w(u) for operator u's forward plus its backward (planned for the
// zero-bubble schedule: the lesser of its backward and its weight-gradient half), at its cheapest
// replica level. A plan's stage S holding v charges M x (its forward + its backward, whole or, for
// zero-bubble, the lesser of whole and split + dispatch) >= M x w(v) + the w of its other
// operators + M x dispatch (a split backward still computes every weight gradient),
// and the stages before S on a path of operators into v add at least their operators' forwards
// (the forward path into S) and backwards (the backward path back from S); so pipeline_bound is
// at least max over v of (the longest path of w into v, v left out, + M x w(v)) + M x dispatch
// + the step's fixed cost.
double pipeline_lower_bound(const Problem& problem);

// work(v) above, for operator `node` over the replica counts of at most `max_replicas`: the least
// of count x its time on that count's shard. Its time is its whole compute, or with `as_bound`
// what the bound counts (under the zero-bubble closed form, its forward and weight half). The
// series-parallel DP's device floor (graphpipe_dp.h) uses it too.
double operator_work(const Problem& problem, int node, int max_replicas, bool as_bound);
// op(v) above, for operator `node` over the replica counts of at most `max_replicas`: the least
// time of one replica, counted as operator_work counts it. The series-parallel DP's path floor
// (dp_solver.h) uses it too.
double operator_least_time(const Problem& problem, int node, int max_replicas, bool as_bound);

}  // namespace graphpipe::partition
