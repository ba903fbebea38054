// Activation recomputation in the DPs (partition/recompute.h): under a memory limit that no
// plan meets with all its stages' activations, the graphpipe tree DP, the sequential DP and the
// exact down-set DP each find the plan that fits only by recomputing its first stage, and it is
// the best plan exhaustive search finds under the evaluation's own rule (so the DPs time and
// size recomputed stages as evaluate() does). With a generous limit nothing is recomputed.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cost/presets.h"
#include "graph/series_parallel.h"
#include "partition/downset.h"
#include "partition/evaluate.h"
#include "partition/graphpipe_dp.h"
#include "partition/options.h"
#include "partition/partitioner.h"
#include "partition/problem.h"
#include "partition/recompute.h"
#include "partition/sequential.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

constexpr int kOps = 8;
constexpr std::int64_t kBatch = 16, kMicro = 4;  // 4 micro-batches: stage 0 of two holds 2

// A chain of kOps equal operators with large outputs and small weights: memory is activations.
graph::OpGraph wide_chain() {
  graph::OpGraph g;
  for (int i = 0; i < kOps; ++i) {
    graph::Node n;
    n.name = "op" + std::to_string(i);
    n.op = "call_module";
    n.target = "Op";
    n.module = "m" + std::to_string(i);
    n.forward_flops = 2e9;
    n.param_bytes = 1000;
    n.output_bytes = 4e6;
    g.add_node(n);
    if (i > 0) g.add_edge(i - 1, i, 4e6);
  }
  g.trace_batch_size = kBatch;
  return g;
}

// The assignment of the chain cut after `first` operators (one stage when first == kOps).
std::vector<int> cut(int first) {
  std::vector<int> a(kOps, 0);
  for (int i = first; i < kOps; ++i) a[i] = 1;
  return a;
}

struct Chain {
  graph::OpGraph g = wide_chain();
  cost::CostModel model{g, cost::v100(2)};
  double limit = 0.0;
  double best_step = 0.0;
  int best_cut = -1;
};

// The limit halfway between the least memory any cut needs with recomputation and the least it
// needs without: only recomputed plans fit.
void choose_limit(Chain& s) {
  const pt::Problem roomy = pt::make_problem(s.model, kBatch, kMicro, 2, 1e18, {});
  double least_plain = 1e300, least_recomputed = 1e300;
  for (int first = 1; first <= kOps; ++first) {
    const pt::Evaluation ev = pt::evaluate(roomy, cut(first));
    double plain = 0.0, recomputed = 0.0;
    for (const pt::StageFigures& f : ev.stages) {
      ASSERT_FALSE(f.recompute);
      plain = std::max(plain, f.memory);
      const double kept = f.static_bytes + f.input_bytes * f.in_flight + f.activation_bytes;
      recomputed = std::max(recomputed, std::min(f.memory, kept));
    }
    least_plain = std::min(least_plain, plain);
    least_recomputed = std::min(least_recomputed, recomputed);
  }
  ASSERT_LT(least_recomputed, least_plain);
  s.limit = 0.5 * (least_plain + least_recomputed);
}

// Exhaustive search over every plan of the chain on at most two devices (a cut, or one stage),
// by evaluate() at the limit.
void exhaustive(Chain& s, const pt::Problem& p) {
  s.best_step = 0.0;
  for (int first = 1; first <= kOps; ++first) {
    const pt::Evaluation ev = pt::evaluate(p, cut(first));
    if (!ev.fits()) continue;
    const double step = ev.iteration_seconds(p);
    if (s.best_cut < 0 || step < s.best_step) {
      s.best_step = step;
      s.best_cut = first;
    }
  }
}

// A DP's plan: it fits, its first stage is recomputed, and its step is exhaustive search's.
void expect_recomputed_optimum(const Chain& s, const pt::Problem& p, const std::vector<int>& assignment,
                               double tolerance, const char* who) {
  ASSERT_EQ(assignment.size(), static_cast<std::size_t>(kOps)) << who << " found no plan";
  const pt::Evaluation ev = pt::evaluate(p, assignment);
  ASSERT_TRUE(ev.fits()) << who;
  ASSERT_EQ(ev.num_stages, 2) << who;
  EXPECT_TRUE(ev.stages[0].recompute) << who;
  EXPECT_FALSE(ev.stages[1].recompute) << who;
  EXPECT_NEAR(ev.iteration_seconds(p), s.best_step, tolerance * s.best_step) << who;
}

}  // namespace

