#include "plan/rank_memory.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/error.h"

namespace graphpipe::plan {

double rank_memory_bytes(const Plan& plan, int rank) {
  if (rank < 0) throw PlanningError("rank " + std::to_string(rank) + " is negative");
  double bytes = 0.0;
  for (const auto& st : plan.stages) {
    if (std::find(st.devices.begin(), st.devices.end(), rank) != st.devices.end()) bytes += st.memory_bytes;
  }
  return bytes;
}

double rank_memory_headroom(const Plan& plan, int rank) {
  const double held = rank_memory_bytes(plan, rank);
  if (plan.memory_limit_bytes <= 0.0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, plan.memory_limit_bytes - held);
}

}  // namespace graphpipe::plan
