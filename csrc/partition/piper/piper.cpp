#include "partition/piper/piper.h"

#include <algorithm>
#include <limits>

#include "partition/recompute.h"
#include "partition/replica_allocation.h"

namespace graphpipe::partition {

namespace {

using piper::Set;

constexpr double kInf = std::numeric_limits<double>::infinity();

// A stage J \ I whose weights fit: its figures at one device (GroupStats' rules: a transfer per
// operator edge with one end inside, received tensors stashed with the activations).
struct PairStage {
  int from = 0, to = 0;  // down-set indices of I and J
  double transfer = 0.0, cross_bytes = 0.0, input_bytes = 0.0, static_bytes = 0.0, act_bytes = 0.0, params = 0.0;
};

// The search piper_plans runs over one problem.
class PiperSearch {
 public:
  PiperSearch(const Problem& p, const piper::LayerGraph& lg)
      : p_(p), lg_(lg), d_(static_cast<int>(lg.downsets.size())), all_(d_ - 1) {
    levels_ = 1;
    budget_ = p.max_stages;
    if (p.replicated()) {
      budget_ = p.device_budget;
      levels_ = 0;
      while (levels_ < p.replicas->num_levels() && p.replicas->replicas(levels_) <= budget_) ++levels_;
    }
  }

  std::vector<ChainPlan> run() {
    prefix_sums();
    pairs();
    solve();
    return plans();
  }

 private:
  int replicas(int level) const { return p_.replicated() ? p_.replicas->replicas(level) : 1; }
  double fraction(int level) const { return p_.replicated() ? p_.replicas->row_fraction(level) : 1.0; }
  double compute(int level, graph::NodeId v) const {
    return level == 0 ? p_.compute[v] : p_.replicas->compute(level, v);
  }
  double forward(int level, graph::NodeId v) const {
    return level == 0 ? p_.forward[v] : p_.replicas->forward(level, v);
  }
  std::size_t at(int level, int i) const { return static_cast<std::size_t>(level) * d_ + i; }

  void prefix_sums();
  void pairs();
  void solve();
  void relax(const PairStage& s);
  std::vector<ChainPlan> plans() const;

