#include "partition/manual/manual.h"

#include <algorithm>

#include "common/error.h"
#include "plan/rank_sharing.h"

namespace graphpipe::partition {

namespace {

bool covers(const std::string& prefix, const graph::Node& node) {
  // "" is "everything else" among the operators; a graph input it would cover goes with its
  // first consumer instead (every rank has the inputs; on a later stage it would feed earlier
  // ones, a cycle).
  if (prefix.empty()) return node.op != "input";
  if (node.name == prefix || node.module == prefix) return true;
  return node.module.size() > prefix.size() && node.module.compare(0, prefix.size(), prefix) == 0 &&
         node.module[prefix.size()] == '.';
}

}  // namespace

std::vector<int> manual_rule_stages(const graph::OpGraph& g, const ManualMapping& mapping) {
  const int n = static_cast<int>(g.num_nodes());
  std::vector<int> stages(n, -1);
  for (int v = 0; v < n; ++v) {
    const graph::Node& node = g.node(v);
    std::size_t best_length = 0;
    for (const auto& [prefix, stage] : mapping) {
      if (covers(prefix, node) && (stages[v] < 0 || prefix.size() > best_length)) {
        stages[v] = stage;
        best_length = prefix.size();
      }
    }
  }
  return stages;
}

std::vector<int> manual_assignment(const graph::OpGraph& g, const ManualMapping& mapping, int num_devices,
                                   bool shared_devices) {
  if (mapping.empty()) {
    throw PlanningError("the manual partitioner needs a mapping from module names to stages");
  }
  int stages = 0;
  for (const auto& [prefix, stage] : mapping) {
    if (stage < 0 || (stage >= num_devices && !shared_devices)) {
      throw PlanningError("manual mapping sends '" + prefix + "' to stage " + std::to_string(stage) + ", outside 0.." +
                          std::to_string(num_devices - 1) + " for " + std::to_string(num_devices) + " devices");
    }
    stages = std::max(stages, stage + 1);
  }
  std::vector<int> assignment = manual_rule_stages(g, mapping);
  std::vector<std::string> unmapped;
  for (graph::NodeId v : g.topological_order()) {
    if (assignment[v] >= 0) continue;
    if (g.node(v).op == "input") {
      int stage = -1;
      for (graph::NodeId w : g.successors(v)) {
        if (assignment[w] >= 0 && (stage < 0 || assignment[w] < stage)) stage = assignment[w];
      }
      if (stage >= 0) {
        assignment[v] = stage;
        continue;
      }
    }
    unmapped.push_back(graph::describe(g, v) +
                       (g.node(v).module.empty() ? "" : " in module '" + g.node(v).module + "'"));
  }
  if (!unmapped.empty()) {
    std::string names;
    for (std::size_t i = 0; i < unmapped.size() && i < 5; ++i) names += (i ? "; " : "") + unmapped[i];
    if (unmapped.size() > 5) names += "; ...";
    throw PlanningError("manual mapping leaves " + std::to_string(unmapped.size()) + " operators without a stage: " +
                        names + " (add a rule for their module, or \"\" for everything else)");
  }
  std::vector<int> size(stages, 0);
  for (int s : assignment) ++size[s];
  for (int s = 0; s < stages; ++s) {
    if (!size[s]) {
      throw PlanningError("manual mapping names stages 0.." + std::to_string(stages - 1) + " but stage " +
                          std::to_string(s) + " receives no operator");
    }
  }
  return assignment;
}

std::vector<std::vector<int>> manual_stage_devices(const std::map<int, std::vector<int>>& stage_devices, int num_stages,
                                                   int num_devices) {
  std::vector<std::vector<int>> result(num_stages);
  std::vector<int> owner(num_devices, -1);
  for (const auto& [stage, ranks] : stage_devices) {
    if (stage < 0 || stage >= num_stages) {
      throw PlanningError("stage_devices names stage " + std::to_string(stage) +
                          ", but the manual mapping has stages 0.." + std::to_string(num_stages - 1));
    }
    if (ranks.empty()) throw PlanningError("stage_devices gives stage " + std::to_string(stage) + " no device");
    for (int d : ranks) {
      if (d < 0 || d >= num_devices) {
        throw PlanningError("stage_devices gives stage " + std::to_string(stage) + " device " + std::to_string(d) +
                            ", outside 0.." + std::to_string(num_devices - 1) + " for " + std::to_string(num_devices) +
                            " devices");
      }
      owner[d] = stage;
    }
    result[stage] = ranks;
    std::sort(result[stage].begin(), result[stage].end());
  }
  // Stages may share a device where each runs on it alone (plan/rank_sharing.h).
  if (auto problem = plan::rank_sharing_problem(result)) throw PlanningError("stage_devices: " + *problem);
  int next = 0;
  for (int s = 0; s < num_stages; ++s) {
    if (!result[s].empty()) continue;
    while (next < num_devices && owner[next] >= 0) ++next;
    if (next == num_devices) {
      throw PlanningError("stage_devices leaves no device for stage " + std::to_string(s) + ": " +
                          std::to_string(num_devices) + " devices in all");
    }
    owner[next] = s;
    result[s] = {next};
  }
  return result;
}

}  // namespace graphpipe::partition
