// The planner that ranks candidates by simulation (planner/planner.h): its plan's predicted step
// is what the simulator says of that plan; it is the least simulated step over every candidate
// (the compute bound prunes only what cannot win); it is never slower, simulated, than the
// closed form's choice; and more devices never give a longer step.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/partitioner.h"
#include "plan/plan_io.h"
#include "planner/planner.h"
#include "schedule/generate.h"
#include "sim/simulate.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace pl = graphpipe::planner;
namespace sched = graphpipe::schedule;
namespace sim = graphpipe::sim;
namespace tst = graphpipe::testing;

namespace {

pt::Options options(const std::string& partitioner, bool replicate) {
  pt::Options o;
  o.partitioner = partitioner;
  o.replicate = replicate;
  return o;
}

double simulate_step(const graphpipe::plan::Plan& plan, const cost::Devices& devices, sched::Policy policy) {
  return sim::simulate(plan, sched::generate(plan, policy), devices).iteration_seconds;
}

// Parameters 40x those of random_sp_graph's operators (up to 160 MB each): replicas' all-reduces
// cost more than they save, so plans without replicas on counts that are not powers of two win.
graph::OpGraph heavy_parameters(graph::OpGraph g) {
  graph::OpGraph heavy;
  for (std::size_t v = 0; v < g.num_nodes(); ++v) {
    graph::Node node = g.node(static_cast<graph::NodeId>(v));
    node.param_bytes *= 40;
    heavy.add_node(node);
  }
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    const graph::Edge& edge = g.edge(static_cast<graph::EdgeId>(e));
    heavy.add_edge(edge.src, edge.dst, edge.bytes);
  }
  heavy.trace_batch_size = 32;
  return heavy;
}

}  // namespace

TEST(PlannerRank, PredictedStepIsTheSimulation) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(40 + seed, 20);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential", "metis"}) {
      for (bool replicate : {false, true}) {
        for (sched::Policy policy : {sched::Policy::one_f_one_b, sched::Policy::zb_graph}) {
          const cost::Devices devices = cost::v100(6, 4);
          pt::Options o = options(name, replicate);
          o.zero_bubble = policy == sched::Policy::zb_graph;
          const pl::PlannerResult r = pl::plan_by_simulation(g, devices, o, {.policies = {policy}});
          EXPECT_NO_THROW(graphpipe::plan::validate_plan(r.plan, g));
          EXPECT_EQ(r.plan.schedule, std::string(sched::policy_name(policy)));
          EXPECT_DOUBLE_EQ(r.plan.predicted_iteration_seconds, simulate_step(r.plan, devices, policy))
              << name << " seed " << seed << " replicate " << replicate;
          EXPECT_GE(r.simulated, 1u);
          EXPECT_LE(r.simulated, r.candidates);
        }
      }
    }
  }
}

TEST(PlannerRank, LeastSimulatedStepOverEveryCandidate) {
  bool skipped_somewhere = false;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(60 + seed, 18);
    g.trace_batch_size = 16;
    for (const char* name : {"graphpipe", "sequential"}) {
      const cost::Devices devices = cost::v100(8, 4);
      pt::Options o = options(name, true);
      const pl::PlannerResult r = pl::plan_by_simulation(g, devices, o);
      o.every_candidate = true;
      // Replicas allowed: the replicated candidates and the one-device-per-stage ones on 1, 2,
      // 4 and 8 devices.
      std::size_t listed = 0;
      double least = std::numeric_limits<double>::infinity();
      for (int budget : {0, 1, 2, 4, 8}) {
        const bool replicate = budget == 0;
        o.replicate = replicate;
        o.max_stages = budget;
        const pt::CandidateSet set(g, devices, o);
        listed += set.candidates().size();
        for (std::size_t i = 0; i < set.candidates().size(); ++i) {
          const double step = simulate_step(set.build(i), devices, sched::Policy::one_f_one_b);
          // The bound the search prunes by is a bound of the simulation.
          EXPECT_GE(step, set.candidates()[i].pipeline_bound * (1.0 - 1e-12)) << name << " candidate " << i;
          EXPECT_GE(set.candidates()[i].pipeline_bound, set.candidates()[i].compute_bound * (1.0 - 1e-12));
          least = std::min(least, step);
        }
        if (!replicate) continue;
        // partition()'s plan is the set's first, so never faster, simulated, than the planner's.
        const auto closed = pt::partition(g, devices, options(name, true));
        EXPECT_LE(r.plan.predicted_iteration_seconds,
                  simulate_step(closed, devices, sched::Policy::one_f_one_b) * (1.0 + 1e-12));
        EXPECT_DOUBLE_EQ(set.candidates().front().predicted_step, closed.predicted_iteration_seconds);
      }
      // Plain pools whose floor is above the best replicated step are not listed (planner.cpp),
      // and the least simulated step over every pool is the planner's all the same.
      ASSERT_LE(r.candidates, listed);
      skipped_somewhere = skipped_somewhere || r.candidates < listed;
      EXPECT_DOUBLE_EQ(r.plan.predicted_iteration_seconds, least) << name << " seed " << seed;
    }
  }
  EXPECT_TRUE(skipped_somewhere) << "no plain pool was ruled out by its floor: the test no longer covers that";
}

