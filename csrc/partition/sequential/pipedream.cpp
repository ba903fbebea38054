#include "partition/sequential/pipedream.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "partition/group_stats.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/sequential.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kUnits = 64;

// A segment units[j..e): what its stage time and memory need, whatever its replica count.
struct Segment {
  double cross_bytes = 0.0, params = 0.0, static_bytes = 0.0, act_bytes = 0.0, input_bytes = 0.0;
  int crossings = 0;
};

// One link figure for every stage edge of a DP run, and the devices the run's plans may use.
struct LinkRun {
  double latency = 0.0, bandwidth = 0.0;  // bandwidth 0: no link (a single device)
  int devices = 1;
};

// The slowest link among ranks [0, count): the first node's when count is its size.
LinkRun slowest_among(const cost::Devices& devices, int count) {
  LinkRun run{0.0, 0.0, count};
  for (int a = 0; a < count; ++a) {
    for (int b = 0; b < count; ++b) {
      if (a == b) continue;
      run.latency = std::max(run.latency, devices.link_latency[a][b]);
      const double bw = devices.link_bandwidth[a][b];
      if (run.bandwidth == 0.0 || bw < run.bandwidth) run.bandwidth = bw;
    }
  }
  return run;
}

// A chain as (end unit, level) per stage, first stage first: small, so distinct chains are
// told apart cheaply.
using Cuts = std::vector<std::pair<int, int>>;

}  // namespace

