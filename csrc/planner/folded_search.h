// folded_search: plans with k stages per device, made by folding a plan for k times the devices.
//
// A chain of kD stages on D devices, each device holding k, fills the pipeline's warm-up and
// drain with its other stages' work: placed in a V (k = 2: device d holds stages d and
// 2D - 1 - d, as ZB-V places them; for more, the chain zigzags over the devices) or looping (d,
// d + D, ...: Megatron's interleaving). The planner gets such plans by asking the partitioner
// for a plan on kD virtual devices, each a k-th of a real one (its memory divided by k, its
// links the real devices' links), and folding the virtual devices onto the real ones: virtual
// device v goes to real device fold(v). The folded cut is then planned as
// a manual plan on the real devices (each stage's operators by name, its device by the fold),
// so the evaluation prices every shared device by its stages' summed times and memory
// (partition/evaluate.h), the planner chooses its micro-batches, and the simulator ranks it
// under the same schedules as every other candidate. No replicas: a shared device's stages
// each run on it alone (plan/rank_sharing.h).
#pragma once

#include <optional>

#include "cost/devices.h"
#include "graph/op_graph.h"
#include "partition/options.h"
#include "plan/fold.h"
#include "planner/planner.h"

namespace graphpipe::planner {

// The real device (of `devices` real ones) that virtual device `v` (of k x devices) folds onto.
int folded_device(plan::Fold fold, int v, int devices);

// k x devices.count virtual devices, each a k-th of the real device it folds onto: the same
// compute figures, 1/k of its memory, the links (and nodes) of the real devices they fold onto.
cost::Devices virtual_devices(const cost::Devices& devices, plan::Fold fold, int k);

// The partitioner's plan (options.partitioner, without replicas) for k x devices virtual
// devices, folded onto `devices` and planned again there as described above; nullopt where no
// folded plan exists (no plan on the virtual devices, or no stage sharing a device after the
// fold). Plan::partitioner names the partitioner and the fold.
std::optional<PlannerResult> folded_plan(const graph::OpGraph& graph, const cost::Devices& devices,
                                         partition::Options options, const PlannerOptions& search, plan::Fold fold,
                                         int k);

}  // namespace graphpipe::planner
