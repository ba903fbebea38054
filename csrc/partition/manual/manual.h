// The manual partitioner: a user's mapping from module names to stages.
//
// Each rule is (prefix, stage). An operator takes the stage of the longest rule whose prefix is
// its module's qualified name, an ancestor module of it ("encoder" covers "encoder.layer1.fc"
// but not "encoder2"), or the operator's own name; the prefix "" covers everything not covered
// otherwise, graph inputs excepted. Graph inputs (op "input") that no rule other than "" covers go
// with their first consumer's stage.
// The stages named must be 0..K-1 with K <= devices (any K where `shared_devices`: the user's
// stage_devices place several stages on a device), every one receiving an operator. Anything
// else (an operator no rule covers, a stage number out of range or left empty) is a
// PlanningError naming the operators or stages; a mapping whose stages depend on each other in
// a cycle (a stage that is not convex, or two stages feeding each other) is reported with the
// operators of the stages in the cycle by plan building. O(V x rules).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::partition {

using ManualMapping = std::vector<std::pair<std::string, int>>;

std::vector<int> manual_assignment(const graph::OpGraph& graph, const ManualMapping& mapping, int num_devices,
                                   bool shared_devices = false);

// The stage of the longest rule covering each operator (the rule above), -1 for an operator no
// rule covers; no other check. graphpipe.runtime.manual_plan reads it instead of matching rules
// in Python. O(V x rules).
std::vector<int> manual_rule_stages(const graph::OpGraph& graph, const ManualMapping& mapping);

// The ranks of each of `num_stages` stages from the user's stage -> device ids (Options::
// stage_devices): a stage named gets its list (sorted), a stage not named one device, the
// lowest no stage names. Stages may share a device where each of them runs on it alone
// (plan/rank_sharing.h: several stages per rank). PlanningError naming the problem for a stage
// outside 0..num_stages-1, an empty list, a device outside 0..num_devices-1, a device listed
// twice in a stage or shared with a replicated stage, or more devices asked for than there are.
std::vector<std::vector<int>> manual_stage_devices(const std::map<int, std::vector<int>>& stage_devices, int num_stages,
                                                   int num_devices);

}  // namespace graphpipe::partition
