// GroupStats: the figures of a set of operators that is grown one operator at a time (a stage
// being formed by a partitioner), kept exact after every addition in O(degree):
//   compute and forward, transfer (one transfer per edge with exactly one end inside), static
//   bytes and activation bytes of one micro-batch (own outputs + tensors received from outside),
//   the received tensors' bytes alone (what a recomputed stage keeps, recompute.h), and for
//   replicated stages (replicas.h) the parameter bytes and the bytes of the crossing edges (a
//   replica moves only its share of them).
// Membership is a stamp array shared by all groups of one pass: a node is inside when its stamp
// equals the group's, so starting a new group is O(1) (take a fresh stamp).
#pragma once

#include <vector>

#include "partition/problem.h"
#include "partition/recompute.h"

namespace graphpipe::partition {

class GroupStats {
 public:
  GroupStats(const Problem& problem, std::vector<int>& stamps, int stamp)
      : p_(&problem), stamps_(&stamps), stamp_(stamp) {}

  void add(graph::NodeId v) {
    const graph::OpGraph& g = *p_->graph;
    (*stamps_)[v] = stamp_;
    compute += p_->compute[v];
    forward += p_->forward[v];
    static_bytes += p_->static_bytes[v];
    act_bytes += p_->act_bytes[v];
    params += p_->param_bytes[v];
    for (graph::EdgeId e : g.in_edges(v)) {
      if ((*stamps_)[g.edge(e).src] == stamp_) {
        transfer -= p_->edge_seconds[e];  // was counted as leaving the group
        cross_bytes -= p_->edge_bytes[e];
        --crossings;
      } else {
        transfer += p_->edge_seconds[e];
        act_bytes += p_->edge_bytes[e];
        input_bytes += p_->edge_bytes[e];
        cross_bytes += p_->edge_bytes[e];
        ++crossings;
      }
    }
    for (graph::EdgeId e : g.out_edges(v)) {
      if ((*stamps_)[g.edge(e).dst] == stamp_) {
        transfer -= p_->edge_seconds[e];  // was counted as entering the group
        act_bytes -= p_->edge_bytes[e];
        input_bytes -= p_->edge_bytes[e];
        cross_bytes -= p_->edge_bytes[e];
        --crossings;
      } else {
        transfer += p_->edge_seconds[e];
        cross_bytes += p_->edge_bytes[e];
        ++crossings;
      }
    }
  }

  double time() const { return compute + transfer; }
  double memory(int in_flight) const { return static_bytes + act_bytes * in_flight; }
  // The group as one stage at `in_flight` micro-batches under `limit`, recomputed where
  // recompute.h's rule says.
  StageMemory memory(int in_flight, double limit) const {
    return stage_memory(static_bytes, act_bytes, input_bytes, in_flight, limit);
  }
  // Whether that stage meets the time `target` and fits the limit.
  bool fits(int in_flight, double limit, double target) const {
    return stage_fits(time(), forward, static_bytes, act_bytes, input_bytes, in_flight, limit, target);
  }

  double compute = 0.0;
  double transfer = 0.0;
  double static_bytes = 0.0;
  double act_bytes = 0.0;
  double forward = 0.0;      // forward seconds (what recomputation runs again)
  double input_bytes = 0.0;  // received tensors' bytes, one micro-batch (part of act_bytes)
  double params = 0.0;       // parameter bytes
  double cross_bytes = 0.0;  // bytes of the edges with exactly one end inside
  int crossings = 0;         // how many such edges (each pays a link latency)

 private:
  const Problem* p_;
  std::vector<int>* stamps_;
  int stamp_;
};

}  // namespace graphpipe::partition
