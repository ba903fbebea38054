// Activation recomputation in the DPs (partition/recompute.h): under a memory limit that no
// plan meets with all its stages' activations, the graphpipe tree DP, the sequential DP and the
// exact down-set DP each find the plan that fits only by recomputing its first stage, and it is
// the best plan exhaustive search finds under the evaluation's own rule (so the DPs time and
// size recomputed stages as evaluate() does). With a generous limit nothing is recomputed. The
// same for replicated problems: the replicated graphpipe and sequential DPs find a plan that fits
// only by recomputing a replicated stage (each replica holding its shard's activations and
// received tensors), close to exhaustive search over layouts and replica counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cost/presets.h"
#include "graph/series_parallel.h"
#include "partition/downset/downset.h"
#include "partition/evaluate.h"
#include "partition/options.h"
#include "partition/partitioner.h"
#include "partition/problem.h"
#include "partition/recompute.h"
#include "partition/replicas.h"
#include "partition/sequential/sequential.h"
#include "partition/series_parallel_dp/graphpipe_dp.h"
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
    const graphpipe::plan::Plan plan = pt::partition(s.g, cost::v100(2), o);
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
      const graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), o);
      for (const graphpipe::plan::Stage& st : plan.stages) EXPECT_FALSE(st.recompute) << name << " seed " << seed;
    }
  }
}

namespace {

constexpr int kRepOps = 6, kRepDevices = 4;

// A chain of equal operators whose parameters make the whole model too big for one device (so
// plain data parallelism is out) and whose wide outputs make activations most of a stage's
// memory; cheap to all-reduce on V100 links, so replicas pay.
graph::OpGraph replicated_chain() {
  graph::OpGraph g;
  for (int i = 0; i < kRepOps; ++i) {
    graph::Node n;
    n.name = "op" + std::to_string(i);
    n.op = "call_module";
    n.target = "Op";
    n.module = "m" + std::to_string(i);
    n.forward_flops = 4e10;
    n.param_bytes = 2e6;
    n.output_bytes = 8e6;
    g.add_node(n);
    if (i > 0) g.add_edge(i - 1, i, 8e6);
  }
  g.trace_batch_size = kBatch;
  return g;
}

pt::Problem replicated_problem(const cost::CostModel& model, double limit) {
  pt::Problem p = pt::make_problem(model, kBatch, kMicro, kRepDevices, limit, {});
  p.replicas = std::make_shared<const pt::ReplicaTable>(model, kMicro, kRepDevices);
  p.device_budget = kRepDevices;
  return p;
}

// Calls visit(assignment, replicas) for every cut of the chain into contiguous stages with every
// replica vector of at most kRepDevices devices in all.
void every_replicated_plan(const std::function<void(const std::vector<int>&, const std::vector<int>&)>& visit) {
  for (int mask = 0; mask < (1 << (kRepOps - 1)); ++mask) {
    std::vector<int> a(kRepOps, 0);
    for (int i = 1; i < kRepOps; ++i) a[i] = a[i - 1] + ((mask >> (i - 1)) & 1);
    const int stages = a.back() + 1;
    if (stages > kRepDevices) continue;
    std::vector<int> r(stages, 1);
    auto count = [&](auto& self, int s, int left) -> void {
      if (s == stages) return visit(a, r);
      for (int x = 1; x <= left - (stages - s - 1); ++x) {
        r[s] = x;
        self(self, s + 1, left - x);
      }
    };
    count(count, 0, kRepDevices);
  }
}

bool recomputes_a_replicated_stage(const pt::Evaluation& ev) {
  return std::any_of(ev.stages.begin(), ev.stages.end(),
                     [](const pt::StageFigures& f) { return f.recompute && f.replicas > 1; });
}

}  // namespace

