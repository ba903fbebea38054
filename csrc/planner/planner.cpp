#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "cost/cross_replica.h"
#include "partition/partitioner.h"
#include "partition/plan_build.h"
#include "partition/registry.h"
#include "plan/rank_sharing.h"
#include "planner/replica_refinement.h"
#include "schedule/schedule.h"

namespace graphpipe::planner {

using partition::CandidatePlan;

namespace {

// The candidates of one partitioner run: those it made for one schedule, with or without
// replicas. `set` is null where the pool was not listed: its floor ruled it out.
struct Pool {
  partition::Options options;
  schedule::Policy policy;
  bool plain = false;  // one device per stage, beside a replicated pool
  std::unique_ptr<partition::CandidateSet> set;
};

// One candidate of one pool: what the branch and bound orders.
struct Entry {
  std::size_t pool = 0;
  std::size_t index = 0;
  double bound = 0.0;
};

// How many of a replicated pool's micro-batch sizes (those of least floor) are listed before
// the rest (plan_by_simulation): about half of the candidate sizes (powers of two up to a few
// hundred samples), so that the first turn usually holds the size that wins. MMT at paper size
// onto 64 V100s (nine sizes) planned in 1.76 s with 4 and 1.79 s with 6, the rest splitting
// evenly over two workers, against 2.0 s with 5 (docs/results.md).
constexpr std::size_t kFirstSizes = 4;

int devices_used(const CandidatePlan& c) {
  const int k = c.assignment.empty() ? 0 : *std::max_element(c.assignment.begin(), c.assignment.end()) + 1;
  return c.replicas.empty() ? k : std::accumulate(c.replicas.begin(), c.replicas.end(), 0);
}

// The device budgets at which the plans without replicas are made: every count up to
// PlannerOptions::plain_every_up_to, then the powers of two up to the device count and at most
// PlannerOptions::plain_budget_limit (0: no limit); never more than max_stages. Not every count:
// the partitioners' plain searches are not monotone in the budget (DLRM at paper size: 10.3 ms
// on 7 V100s, 12.7 ms on 8), and a list that holds, for n devices, the plain plans of each budget
// of such a set only grows with n, which keeps the planner never worse with more devices. The
// limits bound planning time where the replicated search covers the large budgets with its
// replicas: the plain series-parallel DP onto 64 stages takes about 2.4 s on MMT at paper size,
// onto 8 stages 0.03 s.
std::vector<int> plain_budgets(int count, int max_stages, const PlannerOptions& planner) {
  int top = max_stages > 0 ? std::min(count, max_stages) : count;
  std::vector<int> budgets;
  for (int b = 1; b <= std::min(top, planner.plain_every_up_to); ++b) budgets.push_back(b);
  if (planner.plain_budget_limit > 0) top = std::min(top, planner.plain_budget_limit);
  for (int b = 1; b <= top; b *= 2) {
    if (b > planner.plain_every_up_to) budgets.push_back(b);
  }
  return budgets;
}

// The pools the planner draws from, in listing order, none listed yet: per policy, the
// partitioner's candidates for it, and where replicas are allowed, its one-device-per-stage
// candidates too, at each budget of plain_budgets.
std::vector<Pool> pool_options(const cost::Devices& devices, const partition::Options& options,
                               const PlannerOptions& planner) {
  const bool plain_too =
      options.replicate && !partition::places_by_user(options.partitioner) && options.stage_devices.empty();
  std::vector<Pool> pools;
  for (schedule::Policy policy : planner.policies) {
    partition::Options wide = options;
    wide.every_candidate = true;
    wide.zero_bubble = schedule::traits(policy).splits_backward;
    wide.bucket_bytes = planner.sim.bucket_bytes;  // the closed form prices the buckets simulated
    if (plain_too) {  // first, so that a tie leaves devices idle rather than replicate for nothing
      partition::Options plain = wide;
      plain.replicate = false;
      for (int budget : plain_budgets(devices.count, options.max_stages, planner)) {
        plain.max_stages = budget;
        pools.push_back({plain, policy, true, nullptr});
      }
    }
    pools.push_back({wide, policy, false, nullptr});
  }
  return pools;
}

// Lists a plain pool, at the micro-batch sizes where a candidate could be ordered below
// `listed_below` (the best step simulated so far: CandidateSet); where it can make no plan (more
// stages than operators, say), it stays empty: the replicated pool beside it answers.
void list_plain(const graph::OpGraph& graph, const cost::Devices& devices, Pool& pool, double listed_below) {
  try {
    pool.set = std::make_unique<partition::CandidateSet>(graph, devices, pool.options, listed_below);
  } catch (const PlanningError& e) {
    log::debug("planner: no plan without replicas on " + std::to_string(pool.options.max_stages) +
               " devices: " + e.what());
  }
}

// The branch and bound over the listed pools' candidates: simulations in order of the bound (a
// stable sort keeps the listing order among equal bounds), stopping at the first bound not below
// the best step so far. A split backward's weight halves may run after everything else: under
// zb_graph only the compute bound holds. Steps are kept in `steps` by (pool, index), so that a
// second search over more pools simulates each candidate once.
class Ranking {
 public:
  Ranking(const std::vector<Pool>& pools, const cost::Devices& devices, const PlannerOptions& planner)
      : pools_(pools), devices_(devices), planner_(planner) {}

