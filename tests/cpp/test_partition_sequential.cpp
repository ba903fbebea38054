// sequential_assignment (partition/sequential/sequential.h) prunes its chain DP: a stage count is
// dropped for a first segment once the segment's compute reaches that count's best chain, and no
// segment is grown past the slowest stage of an equal-compute chain of the units (a ceiling on
// the plan's slowest stage). Neither may change the plan. Checked against the same DP written
// here with nothing pruned (every first segment weighed for every stage count, the same sums in
// the same order, the same ties: the first cut and then the fewest stages among equally fast
// chains), on series-parallel graphs, DAGs and chains of 30-1,500 operators (1,500 on 64 stages
// is cut into units first), 2-64 stages, with the memory limit lifted, tight enough that some
// segments do not fit, and tight enough that some stages run recomputed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/group_stats.h"
#include "partition/problem.h"
#include "partition/sequential/sequential.h"
#include "test_partition_graphs.h"

namespace pt = graphpipe::partition;

namespace {

// The chain DP of sequential.h with nothing pruned: f[j][k] the least slowest stage of exactly k
// stages over units j.., the first stage's segment grown from its start, the last from the back.
std::vector<int> unpruned_chain(const pt::Problem& p) {
  const double kInf = std::numeric_limits<double>::infinity();
  const int n = static_cast<int>(p.num_nodes());
  const int max_k = std::max(1, std::min(p.max_stages, n));
  const std::vector<int> bounds = pt::chunk_bounds(p, pt::chain_unit_budget(max_k));
  const int units = static_cast<int>(bounds.size()) - 1;
  const int K = std::min(max_k, units);
  auto in_flight = [&](int k) { return static_cast<int>(std::min<std::int64_t>(k, p.num_micro_batches)); };
  std::vector<std::vector<double>> f(units + 1, std::vector<double>(K + 1, kInf));
  std::vector<std::vector<int>> cut(units + 1, std::vector<int>(K + 1, -1));
  f[units][0] = 0.0;
  std::vector<int> stamps(p.num_nodes(), -1);
  int stamp = 0;
  pt::GroupStats suffix(p, stamps, stamp++);
  for (int j = units - 1; j >= 0; --j) {
    for (int i = bounds[j]; i < bounds[j + 1]; ++i) suffix.add(p.order[i]);
    const pt::StageMemory m = suffix.memory(in_flight(1), p.memory_limit);
    if (m.bytes <= p.memory_limit) {
      f[j][1] = suffix.time() + m.extra_seconds(suffix.forward);
      cut[j][1] = units;
    }
  }
  for (int j = units - 1; j >= 0; --j) {
    pt::GroupStats group(p, stamps, stamp++);
    for (int e = j + 1; e < units; ++e) {
      for (int i = bounds[e - 1]; i < bounds[e]; ++i) group.add(p.order[i]);
      for (int k = 2; k <= std::min(K, units - j); ++k) {
        if (f[e][k - 1] == kInf) continue;
        const pt::StageMemory m = group.memory(in_flight(k), p.memory_limit);
        if (m.bytes > p.memory_limit) continue;
        const double value = std::max(group.time() + m.extra_seconds(group.forward), f[e][k - 1]);
        if (value < f[j][k]) {
          f[j][k] = value;
          cut[j][k] = e;
        }
      }
    }
  }
  int best_k = -1;
  for (int k = 1; k <= K; ++k) {
    if (f[0][k] < kInf && (best_k < 0 || f[0][k] < f[0][best_k])) best_k = k;
  }
  if (best_k < 0) return {};
  std::vector<int> assignment(p.num_nodes(), 0);
  for (int k = best_k, j = 0, label = 0; k >= 1; --k, ++label) {
    const int e = cut[j][k];
    for (int i = bounds[j]; i < bounds[e]; ++i) assignment[p.order[i]] = label;
    j = e;
  }
  return assignment;
}

}  // namespace

