#include "planner/folded_search.h"

#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "partition/manual/manual_partitioner.h"

namespace graphpipe::planner {

int folded_device(plan::Fold fold, int v, int devices) {
  const int layer = v / devices;
  const int p = v % devices;
  return fold == plan::Fold::v && layer % 2 == 1 ? devices - 1 - p : p;
}

cost::Devices virtual_devices(const cost::Devices& devices, plan::Fold fold, int k) {
  cost::Devices half = devices;
  const int count = k * devices.count;
  half.count = count;
  half.memory_bytes = devices.memory_bytes / k;
  half.link_bandwidth.assign(static_cast<std::size_t>(count), std::vector<double>(static_cast<std::size_t>(count)));
  half.link_latency.assign(static_cast<std::size_t>(count), std::vector<double>(static_cast<std::size_t>(count)));
  if (!devices.node.empty()) half.node.assign(static_cast<std::size_t>(count), 0);
  for (int v = 0; v < count; ++v) {
    const auto a = static_cast<std::size_t>(folded_device(fold, v, devices.count));
    if (!devices.node.empty()) half.node[static_cast<std::size_t>(v)] = devices.node[a];
    for (int w = 0; w < count; ++w) {
      const auto b = static_cast<std::size_t>(folded_device(fold, w, devices.count));
      // Two parts of one device talk over its diagonal: no latency, the intra-node bandwidth.
      half.link_bandwidth[static_cast<std::size_t>(v)][static_cast<std::size_t>(w)] = devices.link_bandwidth[a][b];
      half.link_latency[static_cast<std::size_t>(v)][static_cast<std::size_t>(w)] =
          v == w ? 0.0 : devices.link_latency[a][b];
    }
  }
  return half;
}

std::optional<PlannerResult> folded_plan(const graph::OpGraph& graph, const cost::Devices& devices,
                                         partition::Options options, const PlannerOptions& search, plan::Fold fold,
                                         int k) {
  const std::string partitioner = options.partitioner;
  options.replicate = false;
  plan::Plan cut;
  // The cut on the virtual devices is wanted whatever it simulates to there: only the folded
  // plan is measured against search.to_beat.
  PlannerOptions any_cut = search;
  any_cut.to_beat = std::numeric_limits<double>::infinity();
  try {
    cut = plan_by_simulation(graph, virtual_devices(devices, fold, k), options, any_cut).plan;
  } catch (const PlanningError& e) {
    log::debug("planner: no " + partitioner + " plan on " + std::to_string(k * devices.count) +
               " virtual devices to fold: " + e.what());
    return std::nullopt;
  }
  partition::ManualMapping by_name;
  std::map<int, std::vector<int>> stage_devices;
  const std::string how = std::to_string(k) + " stages per device " + std::string(plan::fold_name(fold));
  std::vector<int> stages_on(static_cast<std::size_t>(devices.count), 0);
  for (std::size_t s = 0; s < cut.stages.size(); ++s) {
    const plan::Stage& stage = cut.stages[s];
    for (graph::NodeId v : stage.nodes) by_name.emplace_back(graph.node(v).name, static_cast<int>(s));
    const int device = folded_device(fold, stage.devices.front(), devices.count);
    stage_devices[static_cast<int>(s)] = {device};
    ++stages_on[static_cast<std::size_t>(device)];
  }
  bool shares = false;
  for (int n : stages_on) shares = shares || n > 1;
  if (!shares) return std::nullopt;  // the same plan as one stage per device: weighed already
  options.partitioner = std::string(partition::ManualPartitioner::kName);
  options.manual = std::move(by_name);
  options.stage_devices = std::move(stage_devices);
  options.max_stages = 0;
  try {
    PlannerResult folded = plan_by_simulation(graph, devices, options, search);
    folded.plan.partitioner = partitioner + ", up to " + how;
    folded.plan.fold = fold;
    return folded;
  } catch (const PlanningError& e) {
    log::debug("planner: the " + partitioner + " plan folded to " + how + " does not plan: " + e.what());
    return std::nullopt;
  }
}

}  // namespace graphpipe::planner