// candidate_floor, which lets the planner skip a pool unlisted, is below the bound every
// candidate in that pool is ordered by (compute_bound under a split backward, pipeline_bound where
// backwards run whole; and so below its simulation, which the test above checks of the bound), for
// every partitioner, with and without replicas, for both backward forms.
TEST(PlannerRank, CandidateFloorIsBelowEveryCandidate) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(70 + seed, 20);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential", "metis"}) {
      for (bool replicate : {false, true}) {
        for (bool zero_bubble : {false, true}) {
          for (int budget : {1, 2, 4, 0}) {
            const cost::Devices devices = cost::v100(8, 4);
            pt::Options o = options(name, replicate);
            o.every_candidate = true;
            o.zero_bubble = zero_bubble;
            o.max_stages = budget;
            const double floor = pt::candidate_floor(g, devices, o);
            const pt::CandidateSet set(g, devices, o);
            ASSERT_FALSE(set.candidates().empty());
            double least = std::numeric_limits<double>::infinity();
            for (const pt::RankedCandidate& c : set.candidates()) {
              least = std::min(least, zero_bubble ? c.compute_bound : c.pipeline_bound);
            }
            EXPECT_LE(floor, least * (1.0 + 1e-12))
                << name << " seed " << seed << " replicate " << replicate << " zb " << zero_bubble;
            // Not vacuous: within a factor of the best candidate's bound.
            EXPECT_GT(floor, 0.2 * least) << name << " seed " << seed;
          }
        }
      }
    }
  }
}

// Where every backward runs whole (1F1B), the floor counts each operator's whole compute, not
// its forward and weight half: above the zero-bubble floor (on the replicated pools, by at least
// a fifth on these graphs, which is what skips growth budgets the zero-bubble floor let through),
// and still below the simulated step of every candidate and of every plan grown from one within
// the devices, as the planner's growth makes them (CandidateSet::replica_growths).
TEST(PlannerRank, TheWholeBackwardFloorIsBelowEveryCandidateAndItsGrowths) {
  int growths = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(110 + seed, 18);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential", "piper"}) {
      for (bool replicate : {false, true}) {
        const cost::Devices devices = cost::v100(8, 4);
        pt::Options o = options(name, replicate);
        o.every_candidate = true;
        const double whole = pt::candidate_floor(g, devices, o);
        pt::Options split = o;
        split.zero_bubble = true;
        const double halves = pt::candidate_floor(g, devices, split);
        EXPECT_GE(whole, halves) << name << " seed " << seed;
        if (replicate) EXPECT_GT(whole, 1.2 * halves) << name << " seed " << seed;
        const pt::CandidateSet set(g, devices, o);
        ASSERT_FALSE(set.candidates().empty());
        for (std::size_t i = 0; i < set.candidates().size(); ++i) {
          const graphpipe::plan::Plan plan = set.build(i);
          EXPECT_LE(whole, simulate_step(plan, devices, sched::Policy::one_f_one_b) * (1.0 + 1e-12))
              << name << " seed " << seed << " candidate " << i;
          for (const auto& ranks : set.replica_growths(i, plan)) {
            const double grown = simulate_step(set.build(i, ranks), devices, sched::Policy::one_f_one_b);
            EXPECT_LE(whole, grown * (1.0 + 1e-12)) << name << " seed " << seed << " candidate " << i << " grown";
            ++growths;
          }
        }
      }
    }
  }
  EXPECT_GT(growths, 0) << "no candidate could grow: the test no longer covers growth";
}

