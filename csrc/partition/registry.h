// The registry of partitioners by name: the one list that partition() (partitioner.h),
// partitioner_names() and the "unknown partitioner" error read, so a name accepted in one place
// is accepted everywhere. Registered, in this order (the default first):
//   "graphpipe"   series_parallel_dp/graphpipe_portfolio.h
//   "metis"       metis/metis.h
//   "sequential"  sequential/sequential_partitioner.h
//   "manual"      manual/manual_partitioner.h
//   "piper"       piper/piper_partitioner.h (Piper's planner, a replicated baseline)
// Adding a partitioner: implement Partitioner (partitioner_interface.h) in its own folder and add
// one line to the table in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "partition/partitioner_interface.h"

namespace graphpipe::partition {

// A fresh instance of the partitioner registered as `name`. An unknown name is a PlanningError
// "unknown partitioner '<name>': choose <every registered name>".
std::unique_ptr<Partitioner> make_partitioner(const std::string& name);

// Partitioner::places_by_user() of the partitioner registered as `name` (the same error for an
// unknown one): the trait the planner and graphpipe.plan ask instead of comparing names.
bool places_by_user(const std::string& name);

// The registered partitioners whose Partitioner::is_baseline() holds, in the registry's order:
// those the default search weighs beside a graph partitioner (planner/default_search.h).
std::vector<std::string> baseline_names();

// partitioner_names() (declared in partitioner.h, where the bindings find it) lists the
// registered names in the order above.

}  // namespace graphpipe::partition
