// Property tests over thousands of seeded random DAGs, series-parallel and not, for every
// automatic partitioner: each operator in exactly one stage, stages convex, the stage graph
// acyclic, no more stages than devices, the memory limit respected or a clear "does not fit"
// error, and the same seed giving the same plan.
#include <gtest/gtest.h>

#include <chrono>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/partitioner.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace tst = graphpipe::testing;
using graphpipe::PlanningError;
using graphpipe::partition::Options;
using graphpipe::plan::dumps;
using graphpipe::plan::Plan;
using graphpipe::plan::validate_plan;

namespace {

struct Tally {
  int plans = 0, does_not_fit = 0, parallel_stages = 0;
};

void run_case(unsigned seed, const std::string& partitioner, Tally& tally) {
  std::mt19937 rng(seed * 7919u + 17u);
  const bool sp = seed % 2 == 0;
  const int n = 2 + static_cast<int>(rng() % 30);
  graph::OpGraph g = sp ? tst::random_sp_graph(seed, n) : tst::random_dag(seed, n);
  const int devices = 1 + static_cast<int>(rng() % std::min<int>(8, static_cast<int>(g.num_nodes())));
  cost::Devices d = cost::v100(devices);
  Options o;
  o.partitioner = partitioner;
  o.batch_size = 8;
  o.optimizer = cost::Optimizer::adam;
  // A third of the cases get a tight limit: around what one device would need for its share.
  double total_static = 4.0 * static_cast<double>(g.total_param_bytes());
  if (rng() % 3 == 0) o.memory_limit = std::max(1e6, total_static / devices * (0.5 + (rng() % 100) / 100.0));
  SCOPED_TRACE(partitioner + " seed " + std::to_string(seed) + (sp ? " (sp)" : " (dag)") +
               " n=" + std::to_string(g.num_nodes()) + " devices=" + std::to_string(devices));
  try {
    Plan plan = gp::partition::partition(g, d, o);
    ++tally.plans;
    EXPECT_EQ(tst::check_plan(plan, g, devices), "");
    EXPECT_NO_THROW(validate_plan(plan, g));
    const double limit = o.memory_limit > 0 ? o.memory_limit : d.memory_bytes;
    for (const auto& st : plan.stages) EXPECT_LE(st.memory_bytes, limit * (1 + 1e-9));
    if (plan.depth < static_cast<int>(plan.stages.size())) ++tally.parallel_stages;
    if (seed % 8 == 0) {  // determinism on a subset: same input, same plan
      Plan again = gp::partition::partition(g, d, o);
      EXPECT_EQ(dumps(plan, g), dumps(again, g));
    }
  } catch (const PlanningError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("does not fit"), std::string::npos) << message;
    EXPECT_NE(message.find("over by"), std::string::npos) << message;
    ++tally.does_not_fit;
  }
}

void run_many(const std::string& partitioner, unsigned count) {
  Tally tally;
  auto start = std::chrono::steady_clock::now();
  for (unsigned seed = 0; seed < count; ++seed) run_case(seed, partitioner, tally);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %u graphs, %d plans (%d with parallel stages), %d do-not-fit errors, %.2f s\n", partitioner.c_str(),
              count, tally.plans, tally.parallel_stages, tally.does_not_fit, seconds);
  EXPECT_GT(tally.plans, static_cast<int>(count) / 2);
}

}  // namespace

TEST(PartitionProperties, GraphpipeOnRandomGraphs) { run_many("graphpipe", 1500); }
TEST(PartitionProperties, MetisOnRandomGraphs) { run_many("metis", 1500); }
TEST(PartitionProperties, SequentialOnRandomGraphs) { run_many("sequential", 1500); }

// Sequential stages are contiguous runs of one topological order (consecutive runs that happen
// not to depend on each other keep their true, shorter stage graph).
TEST(PartitionProperties, SequentialCutsOneTopologicalOrder) {
  int chains = 0;
  for (unsigned seed = 0; seed < 200; ++seed) {
    auto g = tst::random_dag(seed, 20);
    Options o;
    o.partitioner = "sequential";
    o.batch_size = 8;
    Plan plan = gp::partition::partition(g, cost::v100(4), o);
    auto order = g.topological_order();
    std::size_t at = 0;
    for (const auto& st : plan.stages) {
      for (auto v : st.nodes) EXPECT_EQ(order[at++], v) << "seed " << seed;
    }
    if (plan.depth == static_cast<int>(plan.stages.size())) ++chains;
  }
  EXPECT_GT(chains, 150);
}
