// HierarchicalAllReduceHook: the sum of a bucket over the replicas in three steps that follow the
// machine's two levels, the algorithm cost/all_reduce.h prices as `hierarchical`:
//
//   1. reduce-scatter inside the node: the bucket (padded with zeros to L x c elements,
//      c = ceil(n / L)) is summed over the node's L ranks, and the node's rank of local index l
//      keeps chunk l of the node's sum. It runs as an all-to-all (chunk j of every rank goes to
//      rank j) and a local sum of the L chunks in rank order: torch's Gloo reduce-scatter
//      (reduce_scatter_single) is an all-reduce of the whole buffer, twice the traffic, and its
//      work has no future to chain on; the all-to-all moves (L - 1) chunks per rank, as a ring
//      reduce-scatter does;
//   2. all-reduce of that chunk across the nodes, over the group of the ranks with the same local
//      index (one per node), which leaves every rank with chunk l of the whole sum;
//   3. all-gather inside the node puts the L chunks back together.
//
// Most bytes cross the fast intra-node links; only a 1/L chunk per rank crosses nodes. The result
// equals the flat sum up to the order of the additions. Sum convention (comm_hook.h). Steps run
// as a chain of futures (each starts in the previous one's completion callback), so the hook is
// serial. A node of one rank skips steps 1 and 3, one node skips step 2.
//
// Traffic handed over per rank and bucket (counting_group.h): L c (the all-to-all's input,
// skipped when L = 1) + c (all-reduce, skipped with one node) + c (all-gather input, skipped when
// L = 1) elements of the bucket's dtype; the intra and inter groups count into the stage group's
// counter.
//
// The two groups are the caller's (torch.distributed subgroups): `intra_node` holds this rank's
// node, `inter_node` the ranks of every node with this rank's local index. attach() checks that
// they fit the stage's group of d replicas: L x (number of nodes) = d (so every node has L ranks),
// and, with three small collectives on the groups themselves (not counted, waited with the
// timeout), that every replica of the stage is reached exactly once through them and that the
// inter-node group's members share this rank's local index; graphpipe::Error naming what does
// not fit otherwise.
#pragma once

#include "runtime/comm_hook.h"

namespace graphpipe::runtime {

class HierarchicalAllReduceHook final : public CommHook {
 public:
  HierarchicalAllReduceHook(c10::intrusive_ptr<c10d::ProcessGroup> intra_node,
                            c10::intrusive_ptr<c10d::ProcessGroup> inter_node);

  std::string name() const override { return "hierarchical_all_reduce"; }
  HookResult convention() const override { return HookResult::sum; }
  bool serial() const override { return true; }

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;
  at::Tensor parseHookResult(const c10::IValue& result) override;

 protected:
  void on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) override;

 private:
  void check_fit(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) const;

  c10::intrusive_ptr<c10d::ProcessGroup> intra_raw_;
  c10::intrusive_ptr<c10d::ProcessGroup> inter_raw_;
  c10::intrusive_ptr<CountingGroup> intra_;  // counted, sharing the stage group's counter
  c10::intrusive_ptr<CountingGroup> inter_;
};

}  // namespace graphpipe::runtime