  // The least simulated step over the listed pools' candidates that use at least min_devices,
  // ties to the one listed first; nullopt when there is none.
  std::optional<Entry> search() { return search(planner_.min_devices); }
  // The same over one pool's candidates only (`only`), or with another bound on the devices.
  std::optional<Entry> search(int min_devices, std::optional<std::size_t> only = std::nullopt) {
    std::vector<Entry> order;
    for (std::size_t p = 0; p < pools_.size(); ++p) {
      if (!pools_[p].set || (only && p != *only)) continue;
      const auto& candidates = pools_[p].set->candidates();
      const bool split = schedule::traits(pools_[p].policy).splits_backward;
      for (std::size_t i = 0; i < candidates.size(); ++i) {
        if (devices_used(candidates[i].layout) < min_devices) continue;
        order.push_back({p, i, split ? candidates[i].compute_bound : candidates[i].pipeline_bound});
      }
    }
    std::stable_sort(order.begin(), order.end(), [](const Entry& a, const Entry& b) { return a.bound < b.bound; });
    std::optional<Entry> best;
    double best_step = 0.0;
    auto listed_before = [](const Entry& a, const Entry& b) {
      return a.pool < b.pool || (a.pool == b.pool && a.index < b.index);
    };
    for (const Entry& e : order) {
      if (best && e.bound > best_step * (1.0 + 1e-12)) break;
      const double step = this->step(e);
      const bool faster = step < best_step * (1.0 - 1e-12);
      const bool tie = !faster && step <= best_step * (1.0 + 1e-12) && listed_before(e, *best);
      if (!best || faster || tie) {
        best = e;
        best_step = step;
      }
    }
    return best;
  }

  double step(const Entry& e) {
    const partition::RankedCandidate& c = pools_[e.pool].set->candidates()[e.index];
    auto [at, fresh] = steps_.try_emplace({e.pool, c.micro_batch_size, c.listed}, 0.0);
    if (fresh) at->second = simulated_step(plan(e), devices_, pools_[e.pool].policy, planner_.sim);
    return at->second;
  }

  plan::Plan plan(const Entry& e) const { return pools_[e.pool].set->build(e.index); }

  std::size_t simulated() const { return steps_.size(); }

