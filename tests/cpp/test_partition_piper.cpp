// Piper's planner (partition/piper/): its DP against brute force over every chain of down-sets
// with every replica count on small graphs, the layer graph's limits and its error, and the
// "piper" partitioner end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "cost/presets.h"
#include "graph_builders.h"
#include "partition/group_stats.h"
#include "partition/partitioner.h"
#include "partition/partitioner_interface.h"
#include "partition/piper/layer_graph.h"
#include "partition/piper/piper.h"
#include "partition/recompute.h"
#include "partition/replica_allocation.h"
#include "test_partition_graphs.h"

namespace gp = graphpipe;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  gp::graph::OpGraph g;
  gp::cost::Devices devices;
  pt::Options options;
  gp::cost::CostModel model;
  pt::Problem problem;
  Case(gp::graph::OpGraph graph, int count, std::int64_t micro_batch, double limit)
      : g(std::move(graph)),
        devices(gp::cost::v100(count, 2)),
        options(opts()),
        model(g, devices, options.optimizer),
        problem(make(micro_batch, limit)) {}
  static pt::Options opts() {
    pt::Options o;
    o.replicate = true;
    o.partitioner = "piper";
    return o;
  }
  pt::Problem make(std::int64_t micro_batch, double limit) const {
    const pt::PartitionRequest request{.graph = g,
                                       .devices = devices,
                                       .options = options,
                                       .model = model,
                                       .batch_size = 16,
                                       .micro_batch_sizes = {micro_batch},
                                       .memory_limit = limit,
                                       .max_stages = std::min<int>(devices.count, static_cast<int>(g.num_nodes())),
                                       .chain = true};
    return request.problem(micro_batch);
  }
};

// One stage (a set of operators) on the replicas of `level`, holding `flight` micro-batches, priced
// from the operators with GroupStats and the cost layer's functions: its time, or infinity when it
// does not fit.
double stage_price(const pt::Problem& p, const std::vector<gp::graph::NodeId>& ops, int level, int flight) {
  std::vector<int> stamps(p.num_nodes(), 0);
  pt::GroupStats gs(p, stamps, 1);
  double compute = 0.0, forward = 0.0;
  for (auto v : ops) {
    gs.add(v);
    compute += level == 0 ? p.compute[v] : p.replicas->compute(level, v);
    forward += level == 0 ? p.forward[v] : p.replicas->forward(level, v);
  }
  if (gs.static_bytes > p.memory_limit) return kInf;
  const double f = p.replicas->row_fraction(level);
  const pt::StageMemory m =
      pt::stage_memory(gs.static_bytes, gs.act_bytes * f, gs.input_bytes * f, flight, p.memory_limit);
  if (m.bytes > p.memory_limit) return kInf;
  return pt::replica_stage_time(p, level, compute, gs.transfer, gs.cross_bytes, gs.params) + m.extra_seconds(forward);
}

// A chain's price: its slowest stage, stage k holding min(M, 1 + the devices of the stages after
// it) micro-batches (the DP's in-flight bound, piper.h).
double chain_price(const pt::Problem& p, const std::vector<std::vector<gp::graph::NodeId>>& stages,
                   const std::vector<int>& levels) {
  double slowest = 0.0;
  int later = 0;
  for (int k = static_cast<int>(stages.size()) - 1; k >= 0; --k) {
    const int flight = static_cast<int>(std::min<std::int64_t>(p.num_micro_batches, 1 + later));
    slowest = std::max(slowest, stage_price(p, stages[k], levels[k], flight));
    later += p.replicas->replicas(levels[k]);
  }
  return slowest;
}

// brute[m]: the least price of any chain of down-sets (every stage a difference of two nested
// down-sets of the operator graph, every replica level) on at most m devices.
std::vector<double> brute_force(const pt::Problem& p, int budget) {
  const int n = static_cast<int>(p.num_nodes());
  std::vector<unsigned> preds(n, 0);
  for (const auto& e : p.graph->edges()) preds[e.dst] |= 1u << e.src;
  auto is_downset = [&](unsigned s) {
    for (int v = 0; v < n; ++v) {
      if ((s >> v & 1) && (preds[v] & ~s)) return false;
    }
    return true;
  };
  std::vector<double> best(budget + 1, kInf);
  std::vector<std::vector<gp::graph::NodeId>> stages;
  std::vector<int> levels;
  const unsigned all = (1u << n) - 1;
  auto walk = [&](auto& self, unsigned done, int used) -> void {
    if (done == all) {
      const double price = chain_price(p, stages, levels);
      for (int m = used; m <= budget; ++m) best[m] = std::min(best[m], price);
      return;
    }
    for (unsigned next = all; next; next = (next - 1) & all) {
      if ((next & done) != done || next == done || !is_downset(next)) continue;
      std::vector<gp::graph::NodeId> ops;
      for (auto v : p.order) {
        if ((next & ~done) >> v & 1) ops.push_back(v);
      }
      for (int l = 0; l < p.replicas->num_levels(); ++l) {
        const int r = p.replicas->replicas(l);
        if (used + r > budget) break;
        stages.push_back(ops);
        levels.push_back(l);
        self(self, next, used + r);
        stages.pop_back();
        levels.pop_back();
      }
    }
  };
  walk(walk, 0u, 0);
  return best;
}