std::vector<ChainPlan> pipedream_plans(const Problem& p) {
  const ReplicaTable& table = *p.replicas;
  const cost::Devices& devices = p.model->devices();
  const std::vector<int> bounds = chunk_bounds(p, kUnits);
  const int units = static_cast<int>(bounds.size()) - 1;
  const auto M = p.num_micro_batches;
  int usable = 0;  // levels whose replica counts fit the budget
  while (usable < table.num_levels() && table.replicas(usable) <= p.device_budget) ++usable;
  // Compute and forward of units [0, u) at each level.
  std::vector<std::vector<double>> prefix(usable, std::vector<double>(units + 1, 0.0)), forward = prefix;
  for (int l = 0; l < usable; ++l) {
    for (int u = 0; u < units; ++u) {
      double c = 0.0, f = 0.0;
      for (int i = bounds[u]; i < bounds[u + 1]; ++i) {
        const graph::NodeId v = p.order[i];
        c += l == 0 ? p.compute[v] : table.compute(l, v);
        f += l == 0 ? p.forward[v] : table.forward(l, v);
      }
      prefix[l][u + 1] = prefix[l][u] + c;
      forward[l][u + 1] = forward[l][u] + f;
    }
  }
  // seg[j][e - j - 1], grown until the segment's static memory alone overflows.
  std::vector<std::vector<Segment>> seg(units);
  {
    std::vector<int> stamps(p.num_nodes(), -1);
    for (int j = 0; j < units; ++j) {
      GroupStats g(p, stamps, j);
      for (int e = j + 1; e <= units; ++e) {
        for (int i = bounds[e - 1]; i < bounds[e]; ++i) g.add(p.order[i]);
        if (g.static_bytes > p.memory_limit) break;
        seg[j].push_back({g.cross_bytes, g.params, g.static_bytes, g.act_bytes, g.input_bytes, g.crossings});
      }
    }
  }
  std::vector<double> fraction(usable), sync_per(usable);
  for (int l = 0; l < usable; ++l) fraction[l] = table.row_fraction(l);
  // The largest in-flight count at which a stage of these bytes fits at level l, without (first)
  // and with recomputation (second); 0: not even one micro-batch.
  auto flight_limits = [&](const Segment& s, int l) {
    const double act = s.act_bytes * fraction[l], input = s.input_bytes * fraction[l];
    const double room = p.memory_limit - s.static_bytes;
    auto most = [](double space, double per) {
      if (space < 0.0) return 0.0;
      return per <= 0.0 ? 1e18 : std::floor(space / per);
    };
    const double plain = most(room, act);
    const double recomputed = most(room - act, input);
    return std::pair<double, double>{plain, std::max(plain, recomputed)};
  };

  // The node of rank 0 and its size: plans of at most that many devices stay on it.
  int first_node = 0;
  for (int d = 0; d < devices.count; ++d) first_node += devices.node_of(d) == devices.node_of(0) ? 1 : 0;
  std::vector<LinkRun> runs{slowest_among(devices, std::min(p.device_budget, first_node))};
  if (p.device_budget > first_node) {
    runs.push_back({devices.slowest_link_latency(), devices.slowest_link_bandwidth(), p.device_budget});
  }

  std::vector<Cuts> found;
  for (const LinkRun& run : runs) {
    const int cap = run.devices;
    std::vector<std::vector<double>> best(units + 1, std::vector<double>(cap + 1, kInf));
    std::vector<std::vector<std::pair<int, int>>> choice(units + 1, std::vector<std::pair<int, int>>(cap + 1, {-1, -1}));
    std::fill(best[units].begin(), best[units].end(), 0.0);
    for (int j = units - 1; j >= 0; --j) {
      double* here = best[j].data();
      for (int e = j + 1; e <= j + static_cast<int>(seg[j].size()); ++e) {
        const Segment& s = seg[j][e - j - 1];
        const double* after = best[e].data();
        for (int l = 0; l < usable; ++l) {
          const int r = table.replicas(l);
          if (r > cap) break;
          const double link = run.bandwidth > 0.0 ? s.crossings * run.latency + s.cross_bytes / run.bandwidth / r : 0.0;
          const double time = prefix[l][e] - prefix[l][j] + link +
                              (r > 1 ? sync_estimate(p, r, s.params) / static_cast<double>(M) : 0.0);
          const double again = forward[l][e] - forward[l][j];
          const auto [plain, recomputed] = flight_limits(s, l);
          if (recomputed < 1.0) continue;
          for (int m = r; m <= cap; ++m) {
            const double rest = e == units ? 0.0 : after[m - r];
            if (rest == kInf) continue;
            // A chain stage holds at most M micro-batches, and at most one per stage from it to
            // the end: the later stages have m - r devices, so at most m - r stages.
            const double flight = e == units ? 1.0 : std::min<double>(static_cast<double>(M), 1.0 + (m - r));
            double t = time;
            if (flight > plain) {
              if (flight > recomputed) continue;
              t += again;
            }
            const double value = std::max(t, rest);
            if (value < here[m]) {
              here[m] = value;
              choice[j][m] = {e, l};
            }
          }
        }
      }
      // At most m devices: never worse than with m - 1 (a tie keeps the fewer devices).
      for (int m = 1; m <= cap; ++m) {
        if (!(here[m] < here[m - 1])) {
          here[m] = here[m - 1];
          choice[j][m] = choice[j][m - 1];
        }
      }
    }
    for (int m = 1; m <= cap; ++m) {
      if (best[0][m] == kInf || choice[0][m].first < 0) continue;
      Cuts cuts;
      int j = 0, left = m;
      while (j < units) {
        const auto [e, l] = choice[j][left];
        cuts.push_back({e, l});
        left -= table.replicas(l);
        j = e;
      }
      if (std::find(found.begin(), found.end(), cuts) == found.end()) found.push_back(std::move(cuts));
    }
  }
  std::vector<ChainPlan> plans;
  for (const Cuts& cuts : found) {
    ChainPlan plan;
    plan.assignment.assign(p.num_nodes(), 0);
    int j = 0;
    for (std::size_t label = 0; label < cuts.size(); ++label) {
      const auto [e, l] = cuts[label];
      for (int i = bounds[j]; i < bounds[e]; ++i) plan.assignment[p.order[i]] = static_cast<int>(label);
      plan.replicas.push_back(table.replicas(l));
      j = e;
    }
    plans.push_back(std::move(plan));
  }
  return plans;
}

}  // namespace graphpipe::partition