// A CandidateSet told the best step so far (listed_below) leaves out only micro-batch sizes none
// of whose candidates the planner could order below it: for each size, the set listed below
// that size's least bound (pipeline_bound where backwards run whole, compute_bound under a split
// backward) still holds its candidate of that bound. So each size's floor, with
// pipeline_lower_bound where backwards run whole, is at most every candidate's bound there. And
// some sizes are left out (pipeline_lower_bound is not vacuous).
TEST(PlannerRank, SizesListedBelowTheBestKeepEveryCandidateThatCouldWin) {
  int sizes_checked = 0, left_out = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(90 + seed, 20);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential", "metis"}) {
      for (bool replicate : {false, true}) {
        for (bool zero_bubble : {false, true}) {
          const cost::Devices devices = cost::v100(8, 4);
          pt::Options o = options(name, replicate);
          o.every_candidate = true;
          o.zero_bubble = zero_bubble;
          const pt::CandidateSet all(g, devices, o);
          std::map<std::int64_t, const pt::RankedCandidate*> least;  // by size
          auto bound = [&](const pt::RankedCandidate& c) { return zero_bubble ? c.compute_bound : c.pipeline_bound; };
          for (const pt::RankedCandidate& c : all.candidates()) {
            auto [at, fresh] = least.try_emplace(c.micro_batch_size, &c);
            if (!fresh && bound(c) < bound(*at->second)) at->second = &c;
          }
          for (const auto& [mb, best] : least) {
            const pt::CandidateSet below(g, devices, o, bound(*best));
            const bool kept = std::any_of(below.candidates().begin(), below.candidates().end(), [&](const auto& c) {
              return c.micro_batch_size == mb && c.layout.assignment == best->layout.assignment &&
                     c.layout.replicas == best->layout.replicas;
            });
            EXPECT_TRUE(kept) << name << " seed " << seed << " replicate " << replicate << " zb " << zero_bubble
                              << ": micro-batch size " << mb << " left out below its own least bound";
            ++sizes_checked;
            std::set<std::int64_t> listed;
            for (const pt::RankedCandidate& c : below.candidates()) listed.insert(c.micro_batch_size);
            left_out += static_cast<int>(least.size() - listed.size());
          }
        }
      }
    }
  }
  std::printf("[ listed below ] %d sizes kept below their own least bound; %d sizes left out in all\n", sizes_checked,
              left_out);
  EXPECT_GT(left_out, 0) << "no size was left out: the test no longer covers the floors";
}

