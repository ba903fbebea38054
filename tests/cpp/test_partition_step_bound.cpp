// step_lower_bound (partition/step_bound.h): never above the predicted step of any layout with
// any replica counts, 1F1B or zero-bubble, on tiny graphs searched exhaustively; and partition(),
// which skips the micro-batch sizes whose bound is above a plan already found, returns the plan
// that planning every size gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/partitioner.h"
#include "partition/step_bound.h"
#include "plan/plan_io.h"
#include "test_partition_graphs.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;
namespace tst = graphpipe::testing;

namespace {

// The least predicted step over every layout of at most `devices` stages and, on a replicated
// problem, every replica vector of at most `devices` devices in all, fitting in memory or not
// (the bound ignores memory).
double least_step(const pt::Problem& p, int devices) {
  double best = std::numeric_limits<double>::infinity();
  tst::for_each_replicated_layout(p, devices, devices,
                                  [&](const std::vector<int>& assignment, const std::vector<int>& replicas) {
                                    best = std::min(best, pt::evaluate(p, assignment, replicas).iteration_seconds(p));
                                  });
  return best;
}

}  // namespace

TEST(StepBound, NeverAboveAnyLayoutOrReplicaCount) {
  double tightest = 0.0;
  int compared = 0;
  for (unsigned seed = 1; seed <= 36; ++seed) {
    std::mt19937 rng(seed * 31u + 7u);
    const int n = 4 + static_cast<int>(rng() % 3);
    graph::OpGraph g = tst::random_graph_of_kind(seed % 3, seed, n);
    const int devices = 1 + static_cast<int>(rng() % 4);
    const std::int64_t mb = std::int64_t{1} << (rng() % 4);  // 1, 2, 4 or 8 of 16 rows
    const bool replicated = rng() % 2 == 0;
    cost::Devices d = cost::v100(devices);
    d.instruction_overhead_seconds = 20e-6;
    d.step_overhead_seconds = 1e-4;
    cost::CostModel model(g, d);
    pt::Problem p = pt::make_problem(model, 16, mb, std::min<int>(devices, n), 1e15, {});
    p.zero_bubble = seed % 4 == 0;
    if (replicated) {
      p.replicas = std::make_shared<const pt::ReplicaTable>(model, mb, devices);
      p.device_budget = devices;
    }
    const double least = least_step(p, devices);
    const double bound = pt::step_lower_bound(p);
    SCOPED_TRACE("seed " + std::to_string(seed) + " n " + std::to_string(n) + " devices " + std::to_string(devices) +
                 " micro-batch " + std::to_string(mb) + (replicated ? " replicated" : "") +
                 (p.zero_bubble ? " zero-bubble" : ""));
    ASSERT_LT(least, std::numeric_limits<double>::infinity());
    EXPECT_GT(bound, 0.0);
    EXPECT_LE(bound, least * (1.0 + 1e-12)) << "bound " << bound << " s above the least step " << least << " s";
    tightest = std::max(tightest, bound / least);
    ++compared;
  }
  std::printf("step_lower_bound over %d exhaustive searches: at most %.3f of the least step\n", compared, tightest);
}

TEST(StepBound, SkippingMicroBatchSizesLeavesThePlanAsPlanningEverySize) {
  // The plan partition() returns against the best of the plans at each size planned alone (the
  // driver's own rule: the least predicted step, ties to the smaller size). The cases must
  // include sizes that the bound rules out, or the skipping was never exercised.
  int ruled_out = 0;
  for (unsigned seed = 1; seed <= 16; ++seed) {
    const int n = 12 + static_cast<int>(seed % 5) * 6;
    graph::OpGraph g = seed % 2 ? tst::random_sp_graph(seed, n) : tst::random_chain(seed, n);
    const int devices = 2 + static_cast<int>(seed % 4) * 2;
    cost::Devices d = cost::v100(devices);
    pt::Options o;
    o.partitioner = seed % 3 == 0 ? "sequential" : "graphpipe";
    o.batch_size = 32;
    o.replicate = seed % 4 == 1;
    SCOPED_TRACE(o.partitioner + " seed " + std::to_string(seed) + (o.replicate ? " replicated" : ""));
    graphpipe::plan::Plan chosen = pt::partition(g, d, o);

    cost::CostModel model(g, d);
    double best_step = std::numeric_limits<double>::infinity(), best_bottleneck = 0.0;
    std::string best_json;
    std::vector<double> bounds;
    for (std::int64_t mb : pt::micro_batch_candidates(32)) {
      pt::Options fixed = o;
      fixed.micro_batch_size = mb;
      graphpipe::plan::Plan plan = pt::partition(g, d, fixed);
      if (best_json.empty() ||
          pt::predicted_faster(plan.predicted_iteration_seconds,
                               plan.bottleneck_seconds_per_sample * static_cast<double>(plan.micro_batch_size),
                               best_step, best_bottleneck)) {
        best_step = plan.predicted_iteration_seconds;
        best_bottleneck = plan.bottleneck_seconds_per_sample * static_cast<double>(plan.micro_batch_size);
        best_json = graphpipe::plan::dumps(plan, g);
      }
      pt::Problem p = pt::make_problem(model, 32, mb, std::min<int>(devices, n), d.memory_bytes, {});
      if (o.replicate) {
        p.replicas = std::make_shared<const pt::ReplicaTable>(model, mb, devices);
        p.device_budget = devices;
      }
      bounds.push_back(pt::step_lower_bound(p));
    }
    EXPECT_EQ(graphpipe::plan::dumps(chosen, g), best_json);
    for (double b : bounds) ruled_out += b > best_step * (1.0 + 1e-9);
  }
  EXPECT_GT(ruled_out, 0) << "no micro-batch size was ruled out: the skipping went untested";
  std::printf("%d micro-batch sizes ruled out by the bound over 16 cases\n", ruled_out);
}