  const Problem& p_;
  const piper::LayerGraph& lg_;
  const int d_, all_;
  int levels_ = 1, budget_ = 1;
  // Per down-set, the sums of the additive figures over its operators ([level][i] for times).
  std::vector<double> compute_, forward_, static_, act_, params_;
  std::vector<PairStage> pairs_;
  // best[i][m] = T(I_i, m) and the (pair, level) of its first stage.
  std::vector<std::vector<double>> best_;
  std::vector<std::vector<std::pair<int, int>>> choice_;
  // first_finite_[i]: the least m with T(I_i, m) finite (budget + 1 where there is none).
  std::vector<int> first_finite_;
  // While the pairs from I are relaxed: the least T(I, m') over m' <= m found so far. It never
  // grows with m, and T(I, m) ends as the least over m' <= m (ties to the fewer devices), so a
  // stage of time t >= prefix_[m] cannot change T(I, m) or any T(I, m + 1..): relax stops there.
  std::vector<double> prefix_;
};

void PiperSearch::prefix_sums() {
  const std::size_t units = lg_.units.size();
  std::vector<double> unit_static(units), unit_act(units), unit_params(units);
  std::vector<std::vector<double>> unit_compute(levels_, std::vector<double>(units)), unit_forward = unit_compute;
  for (std::size_t u = 0; u < units; ++u) {
    for (graph::NodeId v : lg_.units[u]) {
      unit_static[u] += p_.static_bytes[v];
      unit_act[u] += p_.act_bytes[v];
      unit_params[u] += p_.param_bytes[v];
      for (int l = 0; l < levels_; ++l) {
        unit_compute[l][u] += compute(l, v);
        unit_forward[l][u] += forward(l, v);
      }
    }
  }
  compute_.assign(static_cast<std::size_t>(levels_) * d_, 0.0);
  forward_ = compute_;
  static_.assign(d_, 0.0);
  act_ = params_ = static_;
  for (int i = 0; i < d_; ++i) {
    for (Set s = lg_.downsets[i]; s; s &= s - 1) {
      const int u = __builtin_ctzll(s);
      static_[i] += unit_static[u];
      act_[i] += unit_act[u];
      params_[i] += unit_params[u];
      for (int l = 0; l < levels_; ++l) {
        compute_[at(l, i)] += unit_compute[l][u];
        forward_[at(l, i)] += unit_forward[l][u];
      }
    }
  }
}

// Every nested pair I < J whose stage's weights fit the limit, with its crossing figures.
void PiperSearch::pairs() {
  const graph::OpGraph& g = *p_.graph;
  // The units' bits rather than their indices: membership is a mask test. (The index form,
  // (stage >> index) & 1, counted wrong crossings in this loop as built by GCC 12 at -O3 and right
  // ones with a print added in the loop; valgrind found no memory error. The brute-force test,
  // tests/cpp/test_partition_piper.cpp, caught it.)
  struct UnitEdge {
    Set src, dst;
    double seconds, bytes;
  };
  std::vector<UnitEdge> edges;
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const int a = lg_.unit_of[g.edge(static_cast<graph::EdgeId>(e)).src];
    const int b = lg_.unit_of[g.edge(static_cast<graph::EdgeId>(e)).dst];
    if (a != b) edges.push_back({Set{1} << a, Set{1} << b, p_.edge_seconds[e], p_.edge_bytes[e]});
  }
  for (int i = 0; i < d_; ++i) {
    for (int j = i + 1; j < d_; ++j) {
      const Set I = lg_.downsets[i], J = lg_.downsets[j];
      if (I & ~J) continue;
      PairStage s{i, j, 0.0, 0.0, 0.0, static_[j] - static_[i], act_[j] - act_[i], params_[j] - params_[i]};
      if (s.static_bytes > p_.memory_limit) continue;
      const Set stage = J & ~I;
      for (const UnitEdge& e : edges) {
        const bool in_src = (stage & e.src) != 0;
        const bool in_dst = (stage & e.dst) != 0;
        if (in_src == in_dst) continue;
        s.transfer += e.seconds;
        s.cross_bytes += e.bytes;
        if (in_dst) s.input_bytes += e.bytes;
      }
      s.act_bytes += s.input_bytes;
      pairs_.push_back(s);
    }
  }
}

void PiperSearch::solve() {
  best_.assign(d_, std::vector<double>(budget_ + 1, kInf));
  choice_.assign(d_, std::vector<std::pair<int, int>>(budget_ + 1, {-1, -1}));
  std::fill(best_[all_].begin(), best_[all_].end(), 0.0);
  first_finite_.assign(d_, budget_ + 1);
  first_finite_[all_] = 0;
  // A stage's rest (J) is a strict superset of I, later in breadth-first order: from the back,
  // T(J, .) is final before any pair (I, J) is relaxed. Pairs are listed by I ascending.
  std::size_t k = pairs_.size();
  for (int i = d_ - 2; i >= 0; --i) {
    std::size_t first = k;
    while (first > 0 && pairs_[first - 1].from == i) --first;
    prefix_.assign(budget_ + 1, kInf);
    for (std::size_t q = first; q < k; ++q) relax(pairs_[q]);
    k = first;
    double* here = best_[i].data();
    for (int m = 1; m <= budget_; ++m) {
      if (!(here[m] < here[m - 1])) {
        here[m] = here[m - 1];
        choice_[i][m] = choice_[i][m - 1];
      }
    }
    first_finite_[i] =
        static_cast<int>(std::find_if(here, here + budget_ + 1, [](double t) { return t < kInf; }) - here);
  }
}

// T(I, m) over the chains whose first stage is J \ I, at every level.
void PiperSearch::relax(const PairStage& s) {
  const auto M = p_.num_micro_batches;
  double* here = best_[s.from].data();
  const double* after = best_[s.to].data();
  const int pair = static_cast<int>(&s - pairs_.data());
  for (int l = 0; l < levels_; ++l) {
    const int r = replicas(l);
    if (r > budget_) break;
    const double compute = compute_[at(l, s.to)] - compute_[at(l, s.from)];
    const int least = r + first_finite_[s.to];
    // A replica's time is at least its compute (replica_stage_time adds transfers and sync): where
    // that cannot improve T(I, least), the loop below stops at once, and the time is not priced.
    if (least > budget_ || !(compute < prefix_[least])) continue;
    const double time = replica_stage_time(p_, l, compute, s.transfer, s.cross_bytes, s.params);
    const double again = forward_[at(l, s.to)] - forward_[at(l, s.from)];
    const double act = s.act_bytes * fraction(l), input = s.input_bytes * fraction(l);
    // T(J, .) is final and never grows with the devices: its infeasible entries are a prefix.
    for (int m = least; m <= budget_; ++m) {
      const double rest = after[m - r];
      // The stage alone is at least `time`: where that cannot improve T(I, m) nor, through it,
      // T(I, m + 1..) (prefix_), neither can this pair at this level at m or more devices.
      if (!(time < prefix_[m])) break;
      // At most M micro-batches, and at most one per stage from it to the end (each later stage
      // takes a device at least).
      const int flight = s.to == all_ ? 1 : static_cast<int>(std::min<std::int64_t>(M, 1 + (m - r)));
      const StageMemory mem = stage_memory(s.static_bytes, act, input, flight, p_.memory_limit);
      if (mem.bytes > p_.memory_limit) break;  // more devices only allow more in flight
      const double value = std::max(time + mem.extra_seconds(again), rest);
      if (value < here[m]) {
        here[m] = value;
        choice_[s.from][m] = {pair, l};
        for (int n = m; n <= budget_ && value < prefix_[n]; ++n) prefix_[n] = value;
      }
    }
  }
}

std::vector<ChainPlan> PiperSearch::plans() const {
  std::vector<ChainPlan> found;
  for (int m = 1; m <= budget_; ++m) {
    if (best_[0][m] == kInf || choice_[0][m].first < 0) continue;
    ChainPlan plan;
    plan.assignment.assign(p_.num_nodes(), -1);
    int i = 0, left = m, label = 0;
    while (i != all_) {
      const auto [pair, l] = choice_[i][left];
      const PairStage& s = pairs_[pair];
      for (Set stage = lg_.downsets[s.to] & ~lg_.downsets[s.from]; stage; stage &= stage - 1) {
        for (graph::NodeId v : lg_.units[__builtin_ctzll(stage)]) plan.assignment[v] = label;
      }
      plan.replicas.push_back(replicas(l));
      left -= replicas(l);
      i = s.to;
      ++label;
    }
    const bool seen = std::any_of(found.begin(), found.end(), [&](const ChainPlan& c) {
      return c.assignment == plan.assignment && c.replicas == plan.replicas;
    });
    if (!seen) found.push_back(std::move(plan));
  }
  return found;
}

}  // namespace

std::vector<ChainPlan> piper_plans(const Problem& p, const piper::LayerGraph& layers) {
  return PiperSearch(p, layers).run();
}

}  // namespace graphpipe::partition