 private:
  const std::vector<Pool>& pools_;
  const cost::Devices& devices_;
  const PlannerOptions& planner_;
  // By pool and candidate (its micro-batch size and place there: a name that stays when a pool
  // lists more sizes and its indices move).
  std::map<std::tuple<std::size_t, std::int64_t, std::size_t>, double> steps_;
};

// Lists the replicated pools (`below`: the step they must beat, infinity where growth needs
// them whole) in two turns: the kFirstSizes micro-batch sizes of least floor first, then only
// those of the rest whose floor is not above the fastest candidate simulated in the pool so far
// (CandidateSet::list_below). A size left out has every candidate's bound, and so its simulated
// step and that of every plan grown from it, above a candidate of the same pool: none of them is
// the pool's fastest (where growth starts) or the plan chosen, so the plan is the same as with
// every size listed. (MMT at paper size onto 64 V100s: its micro-batches of one sample, whose
// search is among the DP's dearest, are left out.)
void list_replicated(const graph::OpGraph& graph, const cost::Devices& devices, std::vector<Pool>& pools,
                     Ranking& ranking, double below) {
  for (Pool& pool : pools) {
    if (!pool.plain)
      pool.set = std::make_unique<partition::CandidateSet>(graph, devices, pool.options, below, kFirstSizes);
  }
  for (std::size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].plain || !pools[p].set->pending_below(std::numeric_limits<double>::infinity())) continue;
    const std::optional<Entry> fastest = ranking.search(0, p);
    pools[p].set->list_below(fastest ? std::min(ranking.step(*fastest), below) : below);
  }
}

// The device budgets at which replicas are grown by simulation: the powers of two up to the
// device count. A set that only grows with the device count, as plain_budgets' does, and the
// growth at a budget is planned on the description's first that many ranks alone, as a planner
// given that smaller cluster would: so each budget's grown plan is the same at every larger
// count, and growth keeps the planner never worse with more devices. (Growing the plan chosen
// at each count did not: a better candidate on 14 devices, with none left to grow, lost to the
// grown plan on 13; CANDLE-Uno at 256 samples per GPU.)
std::vector<int> growth_budgets(int count) {
  std::vector<int> budgets;
  for (int b = 1; b <= count; b *= 2) budgets.push_back(b);
  return budgets;
}

// Offers a plan grown within `budget` devices to the result: it replaces the chosen plan where
// it simulates faster (relative 1e-12) and uses at least min_devices.
void offer(Refinement grown, int budget, schedule::Policy policy, const PlannerOptions& planner,
           PlannerResult& result) {
  if (grown.rounds == 0 || grown.step >= result.plan.predicted_iteration_seconds * (1.0 - 1e-12) ||
      plan_devices(grown.plan) < planner.min_devices) {
    return;
  }
  log::info("planner: " + std::to_string(grown.rounds) + " replicas grown by simulation within " +
            std::to_string(budget) + " devices, on " + std::to_string(plan_devices(grown.plan)) + ": " +
            std::to_string(grown.step) + " s");
  result.closed_form = grown.plan.predicted_iteration_seconds;
  result.plan = std::move(grown.plan);
  result.plan.schedule = std::string(schedule::policy_name(policy));
  result.plan.predicted_iteration_seconds = grown.step;
}

