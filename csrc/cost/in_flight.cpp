#include "cost/in_flight.h"

#include <algorithm>

#include "common/error.h"

namespace graphpipe::cost {

std::vector<int> in_flight_1f1b(int num_stages, const StageEdges& edges, std::int64_t num_micro_batches) {
  std::vector<std::vector<int>> out(num_stages);
  for (auto [src, dst] : edges) {
    if (src < 0 || dst >= num_stages || src >= dst) {
      throw PlanningError("in_flight_1f1b: stage edge " + std::to_string(src) + " -> " + std::to_string(dst) +
                          " does not follow the topological order of " + std::to_string(num_stages) + " stages");
    }
    out[src].push_back(dst);
  }
  // Stages are in topological order, so one backward sweep computes longest paths to a sink.
  std::vector<int> to_sink(num_stages, 1);
  for (int s = num_stages - 1; s >= 0; --s) {
    for (int t : out[s]) to_sink[s] = std::max(to_sink[s], to_sink[t] + 1);
  }
  const std::int64_t cap = std::max<std::int64_t>(num_micro_batches, 1);
  for (int& v : to_sink) v = static_cast<int>(std::min<std::int64_t>(v, cap));
  return to_sink;
}

}  // namespace graphpipe::cost