TEST(PartitionRecompute, ReplicatedDpsFindPlansThatFitOnlyRecomputed) {
  const graph::OpGraph g = replicated_chain();
  const cost::CostModel model{g, cost::v100(kRepDevices)};
  // The limit halfway between the least memory any plan needs with recomputation and the least
  // it needs without: only plans with a recomputed stage fit.
  double least_plain = 1e300, least_recomputed = 1e300;
  {
    const pt::Problem roomy = replicated_problem(model, 1e18);
    every_replicated_plan([&](const std::vector<int>& a, const std::vector<int>& r) {
      const pt::Evaluation ev = pt::evaluate(roomy, a, r);
      double plain = 0.0, recomputed = 0.0;
      for (const pt::StageFigures& f : ev.stages) {
        plain = std::max(plain, f.memory);
        recomputed = std::max(
            recomputed, pt::stage_memory(f.static_bytes, f.activation_bytes, f.input_bytes, f.in_flight, 1.0).bytes);
      }
      least_plain = std::min(least_plain, plain);
      least_recomputed = std::min(least_recomputed, recomputed);
    });
  }
  ASSERT_LT(least_recomputed, least_plain);
  const double limit = 0.5 * (least_plain + least_recomputed);
  const pt::Problem p = replicated_problem(model, limit);
  double best = std::numeric_limits<double>::infinity();
  pt::Evaluation best_ev;
  every_replicated_plan([&](const std::vector<int>& a, const std::vector<int>& r) {
    const pt::Evaluation ev = pt::evaluate(p, a, r);
    if (!ev.fits()) return;
    EXPECT_TRUE(std::any_of(ev.stages.begin(), ev.stages.end(), [](const pt::StageFigures& f) { return f.recompute; }));
    if (ev.iteration_seconds(p) < best) best = ev.iteration_seconds(p), best_ev = ev;
  });
  ASSERT_LT(best, std::numeric_limits<double>::infinity()) << "no plan fits even with recomputation";
  // The graph is built so that the best plan recomputes a replicated stage.
  ASSERT_TRUE(recomputes_a_replicated_stage(best_ev));

  auto check = [&](const std::vector<int>& assignment, const std::vector<int>& replicas, const char* who) {
    ASSERT_EQ(assignment.size(), static_cast<std::size_t>(kRepOps)) << who << " found no plan";
    const pt::Evaluation ev = pt::evaluate(p, assignment, replicas);
    ASSERT_TRUE(ev.fits()) << who;
    EXPECT_TRUE(recomputes_a_replicated_stage(ev)) << who;
    const double gap = ev.iteration_seconds(p) / best - 1.0;
    std::printf("%s: %d stages, step %.6g s, exhaustive %.6g s (gap %.2f%%)\n", who, ev.num_stages,
                ev.iteration_seconds(p), best, 100.0 * gap);
    EXPECT_GE(gap, -1e-9) << who;
    EXPECT_LE(gap, 0.10) << who;
  };
  const auto [seq, seq_replicas] = pt::sequential_replicated(p, 1e-6);
  check(seq, seq_replicas, "replicated sequential DP");
  const auto sp = graph::decompose_series_parallel(g);
  ASSERT_TRUE(sp.is_series_parallel);
  const auto plans = pt::graphpipe_plans(p, sp.tree, 1e-6);
  ASSERT_FALSE(plans.empty()) << "replicated graphpipe DP found no plan";
  check(plans.front().assignment, plans.front().replicas, "replicated graphpipe DP");

  // Through the driver, replicate on: the plan holds a recomputed replicated stage and fits.
  for (const char* name : {"graphpipe", "sequential"}) {
    pt::Options o;
    o.partitioner = name;
    o.replicate = true;
    o.batch_size = kBatch;
    o.micro_batch_size = kMicro;
    o.memory_limit = limit;
    const graphpipe::plan::Plan plan = pt::partition(g, cost::v100(kRepDevices), o);
    EXPECT_TRUE(std::any_of(plan.stages.begin(), plan.stages.end(), [](const graphpipe::plan::Stage& st) {
      return st.recompute && st.devices.size() > 1;
    })) << name;
    for (const graphpipe::plan::Stage& st : plan.stages) EXPECT_LE(st.memory_bytes, limit) << name;
  }
}

TEST(PartitionRecompute, ReplicatedGenerousLimitRecomputesNothing) {
  // A generous limit enters the replicated DPs only through memory checks that every stage
  // passes: the plans are those of an even larger one, and nothing is recomputed.
  for (int seed = 0; seed < 8; ++seed) {
    const auto g = seed % 2 ? tst::random_sp_graph(800 + seed, 10 + seed) : tst::random_dag(800 + seed, 10 + seed);
    for (const char* name : {"graphpipe", "sequential"}) {
      pt::Options o;
      o.partitioner = name;
      o.replicate = true;
      o.memory_limit = 1e15;
      const graphpipe::plan::Plan plan = pt::partition(g, cost::v100(4), o);
      o.memory_limit = 1e18;
      const graphpipe::plan::Plan larger = pt::partition(g, cost::v100(4), o);
      ASSERT_EQ(plan.stages.size(), larger.stages.size()) << name << " seed " << seed;
      for (std::size_t s = 0; s < plan.stages.size(); ++s) {
        EXPECT_FALSE(plan.stages[s].recompute) << name << " seed " << seed;
        EXPECT_EQ(plan.stages[s].nodes, larger.stages[s].nodes) << name << " seed " << seed;
        EXPECT_EQ(plan.stages[s].devices, larger.stages[s].devices) << name << " seed " << seed;
      }
    }
  }
}
