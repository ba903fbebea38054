#include "partition/step_bound.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "graph/op_graph.h"
#include "partition/evaluate.h"

namespace graphpipe::partition {

namespace {

// op(v) and work(v) of step_bound.h, over the replica counts the budget allows.
struct OperatorFloor {
  std::vector<double> time;  // op(v): the least time of one replica
  double work = 0.0;         // sum over v of work(v)
};

// An operator's time as the bound counts it (step_bound.h): under the zero-bubble closed form
// its forward and weight-gradient half, which it runs in any case, else its whole compute.
double counted(const Problem& p, double forward, double backward_weight, double compute) {
  return p.zero_bubble ? forward + backward_weight : compute;
}

// An operator's time at a replica level, counted as the bound counts it or as its compute.
double level_time(const Problem& p, int level, int node, bool as_bound) {
  if (!p.replicated()) {
    return as_bound ? counted(p, p.forward[node], p.backward_weight[node], p.compute[node]) : p.compute[node];
  }
  const ReplicaTable& table = *p.replicas;
  return as_bound
             ? counted(p, table.forward(level, node), table.backward_weight(level, node), table.compute(level, node))
             : table.compute(level, node);
}

OperatorFloor operator_floor(const Problem& p) {
  const std::size_t n = p.num_nodes();
  OperatorFloor floor;
  floor.time.assign(n, 0.0);
  for (std::size_t v = 0; v < n; ++v) {
    const int node = static_cast<int>(v);
    floor.time[v] = operator_least_time(p, node, p.device_budget, true);
    floor.work += operator_work(p, node, p.device_budget, true);
  }
  return floor;
}

// The longest path of `time` through the graph ending at each operator, that operator included,
// in the problem's topological order.
std::vector<double> paths_until(const Problem& p, const std::vector<double>& time) {
  const graph::OpGraph& g = *p.graph;
  std::vector<double> until(p.num_nodes(), 0.0);
  for (graph::NodeId v : p.order) {
    double before = 0.0;
    for (graph::EdgeId e : g.in_edges(v)) before = std::max(before, until[g.edge(e).src]);
    until[v] = before + time[v];
  }
  return until;
}

double longest_path(const Problem& p, const std::vector<double>& time) {
  const std::vector<double> until = paths_until(p, time);
  return until.empty() ? 0.0 : *std::max_element(until.begin(), until.end());
}

// The slowest stage's floor (step_bound.h): at least each operator's op(), and the devices' share
// of every operator's work().
double slowest_stage_floor(const Problem& p, const OperatorFloor& floor) {
  const int devices = std::max(1, p.device_budget);  // max_stages without replication
  double slowest = floor.work / devices;
  for (double t : floor.time) slowest = std::max(slowest, t);
  return slowest;
}

}  // namespace

double operator_work(const Problem& p, int node, int max_replicas, bool as_bound) {
  if (!p.replicated()) return level_time(p, 0, node, as_bound);
  const ReplicaTable& table = *p.replicas;
  double least = std::numeric_limits<double>::infinity();
  for (int level = 0; level < table.num_levels() && table.replicas(level) <= max_replicas; ++level) {
    least = std::min(least, table.replicas(level) * level_time(p, level, node, as_bound));
  }
  return least;
}

double operator_least_time(const Problem& p, int node, int max_replicas, bool as_bound) {
  if (!p.replicated()) return level_time(p, 0, node, as_bound);
  const ReplicaTable& table = *p.replicas;
  double least = std::numeric_limits<double>::infinity();
  for (int level = 0; level < table.num_levels() && table.replicas(level) <= max_replicas; ++level) {
    least = std::min(least, level_time(p, level, node, as_bound));
  }
  return least;
}

double compute_lower_bound(const Problem& p) {
  const double fixed = p.model->devices().step_overhead_seconds;
  return static_cast<double>(p.num_micro_batches) * slowest_stage_floor(p, operator_floor(p)) + fixed;
}

double step_lower_bound(const Problem& p) {
  if (p.zero_bubble) return compute_lower_bound(p);
  const OperatorFloor floor = operator_floor(p);
  const int devices = std::max(1, p.device_budget);  // max_stages without replication
  const double slowest = slowest_stage_floor(p, floor);
  const double fixed = p.model->devices().step_overhead_seconds;
  // The plan has some depth D <= devices, and its slowest stage is at least path / D too.
  const double path = longest_path(p, floor.time);
  double least = std::numeric_limits<double>::infinity();
  for (int depth = 1; depth <= devices; ++depth) {
    least = std::min(least, pipeline_step(p.num_micro_batches, depth, std::max(slowest, path / depth)));
  }
  return least + fixed;
}

double pipeline_lower_bound(const Problem& p) {
  const std::size_t n = p.num_nodes();
  std::vector<double> w(n, 0.0);
  // Under the zero-bubble schedule a stage may run the weight half alone; else every backward
  // runs whole.
  auto backward = [&](double whole, double weight) { return p.zero_bubble ? std::min(whole, weight) : whole; };
  for (std::size_t v = 0; v < n; ++v) {
    w[v] = p.forward[v] + backward(p.backward[v], p.backward_weight[v]);
    if (!p.replicated()) continue;
    const ReplicaTable& table = *p.replicas;
    const int node = static_cast<int>(v);
    for (int level = 0; level < table.num_levels() && table.replicas(level) <= p.device_budget; ++level) {
      w[v] = std::min(
          w[v], table.forward(level, node) + backward(table.backward(level, node), table.backward_weight(level, node)));
    }
  }
  const auto M = static_cast<double>(p.num_micro_batches);
  const std::vector<double> until = paths_until(p, w);  // v's own w once; M times in the bound
  double bound = 0.0;
  for (std::size_t v = 0; v < n; ++v) bound = std::max(bound, until[v] + (M - 1.0) * w[v]);
  const cost::Devices& devices = p.model->devices();
  return bound + M * stage_dispatch_seconds(devices) + devices.step_overhead_seconds;
}

}  // namespace graphpipe::partition