// A returned chain as stages (labels in chain order) and levels, checking that each stage is a
// down-set difference in chain order and that the replica counts are levels' counts.
void split_chain(const pt::Problem& p, const pt::ChainPlan& chain, std::vector<std::vector<gp::graph::NodeId>>& stages,
                 std::vector<int>& levels, int& devices) {
  const int k = static_cast<int>(chain.replicas.size());
  stages.assign(k, {});
  for (auto v : p.order) {
    ASSERT_GE(chain.assignment[v], 0);
    ASSERT_LT(chain.assignment[v], k);
    stages[chain.assignment[v]].push_back(v);
  }
  for (const auto& e : p.graph->edges()) {
    EXPECT_LE(chain.assignment[e.src], chain.assignment[e.dst]) << "an edge goes back along the chain";
  }
  levels.clear();
  devices = 0;
  for (int r : chain.replicas) {
    const int l = p.replicas->level_of(r);
    EXPECT_EQ(p.replicas->replicas(l), r) << "replica count " << r << " is not a level's";
    levels.push_back(l);
    devices += r;
  }
}

void expect_optimal(const Case& c) {
  const pt::Problem& p = c.problem;
  const int budget = p.device_budget;
  const pt::piper::LayerGraph layers = pt::piper::build_layer_graph(p);
  // Small graphs: every operator its own layer (the finest layer graph).
  ASSERT_EQ(layers.units.size(), p.num_nodes());
  const std::vector<double> brute = brute_force(p, budget);
  const std::vector<pt::ChainPlan> chains = pt::piper_plans(p, layers);
  std::vector<double> found(budget + 1, kInf);
  for (const pt::ChainPlan& chain : chains) {
    std::vector<std::vector<gp::graph::NodeId>> stages;
    std::vector<int> levels;
    int devices = 0;
    split_chain(p, chain, stages, levels, devices);
    ASSERT_LE(devices, budget);
    const double price = chain_price(p, stages, levels);
    for (int m = devices; m <= budget; ++m) found[m] = std::min(found[m], price);
  }
  int finite = 0;
  for (int m = 1; m <= budget; ++m) {
    if (brute[m] == kInf) {
      EXPECT_EQ(found[m], kInf) << m << " devices";
      continue;
    }
    ++finite;
    EXPECT_NEAR(found[m], brute[m], 1e-12 * brute[m]) << m << " devices";
  }
  EXPECT_GT(finite, 0);
}

}  // namespace

TEST(PartitionPiper, DpFindsTheBruteForceOptimum) {
  int cases = 0;
  for (unsigned seed = 1; seed <= 6; ++seed) {
    for (int count : {2, 4}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(count) + " devices");
      expect_optimal(Case(tst::random_dag(seed, 6), count, 4, gp::cost::v100(1).memory_bytes));
      expect_optimal(Case(tst::random_sp_graph(seed, 7), count, 8, gp::cost::v100(1).memory_bytes));
      cases += 2;
    }
  }
  EXPECT_EQ(cases, 24);
}

// Under a limit that only some layouts fit, the in-flight bound decides: still the optimum.
TEST(PartitionPiper, DpFindsTheOptimumUnderATightMemoryLimit) {
  int bound = 0;
  for (unsigned seed = 1; seed <= 6; ++seed) {
    Case loose(tst::random_sp_graph(seed, 7), 4, 8, gp::cost::v100(1).memory_bytes);
    double total = 0.0;
    for (double s : loose.problem.static_bytes) total += s;
    Case tight(tst::random_sp_graph(seed, 7), 4, 8, 0.45 * total + 1e6);
    SCOPED_TRACE("seed " + std::to_string(seed));
    expect_optimal(tight);
    const std::vector<double> a = brute_force(loose.problem, 4), b = brute_force(tight.problem, 4);
    if (b[4] > a[4]) ++bound;
  }
  EXPECT_GT(bound, 0) << "the tight limit never changed the optimum: the test does not test memory";
}

// A graph wider than the budget's down-sets: 10 independent branches from one source to one
// sink have 2^10 + 2 down-sets even with each branch as one layer.
TEST(PartitionPiper, TooWideGraphNamesTheLimit) {
  std::vector<std::pair<std::string, std::string>> edges;
  for (int b = 0; b < 10; ++b) {
    edges.push_back({"src", "a" + std::to_string(b)});
    edges.push_back({"a" + std::to_string(b), "b" + std::to_string(b)});
    edges.push_back({"b" + std::to_string(b), "sink"});
  }
  Case c(tst::graph_of(edges), 4, 4, gp::cost::v100(1).memory_bytes);
  bool whole_branches = false;
  for (const auto& lg : pt::piper::build_layer_graphs(c.problem, 2048)) whole_branches |= lg.units.size() == 12;
  EXPECT_TRUE(whole_branches) << "no layer graph with each branch one layer";
  try {
    pt::piper::build_layer_graph(c.problem, 1000);
    FAIL() << "a graph of 1026 down-sets planned within 1000";
  } catch (const gp::PlanningError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("too wide for Piper's down-set DP"), std::string::npos) << what;
    EXPECT_NE(what.find("more than 1000 down-sets"), std::string::npos) << what;
  }
}

