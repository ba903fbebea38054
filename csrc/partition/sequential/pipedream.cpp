#include "partition/sequential/pipedream.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "partition/evaluate.h"
#include "partition/replica_allocation.h"
#include "partition/sequential/chain_units.h"

namespace graphpipe::partition {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kUnits = 64;

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

// One DP run's tables: best[j][m] = A(j, m) and the (end unit, level) of its first stage.
struct Tables {
  std::vector<std::vector<double>> best;
  std::vector<std::vector<std::pair<int, int>>> choice;
};

// The search pipedream_plans runs: over the chunked order's prefix sums and segment figures
// (ChainUnits), one DP per link figure (LinkRun), and the distinct chains they find.
class PipeDreamSearch {
 public:
  PipeDreamSearch(const Problem& p, bool relays)
      : p_(p), table_(*p.replicas), chain_(p, kUnits, relays), units_(chain_.units()) {}

  std::vector<ChainPlan> run() {
    for (const LinkRun& run : link_runs()) collect(solve(run), run.devices);
    return plans();
  }

 private:
  // The largest in-flight count at which a stage of these bytes fits at level l, without (first)
  // and with recomputation (second); 0: not even one micro-batch.
  std::pair<double, double> flight_limits(const UnitSegment& s, int l) const {
    const double act = s.act_bytes * chain_.row_fraction(l), input = s.input_bytes * chain_.row_fraction(l);
    const double room = p_.memory_limit - s.static_bytes;
    auto most = [](double space, double per) {
      if (space < 0.0) return 0.0;
      return per <= 0.0 ? 1e18 : std::floor(space / per);
    };
    const double plain = most(room, act);
    const double recomputed = most(room - act, input);
    return {plain, std::max(plain, recomputed)};
  }

  // The node of rank 0 and its size: plans of at most that many devices stay on it.
  std::vector<LinkRun> link_runs() const {
    const cost::Devices& devices = p_.model->devices();
    int first_node = 0;
    for (int d = 0; d < devices.count; ++d) first_node += devices.node_of(d) == devices.node_of(0) ? 1 : 0;
    std::vector<LinkRun> runs{slowest_among(devices, std::min(p_.device_budget, first_node))};
    if (p_.device_budget > first_node) {
      runs.push_back({devices.slowest_link_latency(), devices.slowest_link_bandwidth(), p_.device_budget});
    }
    return runs;
  }

  // A(j, m) for every j and m <= run.devices, from the back.
  Tables solve(const LinkRun& run) const {
    const int cap = run.devices;
    Tables t{
        std::vector<std::vector<double>>(units_ + 1, std::vector<double>(cap + 1, kInf)),
        std::vector<std::vector<std::pair<int, int>>>(units_ + 1, std::vector<std::pair<int, int>>(cap + 1, {-1, -1}))};
    std::fill(t.best[units_].begin(), t.best[units_].end(), 0.0);
    for (int j = units_ - 1; j >= 0; --j) {
      for (int e = j + 1; e <= chain_.reach(j); ++e) first_segment(t, run, j, e);
      // At most m devices: never worse than with m - 1 (a tie keeps the fewer devices).
      double* here = t.best[j].data();
      for (int m = 1; m <= cap; ++m) {
        if (!(here[m] < here[m - 1])) {
          here[m] = here[m - 1];
          t.choice[j][m] = t.choice[j][m - 1];
        }
      }
    }
    return t;
  }

