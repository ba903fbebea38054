// The default search (planner/default_search.h): replicate not given plans with replicas allowed
// under the widened search, exactly as asking for it by hand; replicate given runs the search as
// given; a partitioner that places by the user runs without replicas; and where the replicated
// planning refuses, the plan without replicas stands.
#include <gtest/gtest.h>

#include <optional>

#include "common/error.h"
#include "cost/presets.h"
#include "partition/options.h"
#include "plan/plan_io.h"
#include "planner/default_search.h"
#include "planner/planner.h"
#include "test_partition_graphs.h"

namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace pl = graphpipe::planner;
namespace tst = graphpipe::testing;

namespace {

std::string plan_text(const graphpipe::plan::Plan& plan, const graphpipe::graph::OpGraph& g) {
  return graphpipe::plan::to_json(plan, g).dump();
}

}  // namespace

TEST(DefaultSearch, WidenedSearchSetsTheDefaultsBudgets) {
  pl::PlannerOptions given;
  given.min_devices = 3;
  const pl::PlannerOptions widened = pl::widened_search(given);
  EXPECT_EQ(widened.plain_budget_limit, 0);
  EXPECT_EQ(widened.plain_every_up_to, 16);
  EXPECT_TRUE(widened.grow_replicas);
  EXPECT_EQ(widened.min_devices, 3);  // the rest as given
}

TEST(DefaultSearch, NotGivenIsTheWidenedReplicatedSearchAndGivenIsAsAsked) {
  graphpipe::graph::OpGraph g = tst::random_sp_graph(77, 16);
  g.trace_batch_size = 64;
  const cost::Devices devices = cost::v100(8, 4);
  pt::Options o;
  const pl::PlannerOptions search;
  const auto by_default = pl::plan_with_replication(g, devices, o, search, std::nullopt);
  pt::Options replicated = o;
  replicated.replicate = true;
  const auto by_hand = pl::plan_by_simulation(g, devices, replicated, pl::widened_search(search));
  EXPECT_EQ(plan_text(by_default.plan, g), plan_text(by_hand.plan, g));
  for (const bool replicate : {false, true}) {
    pt::Options asked = o;
    asked.replicate = replicate;
    EXPECT_EQ(plan_text(pl::plan_with_replication(g, devices, o, search, replicate).plan, g),
              plan_text(pl::plan_by_simulation(g, devices, asked, search).plan, g));
  }
}

TEST(DefaultSearch, RefusedReplicasLeaveThePlanWithoutThem) {
  // A refusal of the replicated search alone: PowerSGD prices replicas by parameter shapes, and
  // this graph has none (a plan without replicas syncs nothing).
  graphpipe::graph::OpGraph g = tst::random_sp_graph(78, 12);
  g.trace_batch_size = 32;
  for (std::size_t v = 0; v < g.num_nodes(); ++v) {
    g.mutable_node(static_cast<graphpipe::graph::NodeId>(v)).param_shapes.clear();
  }
  const cost::Devices devices = cost::v100(4, 4);
  pt::Options o;
  o.sync.kind = cost::SyncKind::power_sgd;
  pt::Options replicated = o;
  replicated.replicate = true;
  EXPECT_THROW(pl::plan_by_simulation(g, devices, replicated, pl::widened_search({})), graphpipe::PlanningError);
  pt::Options plain = o;
  const auto fallback = pl::plan_with_replication(g, devices, o, {}, std::nullopt);
  EXPECT_EQ(plan_text(fallback.plan, g), plan_text(pl::plan_by_simulation(g, devices, plain, {}).plan, g));
}
