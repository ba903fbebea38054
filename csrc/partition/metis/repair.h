// Repair of an arbitrary node -> part labelling (METIS's output) into stages with an acyclic
// stage graph, and splitting of stages up to a wanted count.
//
// make_acyclic: empty labels are dropped (METIS 5.1 can return empty parts), then every strongly
// connected component of the part graph becomes one stage. The condensation is acyclic, and an
// acyclic stage graph makes every stage convex (a path leaving and re-entering a stage would be
// a cycle). O(V + E).
// split_to: while there are fewer than `stages` stages, the stage with the most compute (of two
// or more operators) is cut in two along the global topological order at half its compute. A
// prefix and a suffix of a convex set in a topological order are convex, all edges between them
// go forward, and no path can lead from the suffix back to the prefix, so the stage graph stays
// acyclic. O(stages x V).
#pragma once

#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

std::vector<int> make_acyclic(const Problem& problem, const std::vector<int>& parts);
std::vector<int> split_to(const Problem& problem, std::vector<int> assignment, int stages);
// Labels renumbered 0..K-1 in order of first appearance along the topological order.
std::vector<int> compact_labels(const Problem& problem, const std::vector<int>& labels);

}  // namespace graphpipe::partition