// Chains are cut into pieces when the whole graph's operators are too many down-sets: two
// branches of 20 operators (441 down-sets) within a budget of 150 become pieces.
TEST(PartitionPiper, LongBranchesAreCutIntoPieces) {
  std::vector<std::pair<std::string, std::string>> edges;
  for (const std::string b : {"x", "y"}) {
    edges.push_back({"src", b + "0"});
    for (int i = 0; i + 1 < 20; ++i) edges.push_back({b + std::to_string(i), b + std::to_string(i + 1)});
    edges.push_back({b + "19", "sink"});
  }
  Case c(tst::graph_of(edges), 4, 4, gp::cost::v100(1).memory_bytes);
  const std::vector<pt::piper::LayerGraph> all = pt::piper::build_layer_graphs(c.problem, 150);
  const auto by_module = std::find_if(all.begin(), all.end(), [](const auto& l) { return l.module_depth >= 0; });
  ASSERT_NE(by_module, all.end());
  const pt::piper::LayerGraph& lg = *by_module;
  EXPECT_LE(lg.downsets.size(), 150u);
  EXPECT_GT(lg.pieces_per_chain, 1);
  // Every unit is convex in the operator graph and the units cover every operator once.
  std::size_t covered = 0;
  for (const auto& unit : lg.units) covered += unit.size();
  EXPECT_EQ(covered, c.g.num_nodes());
  for (const auto& e : c.g.edges()) {
    if (lg.unit_of[e.src] != lg.unit_of[e.dst]) {
      EXPECT_TRUE(lg.preds[lg.unit_of[e.dst]] >> lg.unit_of[e.src] & 1);
    }
  }
}

// End to end through partition(): valid chain plans whose stages' devices fit the budget, with
// and without replication; the plan records its devices' nodes.
TEST(PartitionPiper, PartitionerPlansValidChains) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const gp::graph::OpGraph g = tst::random_sp_graph(seed, 12);
    for (bool replicate : {false, true}) {
      pt::Options o;
      o.partitioner = "piper";
      o.replicate = replicate;
      o.batch_size = 16;
      const gp::plan::Plan plan = pt::partition(g, gp::cost::v100(4, 2), o);
      EXPECT_EQ(plan.partitioner, "piper");
      EXPECT_TRUE(plan.chain);
      EXPECT_EQ(tst::check_plan(plan, g, 4), "");
      int used = 0;
      for (const auto& st : plan.stages) used += static_cast<int>(st.devices.size());
      EXPECT_LE(used, 4);
      if (!replicate) {
        for (const auto& st : plan.stages) EXPECT_EQ(st.devices.size(), 1u);
      }
      EXPECT_EQ(plan.device_nodes, (std::vector<int>{0, 0, 1, 1}));
    }
  }
}

// A model input and an operator without arithmetic that feeds one operator (an indexing) are no
// layers: they join their consumer's unit, so DLRM-like models' many inputs and slices do not
// multiply the down-sets.
TEST(PartitionPiper, InputsAndSlicesJoinTheirConsumer) {
  gp::graph::OpGraph g =
      tst::graph_of({{"in", "get0"}, {"in", "get1"}, {"get0", "a"}, {"get1", "b"}, {"a", "c"}, {"b", "c"}});
  g.mutable_node(*g.find("in")).is_input = true;
  for (const char* name : {"in", "get0", "get1"}) g.mutable_node(*g.find(name)).forward_flops = 0.0;
  Case c(std::move(g), 2, 4, gp::cost::v100(1).memory_bytes);
  const auto& graph = c.g;
  const std::vector<pt::piper::LayerGraph> all = pt::piper::build_layer_graphs(c.problem);
  ASSERT_FALSE(all.empty());
  const auto by_module = std::find_if(all.begin(), all.end(), [](const auto& l) { return l.module_depth >= 0; });
  ASSERT_NE(by_module, all.end());
  const pt::piper::LayerGraph& lg = *by_module;
  auto unit = [&](const char* name) { return lg.unit_of[*graph.find(name)]; };
  EXPECT_EQ(unit("get0"), unit("a"));
  EXPECT_EQ(unit("get1"), unit("b"));
  EXPECT_EQ(unit("in"), unit("a"));  // its first consumer's
  EXPECT_NE(unit("a"), unit("b"));
  EXPECT_EQ(lg.units.size(), 3u);
  // The input rides with a, so b's unit follows a's: {}, {a}, {a, b}, all.
  EXPECT_EQ(lg.downsets.size(), 4u);
}
