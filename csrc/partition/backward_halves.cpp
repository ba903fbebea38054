#include "partition/backward_halves.h"

#include <string>

#include "common/error.h"

namespace graphpipe::partition {

std::vector<BackwardHalves> backward_halves(const graph::OpGraph& g, const std::vector<graph::NodeId>& order,
                                            const std::vector<int>& stage_of, int num_stages,
                                            const std::vector<double>& input, const std::vector<double>& weight) {
  const std::size_t n = g.num_nodes();
  if (order.size() != n || stage_of.size() != n || input.size() != n || weight.size() != n) {
    throw PlanningError("backward_halves: " + std::to_string(order.size()) + " ordered operators, " +
                        std::to_string(stage_of.size()) + " stage labels, " + std::to_string(input.size()) + " I and " +
                        std::to_string(weight.size()) + " W figures for a graph of " + std::to_string(n) +
                        " operators");
  }
  std::vector<BackwardHalves> halves(num_stages);
  // reached[v]: I runs v (a received tensor leads to it inside its stage).
  // weighted[v]: W runs v (a parameter of its stage leads to it, its own included).
  std::vector<char> reached(n, 0), weighted(n, 0);
  for (graph::NodeId v : order) {
    const int s = stage_of[v];
    if (s < 0 || s >= num_stages) {
      throw PlanningError("backward_halves: operator " + graph::describe(g, v) + " is in stage " + std::to_string(s) +
                          " of " + std::to_string(num_stages));
    }
    // joins: an in-stage operand comes from a weighted operator that I does not run, so W runs
    // v again for that operand's gradient (split_backward.h's join).
    bool received = false, after_weights = false, joins = false;
    for (graph::EdgeId e : g.in_edges(v)) {
      const graph::NodeId u = g.edge(e).src;
      if (stage_of[u] != s) {
        received = received || g.node(u).op != "input";
      } else {
        received = received || reached[u];
        after_weights = after_weights || weighted[u];
        joins = joins || (!reached[u] && weighted[u]);
      }
    }
    reached[v] = received;
    weighted[v] = after_weights || weight[v] > 0.0;
    BackwardHalves& h = halves[s];
    if (received) {
      h.input += input[v];
      h.input_walks = true;
      h.weight += weight[v] + (joins ? input[v] : 0.0);
    } else {
      h.weight += weight[v] + (after_weights ? input[v] : 0.0);
    }
  }
  return halves;
}

}  // namespace graphpipe::partition