TEST(SequentialChain, PruningLeavesThePlanOfTheUnprunedDp) {
  int planned = 0, without_plan = 0, recomputed = 0, chunked = 0;
  for (const int n : {30, 200, 1500}) {
    for (unsigned kind = 0; kind < 3; ++kind) {
      const unsigned seed = 17u * static_cast<unsigned>(n) + kind;
      graphpipe::graph::OpGraph g = graphpipe::testing::random_graph_of_kind(kind, seed, n);
      for (const int stages : {2, 4, 16, 64}) {
        graphpipe::cost::CostModel model(g, graphpipe::cost::v100(stages));
        for (const std::int64_t micro_batch : {1, 8}) {
          pt::Problem lifted = pt::make_problem(model, 64, micro_batch, stages, 1e15, {});
          // The whole graph's figures, to set limits that bind: static memory spread over the
          // stages with some room, and activations of every micro-batch in flight or of few.
          std::vector<int> stamps(lifted.num_nodes(), -1);
          pt::GroupStats whole(lifted, stamps, 0);
          for (graphpipe::graph::NodeId v : lifted.order) whole.add(v);
          const double spread = whole.static_bytes / stages;
          for (const double limit :
               {1e15, 1.5 * spread + 4.0 * whole.act_bytes / stages, 2.5 * spread + 0.5 * whole.act_bytes / stages}) {
            pt::Problem p = pt::make_problem(model, 64, micro_batch, stages, limit, {});
            const std::string label = "n=" + std::to_string(n) + " kind=" + std::to_string(kind) +
                                      " stages=" + std::to_string(stages) +
                                      " micro-batch=" + std::to_string(micro_batch) + " limit=" + std::to_string(limit);
            const std::vector<int> expected = unpruned_chain(p);
            ASSERT_EQ(pt::sequential_assignment(p), expected) << label;
            if (expected.empty()) {
              ++without_plan;
              continue;
            }
            ++planned;
            chunked += n > pt::chain_unit_budget(stages) ? 1 : 0;
            const pt::Evaluation ev = pt::evaluate(p, expected);
            recomputed +=
                std::any_of(ev.stages.begin(), ev.stages.end(), [](const pt::StageFigures& s) { return s.recompute; });
          }
        }
      }
    }
  }
  std::printf(
      "[ sequential ] %d plans equal to the unpruned DP's (%d cut into units, %d with a recomputed stage); "
      "%d cases where neither has a plan\n",
      planned, chunked, recomputed, without_plan);
  // The cases reach every path: plans with and without recomputation, cut into units, and none.
  EXPECT_GT(recomputed, 0);
  EXPECT_GT(chunked, 0);
  EXPECT_GT(without_plan, 0);
}

// The one cut rule behind the units and the ceiling's equal-compute chain: a run ends at the
// first item that brings the sum to its share, or where every item left needs a run of its own.
TEST(SequentialChain, EqualWeightCutsEndRunsAtTheirShareOrWhenItemsRunOut) {
  EXPECT_EQ(pt::equal_weight_cuts({1, 1, 1, 1, 4}, 8, 2), (std::vector<int>{0, 4, 5}));
  // A heavy first item: every share is reached at once, so runs end after one item each and the
  // last takes the rest.
  EXPECT_EQ(pt::equal_weight_cuts({10, 0, 0, 0}, 10, 3), (std::vector<int>{0, 1, 2, 4}));
  // Light items first: no run reaches its share, each ends where the items left are as many as
  // the runs left.
  EXPECT_EQ(pt::equal_weight_cuts({0, 0, 0, 9, 9}, 18, 4), (std::vector<int>{0, 2, 3, 4, 5}));
  EXPECT_EQ(pt::equal_weight_cuts({3, 3}, 6, 5), (std::vector<int>{0, 1, 2}));  // parts >= items
  EXPECT_EQ(pt::equal_weight_cuts({5}, 5, 1), (std::vector<int>{0, 1}));
}

// sequential_assignments reads every cap's chain from one table (the replicated planner's budget
// ladder asks for the powers of two up to the budget at once): each is the chain a call of its
// own with that cap as max_stages gives, wherever the order is cut into the same units for every
// cap (here: at most chain_unit_budget(64) = 790 operators, one unit each). The table's segments
// are grown up to the largest of the caps' ceilings: with the largest cap's alone, the chains of
// few stages, whose segments are long, would be cut short.
TEST(SequentialChain, OneTableGivesEveryCapItsOwnChain) {
  const std::vector<int> caps{64, 32, 16, 8, 4, 3, 2, 1};
  int compared = 0, distinct = 0;
  for (const int n : {30, 200, 700}) {
    for (unsigned kind = 0; kind < 3; ++kind) {
      graphpipe::graph::OpGraph g =
          graphpipe::testing::random_graph_of_kind(kind, 31u * static_cast<unsigned>(n) + kind, n);
      ASSERT_LE(n, pt::chain_unit_budget(64));
      graphpipe::cost::CostModel model(g, graphpipe::cost::v100(64));
      for (const std::int64_t micro_batch : {1, 8}) {
        pt::Problem whole = pt::make_problem(model, 64, micro_batch, 64, 1e15, {});
        const std::vector<std::vector<int>> chains = pt::sequential_assignments(whole, caps);
        ASSERT_EQ(chains.size(), caps.size());
        for (std::size_t c = 0; c < caps.size(); ++c) {
          pt::Problem capped = whole;
          capped.max_stages = caps[c];
          capped.device_budget = caps[c];
          EXPECT_EQ(chains[c], pt::sequential_assignment(capped))
              << "n=" << n << " kind=" << kind << " micro-batch=" << micro_batch << " cap=" << caps[c];
          ++compared;
          distinct += c > 0 && chains[c] != chains[c - 1] ? 1 : 0;
        }
      }
    }
  }
  // The caps do not all get the same chain.
  EXPECT_GT(distinct, compared / 4);
}
