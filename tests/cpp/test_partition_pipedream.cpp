// PipeDream's planner (sequential/pipedream.h) on chains that relay skip tensors: its DP charges
// a segment the tensors the chain relays through it (transfers and held memory, chain_units.h),
// so every chain that search returns fits in memory as the evaluation prices it, even where the
// relayed bytes decide; the chains of PipeDream's own pricing overflow by them here.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>

#include "cost/presets.h"
#include "partition/evaluate.h"
#include "partition/problem.h"
#include "partition/replicas.h"
#include "partition/sequential/pipedream.h"

namespace graph = graphpipe::graph;
namespace cost = graphpipe::cost;
namespace pt = graphpipe::partition;

namespace {

// A chain of n operators of equal compute whose first operator also feeds the last a tensor of
// `skip` bytes per sample: a chain plan relays it through every stage in between.
graph::OpGraph skip_chain(int n, double skip, double params, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  graph::OpGraph g;
  for (int i = 0; i < n; ++i) {
    graph::Node node;
    node.name = "n" + std::to_string(i);
    node.op = "call_module";
    node.target = "Op";
    node.module = "m" + std::to_string(i);
    node.forward_flops = 4e9 * jitter(rng);
    node.param_bytes = static_cast<std::int64_t>(params * jitter(rng));
    node.output_bytes = 4096;
    g.add_node(node);
  }
  for (int i = 0; i + 1 < n; ++i) g.add_edge(i, i + 1, 4096);
  g.add_edge(0, n - 1, skip);
  g.trace_batch_size = 32;
  return g;
}

// The problem the sequential partitioner plans a chain on, with replication.
pt::Problem chain_problem(const cost::CostModel& model, std::int64_t micro_batch, double limit) {
  const int devices = model.devices().count;
  pt::Problem p = pt::make_problem(model, 32, micro_batch, devices, limit, {});
  p.chain = true;
  p.replicas = std::make_shared<const pt::ReplicaTable>(model, micro_batch, devices);
  p.device_budget = devices;
  return p;
}

}  // namespace

TEST(PartitionPipeDream, EveryChainFitsWithTheTensorsItRelays) {
  int relayed_and_tight = 0, blind_overflows = 0;
  for (unsigned seed = 1; seed <= 6; ++seed) {
    const graph::OpGraph g = skip_chain(8 + static_cast<int>(seed), 2e6, 2e8, seed);
    const cost::Devices devices = cost::v100(8, 4);
    const cost::CostModel model(g, devices);
    for (std::int64_t mb : {4, 8}) {
      // From roomy down to a limit where the relayed tensor decides what fits.
      for (double limit_gib : {14.0, 6.0, 4.0, 3.0, 2.5}) {
        const double limit = limit_gib * 1024.0 * 1024.0 * 1024.0;
        const pt::Problem p = chain_problem(model, mb, limit);
        for (const pt::ChainPlan& chain : pt::pipedream_chains(p, false))
          blind_overflows += pt::evaluate(p, chain.assignment, chain.replicas).fits() ? 0 : 1;
        for (const pt::ChainPlan& chain : pt::pipedream_chains(p, true)) {
          const pt::Evaluation ev = pt::evaluate(p, chain.assignment, chain.replicas);
          ASSERT_TRUE(ev.acyclic);
          EXPECT_TRUE(ev.fits()) << "seed " << seed << " micro-batch " << mb << " limit " << limit_gib
                                 << " GiB: over by " << ev.max_overflow << " bytes on stage " << ev.worst_memory_stage;
          // A stage strictly between the skip's ends relays it; count the plans where one does
          // and memory is within a relayed tensor's bytes of the limit.
          const int first = ev.stage_of[0], last = ev.stage_of[g.num_nodes() - 1];
          if (last - first >= 2) {
            for (int s = first + 1; s < last; ++s) {
              const double relayed = 2e6 * static_cast<double>(mb) / chain.replicas[0];
              if (ev.stages[s].memory > limit - 4.0 * relayed * ev.stages[s].in_flight) ++relayed_and_tight;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(relayed_and_tight, 0) << "no case where the relayed tensor mattered: the test proves nothing";
  EXPECT_GT(blind_overflows, 0) << "PipeDream's own pricing never overflowed: the relays did not matter";
}
