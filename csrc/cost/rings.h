// rings: the pieces every collective's price is built from (all_reduce.h, all_gather.h).
//
// A collective over a group runs as rings of devices; a ring step moves one chunk from every
// member to the next at once and lasts as long as its slowest link (or, where the description
// gives them, as its measured collective link figures say). Rings are ordered by node,
// then device, so that a node's devices are neighbours and a ring crosses each node boundary
// once. All functions are O(d log d) for a group of d devices.
#pragma once

#include <map>
#include <vector>

#include "cost/devices.h"

namespace graphpipe::cost {

// Throws PlanningError for a device outside the description or one named twice.
void check_group(const Devices& devices, const std::vector<int>& group);
// The group by node, then device.
std::vector<int> ring_order(const Devices& devices, std::vector<int> group);
// One ring step moving `chunk` bytes from every member to the next: the description's collective
// link where given (Devices::has_collective_link), else the ring's slowest point-to-point link.
// Every collective's price is built from it, so this is the one place that rule lives.
double ring_step_seconds(const Devices& devices, const std::vector<int>& ring, double chunk);
// Ring links that cross a node boundary (0 or 2 and more for a ring spanning nodes).
int inter_node_links(const Devices& devices, const std::vector<int>& ring);
// The group's devices by node, each node's in ring order.
std::map<int, std::vector<int>> by_node(const Devices& devices, const std::vector<int>& group);
// Whether every node holds as many of the group's devices (what the two-level algorithms need).
bool equal_nodes(const std::map<int, std::vector<int>>& nodes);
// The slowest of the two-level algorithms' rings across nodes (ring j joins the j-th device of
// every node of equal `nodes`), each taking `steps` steps of `chunk` bytes; 0 with one node.
double slowest_cross_node_rings(const Devices& devices, const std::map<int, std::vector<int>>& nodes, double steps,
                                double chunk);
// The slowest node's ring, each taking `steps` steps of `chunk` bytes.
double slowest_node_rings(const Devices& devices, const std::map<int, std::vector<int>>& nodes, double steps,
                          double chunk);

}  // namespace graphpipe::cost
