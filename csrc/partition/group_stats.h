// GroupStats: the figures of a set of operators that is grown one operator at a time (a stage
// being formed by a partitioner), kept exact after every addition in O(degree):
//   compute, transfer (one transfer per edge with exactly one end inside), static bytes and
//   activation bytes of one micro-batch (own outputs + tensors received from outside), and for
//   replicated stages (replicas.h) the parameter bytes and the bytes of the crossing edges (a
//   replica moves only its share of them).
// Membership is a stamp array shared by all groups of one pass: a node is inside when its stamp
// equals the group's, so starting a new group is O(1) (take a fresh stamp).
#pragma once

#include <vector>

#include "partition/problem.h"

namespace graphpipe::partition {

class GroupStats {
 public:
  GroupStats(const Problem& problem, std::vector<int>& stamps, int stamp)
      : p_(&problem), stamps_(&stamps), stamp_(stamp) {}

  void add(graph::NodeId v) {
    const graph::OpGraph& g = *p_->graph;
    (*stamps_)[v] = stamp_;
    compute += p_->compute[v];
    static_bytes += p_->static_bytes[v];
    act_bytes += p_->act_bytes[v];
    params += p_->param_bytes[v];
    for (graph::EdgeId e : g.in_edges(v)) {
      if ((*stamps_)[g.edge(e).src] == stamp_) {
        transfer -= p_->edge_seconds[e];  // was counted as leaving the group
        cross_bytes -= p_->edge_bytes[e];
      } else {
        transfer += p_->edge_seconds[e];
        act_bytes += p_->edge_bytes[e];
        cross_bytes += p_->edge_bytes[e];
      }
    }
    for (graph::EdgeId e : g.out_edges(v)) {
      if ((*stamps_)[g.edge(e).dst] == stamp_) {
        transfer -= p_->edge_seconds[e];  // was counted as entering the group
        act_bytes -= p_->edge_bytes[e];
        cross_bytes -= p_->edge_bytes[e];
      } else {
        transfer += p_->edge_seconds[e];
        cross_bytes += p_->edge_bytes[e];
      }
    }
  }

  double time() const { return compute + transfer; }
  double memory(int in_flight) const { return static_bytes + act_bytes * in_flight; }

  double compute = 0.0;
  double transfer = 0.0;
  double static_bytes = 0.0;
  double act_bytes = 0.0;
  double params = 0.0;       // parameter bytes
  double cross_bytes = 0.0;  // bytes of the edges with exactly one end inside

 private:
  const Problem* p_;
  std::vector<int>* stamps_;
  int stamp_;
};

}  // namespace graphpipe::partition
