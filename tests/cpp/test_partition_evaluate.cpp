// The evaluator's step estimate: (M + depth - 1) x slowest stage plus the optimizer tail, the
// part of the stages' optimizer steps that outlasts the pipeline (evaluate.h).
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "cost/gradient_buckets.h"
#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/problem.h"

#include <algorithm>
#include <memory>

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;

namespace {

// x (input) -> a -> b, cut as {x, a} | {b}.
graph::OpGraph chain3(double b_param_bytes = 8000, double flops = 1e6) {
  graph::OpGraph g;
  for (const char* name : {"x", "a", "b"}) {
    graph::Node n;
    n.name = name;
    n.op = std::string(name) == "x" ? "input" : "call_module";
    n.forward_flops = flops;
    n.output_bytes = 64;
    n.param_bytes = std::string(name) == "b" ? b_param_bytes : 0;
    g.add_node(n);
  }
  g.add_edge(0, 1, 64);
  g.add_edge(1, 2, 64);
  g.trace_batch_size = 4;
  return g;
}

}  // namespace

TEST(PartitionEvaluate, OptimizerStepOverlapsTheBackwardUpstream) {
  auto g = chain3();
  cost::CostModel model(g, cost::v100(2));
  pt::Problem p = pt::make_problem(model, 4, 1, 2, 1e12, {});
  EXPECT_DOUBLE_EQ(p.optimizer[2], cost::kOptimizerTrafficFactor * 8000 / model.devices().memory_bandwidth);
  p.forward = {0.0, 1.0, 1.0};
  p.backward = {0.0, 2.0, 1.0};
  p.edge_seconds = {0.0, 0.0};
  // Stage 1 (b) steps for 5 s after its last backward, while stage 0 still runs 2 s of backward.
  p.optimizer = {0.0, 1.0, 5.0};
  pt::Evaluation ev = pt::evaluate(p, {0, 0, 1});
  ASSERT_TRUE(ev.acyclic);
  EXPECT_DOUBLE_EQ(ev.bottleneck, 3.0);
  EXPECT_DOUBLE_EQ(ev.optimizer_tail, 3.0);
  EXPECT_DOUBLE_EQ(ev.iteration_seconds(p), (4 + 2 - 1) * 3.0 + 3.0);
  // The source stage's step has nothing upstream to hide behind.
  p.optimizer = {0.0, 4.0, 5.0};
  EXPECT_DOUBLE_EQ(pt::evaluate(p, {0, 0, 1}).optimizer_tail, 4.0);
  // Short steps vanish behind the upstream backward: no tail.
  p.optimizer = {0.0, 0.0, 1.5};
  EXPECT_DOUBLE_EQ(pt::evaluate(p, {0, 0, 1}).optimizer_tail, 0.0);
}

TEST(PartitionEvaluate, ExposedSyncFollowsTheBucketCapAsked) {
  // One stage of everything on 2 replicas; b holds 4 MiB of parameters. With the default cap the
  // buckets are 1 MiB then 3 MiB, with a 1 MiB cap four of 1 MiB: the exposed tail of the sum is
  // the last bucket's share after the backward, as the simulator times it (cost::bucket_spans).
  const double mib = 1024.0 * 1024.0;
  auto g = chain3(4 * mib, 1e10);  // a backward far longer than the sum: the buckets never queue
  cost::CostModel model(g, cost::v100(2));
  auto tail_with = [&](double cap) {
    pt::Problem p = pt::make_problem(model, 4, 2, 2, 1e12, {});
    p.replicas = std::make_shared<const pt::ReplicaTable>(model, 2, 2);
    p.device_budget = 2;
    pt::set_sync(p, cost::SyncMethod{});
    p.bucket_bytes = cap;
    std::fill(p.optimizer.begin(), p.optimizer.end(), 0.0);
    const pt::Evaluation ev = pt::evaluate(p, {0, 0, 0}, {2}, {});
    EXPECT_GT(ev.stages[0].backward, 4.0 * ev.stages[0].all_reduce);
    EXPECT_DOUBLE_EQ(ev.optimizer_tail, cost::exposed_sync_seconds(ev.stages[0].all_reduce, ev.stages[0].backward,
                                                                   cost::bucket_sizes(4 * mib, cap)));
    return ev.optimizer_tail;
  };
  EXPECT_LT(tail_with(mib), tail_with(cost::kDefaultBucketBytes));
}

