// Boundary refinement: moves single operators between neighbouring stages while the cost model
// says the plan improves, keeping every stage non-empty and the stage graph acyclic.
//
// Each round looks at one stage: while some stage is over the memory limit, the most
// overflowing one (a move must lower its memory and keep the receiving stage within the limit);
// otherwise the slowest one (a move must leave every stage it touches faster than the slowest
// stage was, and all of them within the memory limit). The best such move of an operator of that
// stage to another stage is applied (destinations: every stage while the round has at most 4096
// operator x stage pairs, else the stages the operator has an edge to); it stops when the stage has no improving move
// or after a bounded number of moves (2 V + 64). Every accepted move strictly lowers (bottleneck, number of stages at
// the bottleneck), so it terminates and never makes the plan slower; it is deterministic. Acyclicity test of moving v
// from P to Q, with reach the transitive closure of the stage graph before the move: v must not have both a predecessor
// and a successor in P; no predecessor's stage R != Q may be reachable from Q; Q must not be reachable from any
// successor's stage T != Q. (A new cycle must use a new edge into or out of Q; these conditions exclude each case.)
// Cost per move O(deg(v) x S + S^2 / 64 x S).
#pragma once

#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

// `assignment` must have an acyclic stage graph with labels 0..K-1; the result has the same
// labels (none emptied).
std::vector<int> refine(const Problem& problem, std::vector<int> assignment);

}  // namespace graphpipe::partition
