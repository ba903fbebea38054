// The planner sees the cluster it plans for: a plan's figures depend on the devices it uses (its
// placement), not on how many more the description has, and a planner given more devices never
// returns a plan with a longer predicted step than for fewer (graphpipe_portfolio.h,
// sequential/pipedream.h, replica_allocation.h). The same property on the paper's models is in
// tests/python/test_planning.py.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/partitioner.h"
#include "partition/problem.h"
#include "partition/sequential/pipedream.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

pt::Options replicated(const std::string& partitioner) {
  pt::Options o;
  o.partitioner = partitioner;
  o.replicate = true;
  return o;
}

pt::Problem replicated_problem(const cost::CostModel& model, std::int64_t batch, std::int64_t micro_batch) {
  pt::Problem p = pt::make_problem(model, batch, micro_batch, model.devices().count, model.devices().memory_bytes, {});
  p.replicas = std::make_shared<pt::ReplicaTable>(model, micro_batch, model.devices().count);
  p.device_budget = model.devices().count;
  return p;
}

}  // namespace

TEST(PartitionMonotone, NeverSlowerWithMoreDevices) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    graph::OpGraph g = tst::random_sp_graph(100 + seed, 24);
    g.trace_batch_size = 32;
    for (const char* name : {"sequential", "graphpipe"}) {
      double best = 0.0;
      for (int n = 1; n <= 12; ++n) {
        const auto plan = pt::partition(g, cost::v100(n, 4), replicated(name));
        const double step = plan.predicted_iteration_seconds;
        if (n > 1) {
          EXPECT_LE(step, best * (1.0 + 1e-12)) << name << " seed " << seed << ": " << n << " devices";
        }
        best = n == 1 ? step : std::min(best, step);
      }
    }
  }
}

TEST(PartitionMonotone, FiguresDependOnTheDevicesUsedNotOnTheDescription) {
  graph::OpGraph g = tst::random_sp_graph(7, 20);
  g.trace_batch_size = 16;
  // Two nodes of four, then four nodes: the same plan on ranks 0..5 must be priced the same.
  cost::CostModel small(g, cost::v100(8, 4)), large(g, cost::v100(16, 4));
  const pt::Problem a = replicated_problem(small, 16, 8), b = replicated_problem(large, 16, 8);
  std::vector<int> assignment(g.num_nodes());
  for (std::size_t v = 0; v < assignment.size(); ++v) assignment[v] = v < assignment.size() / 2 ? 0 : 1;
  const std::vector<int> counts{2, 4};
  const pt::Evaluation x = pt::evaluate(a, assignment, counts), y = pt::evaluate(b, assignment, counts);
  ASSERT_TRUE(x.acyclic);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(x.stages[s].devices, y.stages[s].devices);
    EXPECT_DOUBLE_EQ(x.stages[s].transfer, y.stages[s].transfer);
    EXPECT_DOUBLE_EQ(x.stages[s].all_reduce, y.stages[s].all_reduce);
  }
  EXPECT_DOUBLE_EQ(x.iteration_seconds(a), y.iteration_seconds(b));
}

TEST(PartitionMonotone, StageEdgesArePricedByTheirLinks) {
  graph::OpGraph g = tst::random_chain(3, 6);
  g.trace_batch_size = 8;
  cost::CostModel model(g, cost::v100(8, 4));
  const pt::Problem p = replicated_problem(model, 8, 8);
  std::vector<int> assignment(g.num_nodes());
  for (std::size_t v = 0; v < assignment.size(); ++v) assignment[v] = v < 3 ? 0 : 1;
  // The same two stages on one node (ranks 0, 1) and on two (ranks 0, 4).
  const pt::Evaluation near = pt::evaluate(p, assignment, {}, {{0}, {1}});
  const pt::Evaluation far = pt::evaluate(p, assignment, {}, {{0}, {4}});
  EXPECT_GT(far.stages[0].transfer, near.stages[0].transfer);
  // On one node the link is NVLink: the figure is latency + bytes / bandwidth of that link.
  double crossing = 0.0;
  int edges = 0;
  for (std::size_t e = 0; e < g.num_edges(); ++e) {
    if (assignment[g.edge(static_cast<graph::EdgeId>(e)).src] !=
        assignment[g.edge(static_cast<graph::EdgeId>(e)).dst]) {
      crossing += p.edge_bytes[e];
      ++edges;
    }
  }
  const cost::Devices& d = model.devices();
  EXPECT_NEAR(near.stages[0].transfer, edges * d.link_latency[0][1] + crossing / d.link_bandwidth[0][1], 1e-12);
  EXPECT_NEAR(far.stages[0].transfer, edges * d.link_latency[0][4] + crossing / d.link_bandwidth[0][4], 1e-12);
}

TEST(PartitionMonotone, PipeDreamChainsForFewerDevicesStayCandidates) {
  graph::OpGraph g = tst::random_chain(11, 30);
  g.trace_batch_size = 16;
  auto chains = [&](int n) {
    cost::CostModel model(g, cost::v100(n, 4));
    return pt::pipedream_plans(replicated_problem(model, 16, 8));
  };
  const auto fewer = chains(6), more = chains(12);
  ASSERT_FALSE(fewer.empty());
  for (const auto& c : fewer) {
    EXPECT_LE(std::accumulate(c.replicas.begin(), c.replicas.end(), 0), 6);
    bool found = false;
    for (const auto& d : more) found = found || (d.assignment == c.assignment && d.replicas == c.replicas);
    EXPECT_TRUE(found) << "a chain for 6 devices is missing from the chains for 12";
  }
}

TEST(PartitionMonotone, MeasuredRuntimeCostsArePartOfThePrediction) {
  graph::OpGraph g = tst::random_chain(5, 8);
  g.trace_batch_size = 8;
  cost::Devices d = cost::v100(2, 8);
  cost::CostModel plain_model(g, d);
  d.instruction_overhead_seconds = 1e-3;
  d.step_overhead_seconds = 0.5;
  cost::CostModel measured_model(g, d);
  const pt::Problem plain = pt::make_problem(plain_model, 8, 2, 2, 1e12, {});
  const pt::Problem measured = pt::make_problem(measured_model, 8, 2, 2, 1e12, {});
  std::vector<int> assignment(g.num_nodes());
  for (std::size_t v = 0; v < assignment.size(); ++v) assignment[v] = v < 4 ? 0 : 1;
  const pt::Evaluation a = pt::evaluate(plain, assignment), b = pt::evaluate(measured, assignment);
  // A forward and a backward instruction per micro-batch on the slowest stage, and the step's
  // fixed cost once: (M + depth - 1) x 2 ms + 0.5 s more.
  EXPECT_NEAR(b.bottleneck, a.bottleneck + 2e-3, 1e-15);
  EXPECT_NEAR(b.iteration_seconds(measured), a.iteration_seconds(plain) + (4 + 2 - 1) * 2e-3 + 0.5, 1e-12);
}