// Replica refinement (replica_refinement.h). For each pool with replicas and each growth budget,
// the least simulated candidate of that pool's search on the budget's first ranks (min_devices
// aside: it bounds the plan returned, not where growth starts) grows within them. At the device
// count that is the pool itself; a smaller budget is searched afresh on first_ranks(devices,
// budget) unless its floor (candidate_floor: no plan on those ranks, grown or not, simulates
// below it) is above the best step so far or PlannerOptions::to_beat. A plan grown there is the
// same plan on the whole description: it records the whole description's devices, and is
// simulated on it again.
void grow_replicas(const graph::OpGraph& graph, const cost::Devices& devices, const std::vector<Pool>& pools,
                   Ranking& ranking, const PlannerOptions& planner, PlannerResult& result) {
  std::size_t simulated = 0;  // the growths and the smaller budgets' searches
  for (std::size_t p = 0; p < pools.size(); ++p) {
    if (pools[p].plain || !pools[p].set) continue;
    for (int budget : growth_budgets(devices.count)) {
      if (budget < planner.min_devices) continue;
      if (budget == devices.count) {
        const std::optional<Entry> start = ranking.search(0, p);
        if (!start) continue;
        Refinement grown =
            refine_replicas(*pools[p].set, start->index, ranking.step(*start), devices, pools[p].policy, planner.sim);
        simulated += grown.simulated;
        offer(std::move(grown), budget, pools[p].policy, planner, result);
        continue;
      }
      const cost::Devices first = cost::first_ranks(devices, budget);
      std::vector<Pool> smaller(1);
      smaller[0].options = pools[p].options;
      smaller[0].policy = pools[p].policy;
      // Listed below the chosen step only (not to_beat: the growth's start, this search's fastest
      // candidate, must stay listed). Skipped where the floor is above either: a plan grown here
      // would then be taken neither by this search nor by the one that set to_beat.
      const double beat = result.plan.predicted_iteration_seconds;
      const double wanted_below = std::min(beat, planner.to_beat);
      try {
        const double floor = partition::candidate_floor(graph, first, smaller[0].options);
        if (floor > wanted_below * (1.0 + 1e-9)) {
          log::debug("planner: no growth on " + std::to_string(budget) + " devices: their floor " +
                     std::to_string(floor) + " s is above " + std::to_string(wanted_below) + " s");
          continue;
        }
        smaller[0].set = std::make_unique<partition::CandidateSet>(graph, first, smaller[0].options, beat);
      } catch (const PlanningError& e) {
        log::debug("planner: no replicated plan on " + std::to_string(budget) + " devices to grow: " + e.what());
        continue;
      }
      Ranking search(smaller, first, planner);
      const std::optional<Entry> start = search.search(0);
      simulated += search.simulated();
      if (!start) continue;
      Refinement grown =
          refine_replicas(*smaller[0].set, start->index, search.step(*start), first, smaller[0].policy, planner.sim);
      simulated += grown.simulated;
      if (grown.rounds > 0) {
        partition::record_devices(grown.plan, devices);
        grown.step = simulated_step(grown.plan, devices, smaller[0].policy, planner.sim);
      }
      offer(std::move(grown), budget, smaller[0].policy, planner, result);
    }
  }
  result.simulated = ranking.simulated();
  result.growth_simulated = simulated;
}

}  // namespace

int plan_devices(const plan::Plan& plan) {
  std::vector<std::vector<int>> ranks;
  for (const plan::Stage& stage : plan.stages) ranks.push_back(stage.devices);
  return plan::ranks_used(ranks);
}

double simulated_step(const plan::Plan& plan, const cost::Devices& devices, schedule::Policy policy,
                      const sim::SimOptions& options) {
  const schedule::Schedule schedule = schedule::generate(plan, policy);
  return sim::simulate(plan, schedule, devices, options).amortized_iteration_seconds;
}

