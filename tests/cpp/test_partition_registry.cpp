// The partitioner registry and the driver around it (partitioner.h, registry.h):
//   - every name partitioner_names() lists resolves to a partitioner that plans, and an unknown
//     name is the PlanningError that lists them all;
//   - partition() returns exactly the plan that a direct call of the registered partitioner
//     gives at the best micro-batch size (same JSON: stages, label, micro-batch size, figures),
//     on graphs where the micro-batch sizes give different plans, so a driver that chose
//     another size or mislabelled the winner fails;
//   - the graphpipe portfolio's winner is the candidate of least predicted step, ties to the
//     earlier (the DP), on graphs where its candidates differ and more than one part wins.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/cost_model.h"
#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/partitioner.h"
#include "partition/plan_build.h"
#include "partition/registry.h"
#include "partition/series_parallel_dp/graphpipe_portfolio.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

pt::Options options_for(const std::string& name, const graph::OpGraph& g) {
  pt::Options o;
  o.partitioner = name;
  o.batch_size = 16;  // micro-batch candidates 1, 2, 4, 8, 16
  // For "manual": the first half of the operators on stage 0, the rest on stage 1 (module mi).
  o.manual = {{"", 0}};
  for (std::size_t v = g.num_nodes() / 2; v < g.num_nodes(); ++v) o.manual.push_back({"m" + std::to_string(v), 1});
  return o;
}

// The request partition() builds for these inputs (no memory limit, no stage cap).
pt::PartitionRequest request_for(const graph::OpGraph& g, const cost::Devices& d, const pt::Options& o,
                                 const cost::CostModel& model, bool chain) {
  return pt::PartitionRequest{.graph = g,
                              .devices = d,
                              .options = o,
                              .model = model,
                              .batch_size = o.batch_size,
                              .micro_batch_sizes = pt::micro_batch_candidates(o.batch_size),
                              .memory_limit = d.memory_bytes,
                              .max_stages = d.count,
                              .chain = chain};
}

std::vector<graph::OpGraph> test_graphs() {
  return {tst::random_sp_graph(3, 14), tst::random_sp_graph(11, 24), tst::random_sp_graph(29, 40),
          tst::random_dag(5, 18),      tst::random_dag(17, 30),      tst::random_chain(7, 16)};
}

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& n : names) text += n + " ";
  return text;
}

}  // namespace

TEST(PartitionRegistry, EveryListedNameResolvesAndPlans) {
  const std::vector<std::string> names = pt::partitioner_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), pt::Options{}.partitioner) << "the default partitioner comes first";
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << join(names);
  for (const char* expected : {"graphpipe", "metis", "sequential", "manual"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected << " missing: " << join(names);
  }
  auto g = tst::random_sp_graph(3, 14);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    std::unique_ptr<pt::Partitioner> partitioner = pt::make_partitioner(name);
    ASSERT_NE(partitioner, nullptr);
    EXPECT_EQ(partitioner->plans_chains(), name == "sequential" || name == "piper");
    graphpipe::plan::Plan plan = pt::partition(g, cost::v100(2), options_for(name, g));
    EXPECT_EQ(plan.partitioner.substr(0, name.size()), name);
    EXPECT_EQ(tst::check_plan(plan, g, 2), "");
  }
}

TEST(PartitionRegistry, UnknownNameListsTheRegisteredOnes) {
  std::string made;
  try {
    pt::make_partitioner("fastest");
    FAIL() << "no error for an unknown name";
  } catch (const gp::PlanningError& e) {
    made = e.what();
  }
  EXPECT_EQ(made, "unknown partitioner 'fastest': choose graphpipe, metis, sequential, manual or piper");
  for (const std::string& name : pt::partitioner_names()) EXPECT_NE(made.find(name), std::string::npos) << name;
  auto g = tst::random_sp_graph(3, 14);
  try {
    pt::partition(g, cost::v100(2), options_for("fastest", g));
    FAIL() << "partition() accepted an unknown name";
  } catch (const gp::PlanningError& e) {
    EXPECT_EQ(std::string(e.what()), made);
  }
}