// A CandidateSet listing its micro-batch sizes in turns (first_sizes, then list_below) holds,
// once every pending size is listed, the candidates of the set listed at once, in the same
// order. And a second turn below the fastest candidate simulated in the first leaves out no
// candidate faster than it: the least simulated step and its plan are those of the whole list,
// which is what lets the planner list its replicated pools so (plan_by_simulation).
TEST(PlannerRank, SizesListedInTurnsLeaveTheFastestCandidateAndTheOrderAsTheyWere) {
  int sets = 0, left_out = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(110 + seed, 20);
    g.trace_batch_size = 64;
    for (const char* name : {"graphpipe", "sequential"}) {
      const cost::Devices devices = cost::v100(8, 4);
      pt::Options o = options(name, true);
      o.every_candidate = true;
      const pt::CandidateSet all(g, devices, o);
      auto fastest = [&](const pt::CandidateSet& set) {
        std::size_t best = 0;
        double best_step = std::numeric_limits<double>::infinity();
        for (std::size_t i = 0; i < set.candidates().size(); ++i) {
          const double step = pl::simulated_step(set.build(i), devices, sched::Policy::one_f_one_b, {});
          if (step < best_step) best = i, best_step = step;
        }
        return std::make_pair(best, best_step);
      };
      const auto [whole, whole_step] = fastest(all);
      for (const std::size_t first : {1, 2, 3}) {
        pt::CandidateSet every(g, devices, o, std::numeric_limits<double>::infinity(), first);
        every.list_below(std::numeric_limits<double>::infinity());
        ASSERT_EQ(every.candidates().size(), all.candidates().size()) << name << " seed " << seed << " first " << first;
        for (std::size_t i = 0; i < all.candidates().size(); ++i) {
          EXPECT_EQ(every.candidates()[i].micro_batch_size, all.candidates()[i].micro_batch_size);
          EXPECT_EQ(every.candidates()[i].layout.assignment, all.candidates()[i].layout.assignment);
          EXPECT_EQ(every.candidates()[i].layout.replicas, all.candidates()[i].layout.replicas);
        }
        pt::CandidateSet turns(g, devices, o, std::numeric_limits<double>::infinity(), first);
        turns.list_below(fastest(turns).second);
        const auto [chosen, chosen_step] = fastest(turns);
        EXPECT_EQ(chosen_step, whole_step) << name << " seed " << seed << " first " << first;
        EXPECT_EQ(turns.candidates()[chosen].layout.assignment, all.candidates()[whole].layout.assignment);
        EXPECT_EQ(turns.candidates()[chosen].micro_batch_size, all.candidates()[whole].micro_batch_size);
        std::set<std::int64_t> listed, every_size;
        for (const pt::RankedCandidate& c : turns.candidates()) listed.insert(c.micro_batch_size);
        for (const pt::RankedCandidate& c : all.candidates()) every_size.insert(c.micro_batch_size);
        left_out += static_cast<int>(every_size.size() - listed.size());
        ++sets;
      }
    }
  }
  std::printf("[ in turns ] %d sets listed in turns; %d sizes left out in the second turns\n", sets, left_out);
  EXPECT_EQ(sets, 18);
  EXPECT_GT(left_out, 0) << "no size was left out: the test no longer covers the second turn";
}

TEST(PlannerRank, NeverSlowerWithMoreDevices) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(100 + seed, 24);
    g.trace_batch_size = 32;
    for (const char* name : {"sequential", "graphpipe"}) {
      double best = 0.0;
      for (int n = 1; n <= 12; ++n) {
        const cost::Devices devices = cost::v100(n, 4);
        const pl::PlannerResult r = pl::plan_by_simulation(g, devices, options(name, true));
        const double step = r.plan.predicted_iteration_seconds;
        if (n > 1) EXPECT_LE(step, best * (1.0 + 1e-12)) << name << " seed " << seed << ": " << n << " devices";
        best = n == 1 ? step : std::min(best, step);
      }
    }
  }
}

TEST(PlannerRank, ReplicasAllowedIsNeverSlowerThanWithout) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(200 + seed, 20);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential", "metis", "piper"}) {
      for (int n : {3, 6, 8}) {
        const cost::Devices devices = cost::v100(n, 4);
        const double replicated =
            pl::plan_by_simulation(g, devices, options(name, true)).plan.predicted_iteration_seconds;
        // Against the plain plans on every power-of-two budget up to n (n itself where it is one).
        for (int budget = 1; budget <= n; budget *= 2) {
          pt::Options plain = options(name, false);
          plain.max_stages = budget;
          const double step = pl::plan_by_simulation(g, devices, plain).plan.predicted_iteration_seconds;
          EXPECT_LE(replicated, step * (1.0 + 1e-12)) << name << " seed " << seed << ", " << budget << " of " << n;
        }
      }
    }
  }
}

