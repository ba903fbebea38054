// Simulating several stages per rank: a rank runs its stages' computes one at a time, a local
// edge (both stages on one rank) costs nothing however large its tensors, and interleaving a
// chain's stages two per rank shortens 1F1B's warm-up and drain against the same work in one
// stage per rank (Megatron's virtual stages: the bubble divided by the stages per rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "schedule/generate.h"
#include "schedule_plans.h"
#include "sim/simulate.h"

namespace {

using graphpipe::plan::Plan;
using graphpipe::schedule::generate;
using graphpipe::schedule::Policy;
using graphpipe::testing::chain_plan;
using graphpipe::testing::devices;
using graphpipe::testing::placed_chain;

double step(const Plan& plan, Policy policy, const graphpipe::cost::Devices& d) {
  return graphpipe::sim::simulate(plan, generate(plan, policy), d, {}).iteration_seconds;
}

}  // namespace

TEST(SimStagesPerRank, InterleavingBeatsTheSameWorkOneStagePerRank) {
  // 4 ranks, 8 micro-batches; per rank 2 x (F 1 s, B 2 s). One stage per rank (F 2, B 4):
  // 1F1B takes (M + p - 1)(F + B) = 11 x 6 = 66 s. Two stages per rank split the warm-up.
  const int ranks = 4, M = 8;
  const double merged = step(chain_plan(ranks, M, 2.0, 4.0), Policy::one_f_one_b, devices(ranks));
  EXPECT_DOUBLE_EQ(merged, 66.0);
  const double busy = M * 6.0;  // every rank's compute
  // 1F1B 62 s looping, 59 s in a V; zb_graph 53 and 51 s (its W's fill what is left). The
  // greedy policy's in-flight limits (h_s: 8 for the first stage) let the first stage run all
  // its forwards before the rank turns to its later stage, so it only ties (66 s).
  for (const bool v : {false, true}) {
    for (const Policy policy : {Policy::one_f_one_b, Policy::one_f_one_b_greedy, Policy::zb_graph}) {
      const double interleaved = step(placed_chain(ranks, v, M), policy, devices(ranks));
      EXPECT_GE(interleaved, busy) << (v ? "V" : "looping");
      if (policy == Policy::one_f_one_b_greedy) {
        EXPECT_LE(interleaved, merged) << (v ? "V" : "looping");
      } else {
        EXPECT_LT(interleaved, merged) << (v ? "V" : "looping") << ", policy " << static_cast<int>(policy);
      }
    }
  }
  EXPECT_DOUBLE_EQ(step(placed_chain(ranks, false, M), Policy::one_f_one_b, devices(ranks)), 62.0);
  EXPECT_DOUBLE_EQ(step(placed_chain(ranks, true, M), Policy::one_f_one_b, devices(ranks)), 59.0);
}

TEST(SimStagesPerRank, ALocalEdgeCostsNothing) {
  // In a V on 2 ranks, edge 1 (stages 1 and 2, both on rank 1) is local: its bytes move no
  // data, so giving every edge a gigabyte on slow links changes the step only by the crossing
  // edges' transfers, and removing the local edge's bytes changes nothing.
  const auto slow = devices(2, 1e-3, 1e9);
  Plan heavy = placed_chain(2, true, 4, 1e9);
  Plan light_local = heavy;
  light_local.edges[1].bytes = 0.0;
  EXPECT_DOUBLE_EQ(step(heavy, Policy::one_f_one_b, slow), step(light_local, Policy::one_f_one_b, slow));
  Plan light_crossing = heavy;
  light_crossing.edges[0].bytes = 0.0;
  EXPECT_LT(step(light_crossing, Policy::one_f_one_b, slow), step(heavy, Policy::one_f_one_b, slow));
}

TEST(SimStagesPerRank, ARankNeverRunsTwoComputesAtOnce) {
  const Plan plan = placed_chain(3, true, 6);
  const auto result = graphpipe::sim::simulate(plan, generate(plan, Policy::zb_graph), devices(3), {});
  for (int r = 0; r < 3; ++r) {
    std::vector<std::pair<double, double>> busy;
    for (const auto& t : result.tasks) {
      const bool compute =
          t.kind == graphpipe::sim::TaskKind::forward || t.kind == graphpipe::sim::TaskKind::backward ||
          t.kind == graphpipe::sim::TaskKind::backward_input || t.kind == graphpipe::sim::TaskKind::backward_weight;
      if (compute && t.rank == r) busy.push_back({t.start, t.end});
    }
    std::sort(busy.begin(), busy.end());
    for (std::size_t k = 1; k < busy.size(); ++k) EXPECT_LE(busy[k - 1].second, busy[k].first + 1e-12) << "rank " << r;
  }
}
