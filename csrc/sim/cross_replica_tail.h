// cross_replica_tail: the end of a fault-tolerant step (cost/cross_replica.h) added to one
// replayed pipeline step (simulate.cpp), as graphpipe.fault_tolerant runs it.
//
// The replay runs the optimizer steps in no time when SimOptions::cross_replica is on: in a
// fault-tolerant step no rank steps its optimizer before the replicas agree the step lands, so
// an optimizer step must not delay anything of the pipeline step. Then, on every rank that runs
// a program (the leads; a replica's figures are its lead's):
//
//   cross_replica  from the end of the pipeline step (the latest end of any rank's last task, a
//                  replicated stage's sum included: every rank leaves the step with its closing
//                  loss sum over the pipeline's ranks), cost::cross_replica_seconds of the
//                  parameter bytes of every stage the rank runs: its average with the same rank
//                  of the other replicas;
//   optimizer      every optimizer step of the rank, one after the other at its duration
//                  (`optimizer_seconds`, per stage), from the barrier: the latest cross_replica
//                  end plus CrossReplica::coordination_seconds (the commit vote and the
//                  finiteness check wait for every rank of the replica).
//
// Tasks' causes follow: a cross_replica task's is the pipeline step's last task, the first optimizer's
// the latest cross_replica task, and a task that followed an optimizer step now follows what
// that step followed (so the critical path has no cycle). O(T) for T tasks.
#pragma once

#include <vector>

#include "cost/cross_replica.h"
#include "cost/devices.h"
#include "plan/plan.h"
#include "schedule/schedule.h"
#include "sim/simulate.h"

namespace graphpipe::sim {

void add_cross_replica_tail(std::vector<Task>& tasks, const plan::Plan& plan, const schedule::Schedule& leads,
                            const cost::Devices& devices, const cost::CrossReplica& cross_replica,
                            const std::vector<double>& optimizer_seconds);

}  // namespace graphpipe::sim