// The plain budgets widened (every count up to plain_every_up_to, every power of two with no
// limit; graphpipe.plan's default asks for every count up to 16 and none past it): the plan is
// never slower than the plan without replicas on any of those budgets, and never slower with
// more devices (the set of budgets only grows). A plain plan on 3, 5 or 6 devices is weighed
// there, where replicate=True alone weighs 1, 2, 4 and 8: with its budgets, the plans without
// replicas on all of 3, 5 or 6 devices beat the planner's on these graphs (heavy_parameters), and
// the test fails.
TEST(PlannerRank, WidenedPlainBudgetsAreWeighedAndNeverSlowerWithMoreDevices) {
  pl::PlannerOptions widened;
  widened.plain_every_up_to = 6;
  widened.plain_budget_limit = 0;
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = heavy_parameters(tst::random_sp_graph(300 + seed, 20));
    double best = 0.0;
    for (int n = 1; n <= 12; ++n) {
      const cost::Devices devices = cost::v100(n, 4);
      const double step =
          pl::plan_by_simulation(g, devices, options("graphpipe", true), widened).plan.predicted_iteration_seconds;
      for (int budget = 1; budget <= n; ++budget) {
        const bool weighed = budget <= widened.plain_every_up_to || (budget & (budget - 1)) == 0;
        if (!weighed) continue;
        pt::Options plain = options("graphpipe", false);
        plain.max_stages = budget;
        const double without = pl::plan_by_simulation(g, devices, plain).plan.predicted_iteration_seconds;
        EXPECT_LE(step, without * (1.0 + 1e-12)) << "seed " << seed << ", " << budget << " of " << n;
      }
      if (n > 1) EXPECT_LE(step, best * (1.0 + 1e-12)) << "seed " << seed << ": " << n << " devices";
      best = n == 1 ? step : std::min(best, step);
    }
  }
  pl::PlannerOptions negative;
  negative.plain_every_up_to = -1;
  graph::OpGraph g = heavy_parameters(tst::random_sp_graph(301, 20));
  EXPECT_THROW(pl::plan_by_simulation(g, cost::v100(4, 4), options("graphpipe", true), negative),
               graphpipe::PlanningError);
}

TEST(PlannerRank, PicksTheScheduleOfLeastSimulatedStep) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(300 + seed, 20);
    g.trace_batch_size = 32;
    for (const char* name : {"graphpipe", "sequential"}) {
      for (bool replicate : {false, true}) {
        const cost::Devices devices = cost::v100(6, 4);
        const pt::Options o = options(name, replicate);
        const pl::PlannerResult one = pl::plan_by_simulation(g, devices, o, {.policies = {sched::Policy::one_f_one_b}});
        const pl::PlannerResult zb = pl::plan_by_simulation(g, devices, o, {.policies = {sched::Policy::zb_graph}});
        const pl::PlannerResult both =
            pl::plan_by_simulation(g, devices, o, {.policies = {sched::Policy::one_f_one_b, sched::Policy::zb_graph}});
        const double least = std::min(one.plan.predicted_iteration_seconds, zb.plan.predicted_iteration_seconds);
        EXPECT_DOUBLE_EQ(both.plan.predicted_iteration_seconds, least) << name << " seed " << seed;
        const sched::Policy picked = sched::parse_policy(both.plan.schedule);
        EXPECT_DOUBLE_EQ(simulate_step(both.plan, devices, picked), least) << name << " seed " << seed;
        // A tie goes to the policy listed first.
        if (one.plan.predicted_iteration_seconds <= zb.plan.predicted_iteration_seconds) {
          EXPECT_EQ(both.plan.schedule, "1f1b");
        }
      }
    }
  }
}

TEST(PlannerRank, NothingFitsRaisesThePartitionersError) {
  graph::OpGraph g = tst::random_chain(5, 8);
  g.trace_batch_size = 8;
  pt::Options o = options("graphpipe", false);
  o.memory_limit = 1.0;  // one byte: nothing fits
  EXPECT_THROW(pl::plan_by_simulation(g, cost::v100(2, 4), o), graphpipe::PlanningError);
}

TEST(PlannerRank, MinDevicesKeepsOnlyPlansThatUseThem) {
  graph::OpGraph g = tst::random_sp_graph(77, 20);
  g.trace_batch_size = 16;
  const cost::Devices devices = cost::v100(8, 4);
  const pl::PlannerResult free = pl::plan_by_simulation(g, devices, options("graphpipe", true));
  for (int least : {4, 8}) {
    pl::PlannerOptions p;
    p.min_devices = least;
    const pl::PlannerResult r = pl::plan_by_simulation(g, devices, options("graphpipe", true), p);
    int used = 0;
    for (const auto& s : r.plan.stages) used += static_cast<int>(s.devices.size());
    EXPECT_GE(used, least);
    EXPECT_GE(r.plan.predicted_iteration_seconds, free.plan.predicted_iteration_seconds * (1.0 - 1e-12));
  }
  pl::PlannerOptions too_many;
  too_many.min_devices = 9;
  EXPECT_THROW(pl::plan_by_simulation(g, devices, options("graphpipe", true), too_many), graphpipe::PlanningError);
}