  // Relaxes A(j, m) over the chains whose first stage is segment j..e-1, at every level.
  void first_segment(Tables& t, const LinkRun& run, int j, int e) const {
    const int cap = run.devices;
    const auto M = p_.num_micro_batches;
    const UnitSegment& s = chain_.segment(j, e);
    double* here = t.best[j].data();
    const double* after = t.best[e].data();
    for (int l = 0; l < chain_.usable_levels(); ++l) {
      const int r = table_.replicas(l);
      if (r > cap) break;
      const double link = run.bandwidth > 0.0 ? s.crossings * run.latency + s.cross_bytes / run.bandwidth / r : 0.0;
      const double time =
          chain_.compute(l, j, e) + link + (r > 1 ? sync_estimate(p_, r, s.params) / static_cast<double>(M) : 0.0);
      const double again = chain_.forward(l, j, e);
      const auto [plain, recomputed] = flight_limits(s, l);
      if (recomputed < 1.0) continue;
      for (int m = r; m <= cap; ++m) {
        const double rest = e == units_ ? 0.0 : after[m - r];
        if (rest == kInf) continue;
        // A chain stage holds at most M micro-batches, and at most one per stage from it to
        // the end: the later stages have m - r devices, so at most m - r stages.
        const double flight = e == units_ ? 1.0 : std::min<double>(static_cast<double>(M), 1.0 + (m - r));
        double stage = time;
        if (flight > plain) {
          if (flight > recomputed) continue;
          stage += again;
        }
        const double value = std::max(stage, rest);
        if (value < here[m]) {
          here[m] = value;
          t.choice[j][m] = {e, l};
        }
      }
    }
  }

  // Every chain A(0, m), m = 1..cap, not found before.
  void collect(const Tables& t, int cap) {
    for (int m = 1; m <= cap; ++m) {
      if (t.best[0][m] == kInf || t.choice[0][m].first < 0) continue;
      Cuts cuts;
      int j = 0, left = m;
      while (j < units_) {
        const auto [e, l] = t.choice[j][left];
        cuts.push_back({e, l});
        left -= table_.replicas(l);
        j = e;
      }
      if (std::find(found_.begin(), found_.end(), cuts) == found_.end()) found_.push_back(std::move(cuts));
    }
  }

  std::vector<ChainPlan> plans() const {
    std::vector<ChainPlan> plans;
    for (const Cuts& cuts : found_) {
      ChainPlan plan;
      plan.assignment.assign(p_.num_nodes(), 0);
      int j = 0;
      for (std::size_t label = 0; label < cuts.size(); ++label) {
        const auto [e, l] = cuts[label];
        for (int i = chain_.bound(j); i < chain_.bound(e); ++i) plan.assignment[p_.order[i]] = static_cast<int>(label);
        plan.replicas.push_back(table_.replicas(l));
        j = e;
      }
      plans.push_back(std::move(plan));
    }
    return plans;
  }

  const Problem& p_;
  const ReplicaTable& table_;
  const ChainUnits chain_;  // the chunked order's prefix sums and segment figures
  const int units_;
  std::vector<Cuts> found_;
};

}  // namespace

std::vector<ChainPlan> pipedream_chains(const Problem& p, bool relays) { return PipeDreamSearch(p, relays).run(); }

std::vector<std::vector<int>> placed_on_first_ranks(const Problem& problem, const ChainPlan& chain) {
  Problem on_first = problem;
  on_first.placement_ranks = std::accumulate(chain.replicas.begin(), chain.replicas.end(), 0);
  const Evaluation ev = evaluate(on_first, chain.assignment, chain.replicas);
  std::vector<std::vector<int>> devices(chain.replicas.size());
  for (std::size_t v = 0; v < chain.assignment.size(); ++v) {
    devices[chain.assignment[v]] = ev.stages[ev.stage_of[v]].devices;
  }
  return devices;
}

std::vector<ChainPlan> pipedream_plans(const Problem& p) {
  std::vector<ChainPlan> plans = pipedream_chains(p, true);
  if (!p.chain) return plans;
  // PipeDream's own pricing, blind to relays, joins: its chains that still fit (the evaluation
  // says) can be faster where transfers overlap compute, as the simulator lets them.
  for (ChainPlan& blind : pipedream_chains(p, false)) {
    const bool seen = std::any_of(plans.begin(), plans.end(), [&](const ChainPlan& c) {
      return c.assignment == blind.assignment && c.replicas == blind.replicas;
    });
    if (!seen) plans.push_back(std::move(blind));
  }
  return plans;
}

}  // namespace graphpipe::partition
