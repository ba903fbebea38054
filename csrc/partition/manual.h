// The manual partitioner: a user's mapping from module names to stages.
//
// Each rule is (prefix, stage). An operator takes the stage of the longest rule whose prefix is
// its module's qualified name, an ancestor module of it ("encoder" covers "encoder.layer1.fc"
// but not "encoder2"), or the operator's own name; the prefix "" covers everything not covered
// otherwise. Graph inputs (op "input") that no rule covers go with their first consumer's stage.
// The stages named must be 0..K-1 with K <= devices, every one receiving an operator. Anything
// else (an operator no rule covers, a stage number out of range or left empty) is a
// PlanningError naming the operators or stages; a mapping whose stages depend on each other in
// a cycle (a stage that is not convex, or two stages feeding each other) is reported with the
// operators of the stages in the cycle by plan building. O(V x rules).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "graph/op_graph.h"

namespace graphpipe::partition {

using ManualMapping = std::vector<std::pair<std::string, int>>;

std::vector<int> manual_assignment(const graph::OpGraph& graph, const ManualMapping& mapping,
                                   int num_devices);

}  // namespace graphpipe::partition
