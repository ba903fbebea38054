// Stage-level plans built by hand for the schedule and simulator tests: chains, fork-joins and
// random stage DAGs, straight from the Plan structs (no partitioner involved).
#pragma once

#include <algorithm>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "cost/devices.h"
#include "plan/plan.h"

namespace graphpipe::testing {

// Stages 0..n-1 on ranks 0..n-1 with the given edges and equal costs.
inline plan::Plan stage_plan(int stages, const std::vector<std::pair<int, int>>& edges, int micro_batches,
                             double forward = 1.0, double backward = 2.0, double edge_bytes = 0.0) {
  plan::Plan plan;
  plan.partitioner = "manual";
  plan.micro_batch_size = 1;
  plan.num_micro_batches = micro_batches;
  plan.batch_size = micro_batches;
  plan.num_devices = stages;
  for (int s = 0; s < stages; ++s) {
    plan::Stage stage;
    stage.id = s;
    stage.devices = {s};
    stage.forward_seconds = forward;
    stage.backward_seconds = backward;
    stage.activation_bytes = 100.0;
    plan.stages.push_back(stage);
  }
  for (const auto& [a, b] : edges) {
    plan::StageEdge e;
    e.src = a;
    e.dst = b;
    e.bytes = edge_bytes;
    plan.edges.push_back(e);
  }
  return plan;
}

inline plan::Plan chain_plan(int stages, int micro_batches, double forward = 1.0, double backward = 2.0,
                             double edge_bytes = 0.0) {
  std::vector<std::pair<int, int>> edges;
  for (int s = 0; s + 1 < stages; ++s) edges.push_back({s, s + 1});
  return stage_plan(stages, edges, micro_batches, forward, backward, edge_bytes);
}

// A chain of 2 x ranks stages on `ranks` ranks, two stages each: looping (rank r holds stages r
// and r + ranks) or in a V (rank r holds r and 2 ranks - 1 - r, as ZB-V places them).
inline plan::Plan placed_chain(int ranks, bool v, int micro_batches, double edge_bytes = 0.0) {
  plan::Plan plan = chain_plan(2 * ranks, micro_batches, 1.0, 2.0, edge_bytes);
  plan.num_devices = ranks;
  for (int s = 0; s < 2 * ranks; ++s) plan.stages[s].devices = {v && s >= ranks ? 2 * ranks - 1 - s : s % ranks};
  return plan;
}

// A random stage DAG: edges only from lower to higher ids, each stage but the first with at
// least one predecessor, random costs (some zero), random ranks (a permutation).
inline plan::Plan random_plan(std::mt19937& rng, int max_stages = 9, int max_micro_batches = 10) {
  std::uniform_int_distribution<int> stage_count(1, max_stages);
  std::uniform_int_distribution<int> mb_count(1, max_micro_batches);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const int S = stage_count(rng);
  std::vector<std::pair<int, int>> edges;
  for (int d = 1; d < S; ++d) {
    std::uniform_int_distribution<int> pick(0, d - 1);
    edges.push_back({pick(rng), d});
    for (int s = 0; s < d; ++s) {
      if (unit(rng) < 0.2 && s != edges.back().first) edges.push_back({s, d});
    }
  }
  auto plan = stage_plan(S, edges, mb_count(rng));
  std::vector<int> ranks(S);
  for (int s = 0; s < S; ++s) ranks[s] = s;
  std::shuffle(ranks.begin(), ranks.end(), rng);
  for (int s = 0; s < S; ++s) {
    auto& st = plan.stages[s];
    st.devices = {ranks[s]};
    st.forward_seconds = unit(rng) < 0.1 ? 0.0 : unit(rng);
    st.backward_seconds = unit(rng) < 0.1 ? 0.0 : 2.0 * unit(rng);
  }
  for (auto& e : plan.edges) e.bytes = unit(rng) < 0.3 ? 0.0 : 1000.0 * unit(rng);
  return plan;
}

// `count` devices joined by links of the given latency and bandwidth (infinite: free).
inline cost::Devices devices(int count, double latency = 0.0,
                             double bandwidth = std::numeric_limits<double>::infinity()) {
  cost::Devices d;
  d.name = "test";
  d.count = count;
  d.memory_bytes = 1e12;
  d.link_bandwidth.assign(count, std::vector<double>(count, bandwidth));
  d.link_latency.assign(count, std::vector<double>(count, latency));
  return d;
}

}  // namespace graphpipe::testing