TEST(PartitionRecompute, SharedRuleRecomputesOnlyWhatDoesNotFit) {
  // 10 static, 4 per micro-batch of which 1 received, 3 in flight: 22 bytes, or 10 + 3 + 4 = 17.
  EXPECT_FALSE(pt::stage_memory(10, 4, 1, 3, 22).recompute);
  EXPECT_DOUBLE_EQ(pt::stage_memory(10, 4, 1, 3, 22).bytes, 22);
  const pt::StageMemory m = pt::stage_memory(10, 4, 1, 3, 20);
  EXPECT_TRUE(m.recompute);
  EXPECT_DOUBLE_EQ(m.bytes, 17);
  EXPECT_DOUBLE_EQ(m.extra_seconds(0.5), 0.5);
  // Still over the limit, but less: recomputed (the evaluation reports the smaller overflow).
  EXPECT_TRUE(pt::stage_memory(10, 4, 1, 3, 15).recompute);
  EXPECT_FALSE(pt::stage_fits(1.0, 0.5, 10, 4, 1, 3, 15, 10.0));
  // One micro-batch in flight: recomputing keeps as much, so never.
  EXPECT_FALSE(pt::stage_memory(10, 4, 1, 1, 12).recompute);
  // No limit (0): never.
  EXPECT_FALSE(pt::stage_memory(10, 4, 1, 3, 0).recompute);
  // Fits recomputed only when the extra forward still meets the target.
  EXPECT_TRUE(pt::stage_fits(1.0, 0.5, 10, 4, 1, 3, 20, 1.5));
  EXPECT_FALSE(pt::stage_fits(1.0, 0.5, 10, 4, 1, 3, 20, 1.49));
}

TEST(PartitionRecompute, DpsFindPlansThatFitOnlyRecomputed) {
  Chain s;
  choose_limit(s);
  const pt::Problem p = pt::make_problem(s.model, kBatch, kMicro, 2, s.limit, {});
  exhaustive(s, p);
  ASSERT_GT(s.best_cut, 0) << "no plan fits even with recomputation";
  ASSERT_LT(s.best_cut, kOps);

  expect_recomputed_optimum(s, p, pt::sequential_assignment(p), 1e-12, "sequential");
  const auto sp = graph::decompose_series_parallel(s.g);
  ASSERT_TRUE(sp.is_series_parallel);
  const auto plans = pt::graphpipe_assignments(p, sp.tree, 1e-6);
  ASSERT_FALSE(plans.empty()) << "graphpipe DP found no plan";
  expect_recomputed_optimum(s, p, plans.front(), 1e-5, "graphpipe DP");
  const auto exact = pt::downset_plans(p);
  ASSERT_FALSE(exact.empty()) << "down-set DP found no plan";
  double least = 1e300;
  std::vector<int> fastest;
  for (const auto& a : exact) {
    const double step = pt::evaluate(p, a).iteration_seconds(p);
    if (step < least) least = step, fastest = a;
  }
  expect_recomputed_optimum(s, p, fastest, 1e-12, "down-set DP");

  // Through the driver: every partitioner's plan at this micro-batch size marks stage 0.
  for (const char* name : {"graphpipe", "sequential"}) {
    pt::Options o;
    o.partitioner = name;
    o.batch_size = kBatch;
    o.micro_batch_size = kMicro;
    o.memory_limit = s.limit;
    o.optimizer = cost::Optimizer::adam;
    const pt::Plan plan = pt::partition(s.g, cost::v100(2), o);
    ASSERT_EQ(plan.stages.size(), 2u) << name;
    EXPECT_TRUE(plan.stages[0].recompute) << name;
    EXPECT_FALSE(plan.stages[1].recompute) << name;
    EXPECT_NEAR(plan.predicted_iteration_seconds, s.best_step, 1e-5 * s.best_step) << name;
  }
}

TEST(PartitionRecompute, GenerousLimitRecomputesNothing) {
  for (int seed = 0; seed < 12; ++seed) {
    const auto g = seed % 2 ? tst::random_sp_graph(700 + seed, 10 + seed) : tst::random_dag(700 + seed, 10 + seed);
    for (const char* name : {"graphpipe", "sequential"}) {
      pt::Options o;
      o.partitioner = name;
      o.memory_limit = 1e15;
      const pt::Plan plan = pt::partition(g, cost::v100(4), o);
      for (const pt::Stage& st : plan.stages) EXPECT_FALSE(st.recompute) << name << " seed " << seed;
    }
  }
}