// partition() against the registered partitioner called directly: the same candidate at every
// micro-batch size, the fastest fitting one kept (ties: lower slowest stage, then the smaller
// size), built into a Plan; the two plans' JSON must be equal.
TEST(PartitionRegistry, DriverReturnsThePartitionersBestCandidate) {
  int cases = 0, sensitive = 0;
  for (const graph::OpGraph& g : test_graphs()) {
    for (int devices : {3, 5}) {
      const cost::Devices d = cost::v100(devices);
      for (const std::string& name : pt::partitioner_names()) {
        SCOPED_TRACE(name + " on " + std::to_string(g.num_nodes()) + " operators, " + std::to_string(devices) +
                     " devices");
        const pt::Options o = options_for(name, g);
        const graphpipe::plan::Plan driven = pt::partition(g, d, o);

        std::unique_ptr<pt::Partitioner> direct = pt::make_partitioner(name);
        const cost::CostModel model(g, d, o.optimizer);
        const pt::PartitionRequest request = request_for(g, d, o, model, direct->plans_chains());
        direct->prepare(request);
        std::set<std::string> plans;  // distinct fitting plans over micro-batch sizes
        std::string best_json;
        double best_step = 0.0, best_bottleneck = 0.0;
        for (std::int64_t mb : request.micro_batch_sizes) {
          const pt::Problem problem = request.problem(mb);
          const pt::CandidatePlan candidate = direct->plan(request, problem);
          if (candidate.assignment.empty()) continue;
          const pt::Evaluation ev = pt::evaluate(problem, candidate.assignment);
          if (!ev.fits()) continue;
          const std::string json =
              graphpipe::plan::dumps(pt::build_plan(problem, candidate.assignment, candidate.partitioner), g);
          plans.insert(json);
          const double step = ev.iteration_seconds(problem);
          if (best_json.empty() || step < best_step * (1.0 - 1e-12) ||
              (step <= best_step * (1.0 + 1e-12) && ev.bottleneck < best_bottleneck)) {
            best_json = json;
            best_step = step;
            best_bottleneck = ev.bottleneck;
          }
          EXPECT_GE(step, driven.predicted_iteration_seconds * (1.0 - 1e-12)) << "a faster candidate at " << mb;
        }
        ASSERT_FALSE(best_json.empty());
        EXPECT_EQ(graphpipe::plan::dumps(driven, g), best_json);
        ++cases;
        if (plans.size() > 1) ++sensitive;
      }
    }
  }
  // Most cases offer several different plans, so the comparison above would see a wrong pick.
  EXPECT_GT(sensitive, cases / 2) << sensitive << " of " << cases;
}

// The portfolio's tie-break (portfolio_winner) on its own candidates: the least predicted step
// among those that fit, the earlier on a tie, and plan() returns exactly that candidate.
TEST(PartitionRegistry, PortfolioWinnerIsTheLeastStepTiesToTheEarlier) {
  std::set<std::string> labels_that_won;
  int with_choice = 0;
  for (const graph::OpGraph& g : test_graphs()) {
    for (int devices : {3, 5}) {
      const cost::Devices d = cost::v100(devices);
      const pt::Options o = options_for("graphpipe", g);
      const cost::CostModel model(g, d, o.optimizer);
      pt::GraphpipePortfolio portfolio;
      const pt::PartitionRequest request = request_for(g, d, o, model, portfolio.plans_chains());
      portfolio.prepare(request);
      for (std::int64_t mb : {std::int64_t{1}, std::int64_t{4}}) {
        SCOPED_TRACE(std::to_string(g.num_nodes()) + " operators, " + std::to_string(devices) + " devices, mb " +
                     std::to_string(mb));
        const pt::Problem problem = request.problem(mb);
        const std::vector<pt::CandidatePlan> candidates = portfolio.candidates(request, problem);
        ASSERT_FALSE(candidates.empty());
        const std::size_t w = pt::portfolio_winner(problem, candidates);
        ASSERT_LT(w, candidates.size());
        const pt::Evaluation won = pt::evaluate(problem, candidates[w].assignment);
        ASSERT_TRUE(won.fits());
        const double step = won.iteration_seconds(problem);
        std::set<double> steps;
        for (std::size_t i = 0; i < candidates.size(); ++i) {
          const pt::Evaluation ev = pt::evaluate(problem, candidates[i].assignment);
          if (!ev.fits()) continue;
          const double other = ev.iteration_seconds(problem);
          steps.insert(other);
          EXPECT_GE(other, step * (1.0 - 1e-12))
              << "candidate " << i << " (" << candidates[i].partitioner << ") is faster than the winner " << w;
          if (i < w) {
            // An earlier candidate lost, so it was slower, or as fast with a higher slowest stage.
            EXPECT_TRUE(other > step * (1.0 + 1e-12) || ev.bottleneck > won.bottleneck) << "candidate " << i;
          }
        }
        if (steps.size() > 1) ++with_choice;
        const pt::CandidatePlan planned = portfolio.plan(request, problem);
        EXPECT_EQ(planned.assignment, candidates[w].assignment);
        EXPECT_EQ(planned.partitioner, candidates[w].partitioner);
        labels_that_won.insert(planned.partitioner);
        // The labels say which part a candidate came from; a graph without a tree has only the
        // fallback and the exact plans.
        const bool sp = candidates.front().partitioner == "graphpipe";
        for (const auto& c : candidates) {
          if (sp) {
            EXPECT_NE(c.partitioner, "graphpipe(fallback)");
          } else {
            EXPECT_TRUE(c.partitioner == "graphpipe(fallback)" || c.partitioner == "graphpipe(downset)")
                << c.partitioner;
          }
        }
      }
    }
  }
  EXPECT_GT(with_choice, 0);
  // More than one part of the portfolio wins somewhere, so the rule is exercised, not a formality.
  EXPECT_GT(labels_that_won.size(), 1u) << [&] {
    std::string s;
    for (const auto& l : labels_that_won) s += l + " ";
    return s;
  }();
}
