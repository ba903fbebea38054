// Looking up a simulated task by its name (sim::task_name: "F0 s1", "AR s0", "XR r1", ...), for
// the simulator's tests.
#pragma once

#include <stdexcept>
#include <string>

#include "sim/simulate.h"

namespace graphpipe::testing {

// The first task named `name`; std::runtime_error when there is none.
inline const sim::Task& find_task(const sim::SimResult& result, const std::string& name) {
  for (const auto& t : result.tasks) {
    if (sim::task_name(t) == name) return t;
  }
  throw std::runtime_error("no task " + name);
}

}  // namespace graphpipe::testing
