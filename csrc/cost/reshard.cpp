#include "cost/reshard.h"

#include <algorithm>
#include <string>

#include "common/error.h"

namespace graphpipe::cost {

std::pair<std::int64_t, std::int64_t> replica_row_range(std::int64_t rows, int replicas, int index) {
  if (replicas < 1 || index < 0 || index >= replicas || rows < replicas) {
    throw PlanningError("replica " + std::to_string(index) + " of " + std::to_string(replicas) +
                        " cannot own rows of a micro-batch of " + std::to_string(rows) +
                        " rows (each replica needs at least one row)");
  }
  const std::int64_t base = rows / replicas, extra = rows % replicas;
  const std::int64_t begin = index * base + std::min<std::int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

double reshard_seconds(const Devices& devices, const std::vector<int>& senders, const std::vector<int>& receivers,
                       std::int64_t rows, double bytes, int tensors) {
  if (senders.empty() || receivers.empty()) throw PlanningError("a stage edge needs ranks at both ends");
  auto link = [&](int a, int b, double share) {
    const double extra = a == b ? 0.0 : devices.extra_tensor_cost(a, b);
    return devices.transfer_seconds(a, b, share) + (tensors - 1) * extra;
  };
  if (senders.size() == 1 && receivers.size() == 1) return link(senders[0], receivers[0], bytes);
  const int ds = static_cast<int>(senders.size()), dr = static_cast<int>(receivers.size());
  std::vector<double> send_busy(ds, 0.0), recv_busy(dr, 0.0);
  // Both splits are ascending row ranges: walk them together, each overlapping pair once.
  int i = 0, j = 0;
  auto a = replica_row_range(rows, ds, 0), b = replica_row_range(rows, dr, 0);
  while (i < ds && j < dr) {
    const std::int64_t shared = std::min(a.second, b.second) - std::max(a.first, b.first);
    if (shared > 0) {
      const double seconds =
          link(senders[i], receivers[j], bytes * static_cast<double>(shared) / static_cast<double>(rows));
      send_busy[i] += seconds;
      recv_busy[j] += seconds;
    }
    if (a.second <= b.second) {
      if (++i < ds) a = replica_row_range(rows, ds, i);
    } else {
      if (++j < dr) b = replica_row_range(rows, dr, j);
    }
  }
  return std::max(*std::max_element(send_busy.begin(), send_busy.end()),
                  *std::max_element(recv_busy.begin(), recv_busy.end()));
}

}  // namespace graphpipe::cost