TEST(PartitionEvaluate, TheStepChargesTheWaitForTheSlowestRankOfTheBusiestRank) {
  // Three operators cut 2 + 1 on two devices: the estimate grows by the skew of the busier
  // rank's M x (forward + backward); one stage on one device waits for nobody.
  const double mib = 1024.0 * 1024.0;
  auto g = chain3(4 * mib, 1e10);
  auto step_with = [&](double skew, const std::vector<int>& labels) {
    cost::Devices d = cost::v100(2);
    d.rank_skew_fraction = skew;
    cost::CostModel model(g, d);
    pt::Problem p = pt::make_problem(model, 4, 2, 2, 1e12, {});
    const pt::Evaluation ev = pt::evaluate(p, labels);
    double busiest = 0.0;
    const auto m = static_cast<double>(p.num_micro_batches);
    for (const auto& st : ev.stages) busiest = std::max(busiest, m * (st.forward + st.backward + st.dispatch));
    return std::tuple{ev.iteration_seconds(p), busiest, ev.rank_skew_seconds(p)};
  };
  const auto [two, busiest, none] = step_with(0.0, {0, 0, 1});
  EXPECT_EQ(none, 0.0);
  const auto [skewed, busiest_again, wait] = step_with(0.05, {0, 0, 1});
  EXPECT_DOUBLE_EQ(busiest_again, busiest);
  EXPECT_DOUBLE_EQ(wait, 0.05 * busiest);
  EXPECT_NEAR(skewed, two + 0.05 * busiest, 1e-12);
  EXPECT_DOUBLE_EQ(std::get<0>(step_with(0.05, {0, 0, 0})), std::get<0>(step_with(0.0, {0, 0, 0})));
  // Folded: stages 0 and 2 on device 0, stage 1 on device 1: device 0's two stages add up.
  cost::Devices d = cost::v100(2);
  d.rank_skew_fraction = 0.05;
  cost::CostModel model(g, d);
  pt::Problem p = pt::make_problem(model, 4, 2, 3, 1e12, {});
  const pt::Evaluation folded = pt::evaluate(p, {0, 1, 2}, {}, {{0}, {1}, {0}});
  ASSERT_EQ(folded.stages.size(), 3U);
  const auto work = [&](int st) {
    const auto& s = folded.stages[st];
    return static_cast<double>(p.num_micro_batches) * (s.forward + s.backward + s.dispatch);
  };
  EXPECT_DOUBLE_EQ(folded.rank_skew_seconds(p), 0.05 * std::max(work(0) + work(2), work(1)));
}

TEST(PartitionEvaluate, ExposedSyncChargesTheOverlapLossOfTheDevices) {
  // The same stage on devices whose collectives share the backward's cores: the first bucket's
  // sum, which runs beside the backward, costs the tail that much again (loss 1), as the
  // simulator charges it (cost::overlap_loss_seconds).
  const double mib = 1024.0 * 1024.0;
  auto g = chain3(4 * mib, 1e10);
  auto tail_with = [&](double loss) {
    cost::Devices d = cost::v100(2);
    d.collective_overlap_loss = loss;
    cost::CostModel model(g, d);
    pt::Problem p = pt::make_problem(model, 4, 2, 2, 1e12, {});
    p.replicas = std::make_shared<const pt::ReplicaTable>(model, 2, 2);
    p.device_budget = 2;
    pt::set_sync(p, cost::SyncMethod{});
    std::fill(p.optimizer.begin(), p.optimizer.end(), 0.0);
    const pt::Evaluation ev = pt::evaluate(p, {0, 0, 0}, {2}, {});
    const double share = ev.stages[0].all_reduce / 4.0;  // the first bucket's: 1 MiB of 4
    return std::pair{ev.optimizer_tail, share};
  };
  const auto [free_tail, share] = tail_with(0.0);
  EXPECT_NEAR(tail_with(1.0).first, free_tail + share, 1e-12);
  EXPECT_NEAR(tail_with(2.5).first, free_tail + 2.5 * share, 1e-12);
}