PlannerResult plan_by_simulation(const graph::OpGraph& graph, const cost::Devices& devices,
                                 const partition::Options& options, const PlannerOptions& given) {
  // Fault-tolerant replicas are priced on one link, resolved from the whole description before
  // the search: its smaller budgets' first ranks have another slowest link, or none.
  PlannerOptions planner = given;
  planner.sim.cross_replica = cost::with_link(given.sim.cross_replica, devices);
  if (planner.policies.empty()) throw PlanningError("the planner needs at least one schedule to plan for");
  if (planner.plain_budget_limit < 0 || planner.plain_every_up_to < 0) {
    throw PlanningError("plain_budget_limit (0: no limit) and plain_every_up_to must be device counts, got " +
                        std::to_string(planner.plain_budget_limit) + " and " +
                        std::to_string(planner.plain_every_up_to));
  }
  std::vector<Pool> pools = pool_options(devices, options, planner);
  // The replicated (or only) pools first. A plain pool is listed only where its floor is below
  // the best step they simulate: every candidate it would list has a bound at least its floor,
  // so none of them could be chosen (the search stops before them). Which plan is chosen is the
  // same as with every pool listed; the plain searches are skipped where replicas clearly win
  // (about a tenth of planning MMT at paper size onto 64 V100s, whose plain plans on up to 8
  // devices simulate at least 4.8x slower than the best replicated one). A pool that is listed is
  // planned only at the micro-batch sizes whose own floor is below that step, by the same rule.
  // Growth starts from a replicated pool's fastest candidate, which pruning by to_beat could
  // leave out (planner.h): with growth, those pools are listed below their own fastest candidate
  // only (list_replicated), not below to_beat.
  const double replicated_below = planner.grow_replicas ? std::numeric_limits<double>::infinity() : planner.to_beat;
  Ranking ranking(pools, devices, planner);
  list_replicated(graph, devices, pools, ranking, replicated_below);
  const std::optional<Entry> replicated = ranking.search();
  const double listed_below = replicated ? std::min(ranking.step(*replicated), planner.to_beat) : planner.to_beat;
  std::size_t skipped = 0;
  for (Pool& pool : pools) {
    if (!pool.plain) continue;
    if (std::isfinite(listed_below)) {
      double floor = 0.0;
      try {
        floor = partition::candidate_floor(graph, devices, pool.options);
      } catch (const PlanningError&) {
        // list_plain says why below
      }
      if (floor > listed_below * (1.0 + 1e-9)) {
        log::debug("planner: the plans without replicas on " + std::to_string(pool.options.max_stages) +
                   " devices are not listed: none can beat " + std::to_string(listed_below) + " s (their floor is " +
                   std::to_string(floor) + " s)");
        ++skipped;
        continue;
      }
    }
    list_plain(graph, devices, pool, listed_below);
  }

  std::size_t fitting = 0;
  for (const Pool& pool : pools) fitting += pool.set ? pool.set->candidates().size() : 0;
  if (fitting == 0 && std::isfinite(planner.to_beat)) {
    throw NoPlanBelow("no " + options.partitioner + " plan can simulate below " + std::to_string(planner.to_beat) +
                      " s: every pool's and micro-batch size's floor is above it, or nothing fits");
  }
  if (fitting == 0) {  // raises partition()'s error, which says why nothing fits
    partition::Options first = options;
    first.zero_bubble = schedule::traits(planner.policies.front()).splits_backward;
    return {partition::partition(graph, devices, first), 0.0, 0, 0};
  }
  const std::optional<Entry> chosen = ranking.search();  // again, over the plain pools listed too
  if (!chosen) {
    throw PlanningError("no " + options.partitioner + " plan that fits in memory uses at least " +
                        std::to_string(planner.min_devices) + " devices (of " + std::to_string(devices.count) +
                        "); plan with fewer devices or replicate=True");
  }
  const Pool& pool = pools[chosen->pool];
  PlannerResult result{ranking.plan(*chosen), pool.set->candidates()[chosen->index].predicted_step, fitting,
                       ranking.simulated()};
  result.plan.schedule = std::string(schedule::policy_name(pool.policy));
  result.plan.predicted_iteration_seconds = ranking.step(*chosen);
  if (planner.grow_replicas) grow_replicas(graph, devices, pools, ranking, planner, result);
  log::info("planner: simulated " + std::to_string(result.simulated) + " of " + std::to_string(fitting) +
            " candidates (" + std::to_string(skipped) + " plain pools ruled out by their floor); " +
            result.plan.partitioner + ", " + std::to_string(result.plan.stages.size()) + " stages, micro-batch " +
            std::to_string(result.plan.micro_batch_size) + ", schedule " + result.plan.schedule);
  return result;
}

}  // namespace graphpipe::planner
