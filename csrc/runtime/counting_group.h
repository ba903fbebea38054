// CountingGroup: a process group that forwards every operation to a real one and counts what this
// rank hands to it, so that the traffic of a gradient synchronisation is measured, not computed.
//
// Why a wrapper: the communication hooks that sum a replicated stage's gradients (comm_hook.h)
// include torch's own Python hooks (PowerSGD, fp16 compression), which call torch.distributed
// with the process group their state names. A c10d::ProcessGroup subclass whose collectives are
// overridden is accepted by torch.distributed as `group=` (dist.all_reduce calls
// group.allreduce, a virtual method), so giving such a hook this group instead of the real one
// counts every collective it issues, whatever language issued it, without changing the hook.
//
// What is counted, per operation this rank issues through the group:
//   collectives          +1 for every collective or point-to-point operation (a barrier too);
//   bytes_communicated   the bytes of the tensors this rank hands over as its contribution: the
//                        input tensors of allreduce, reduce, broadcast (on every rank, root or
//                        not), allgather, gather, reduce_scatter, scatter (the root's list),
//                        all-to-all and send; recv and barrier add 0. This is the payload the
//                        hook asks the backend to move, not the bytes on the wire (a ring
//                        all-reduce of B bytes over d ranks sends 2 (d - 1) / d B per rank;
//                        cost/all_reduce.h prices that).
// Counts are cumulative and shared: CountingGroups made with `sharing` add into the same
// TrafficCounter, so a hook that uses several groups (the hierarchical all-reduce) is counted as
// one. reset() sets them to zero. Thread safe (atomics): collectives are issued from autograd's
// thread and from completion callbacks.
//
// The wrapper owns no backend of its own and keeps the wrapped group's rank and size; coalescing
// calls, the timeout and the backend's name are forwarded as well. It is not registered with
// torch.distributed's world, so dist.get_rank(group) and friends do not know it (the hooks only
// use group.size() and collectives). Deprecated aliases (_allgather_base, _reduce_scatter_base,
// ...) reach the overrides through the base class, which forwards them.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <cstdint>
#include <memory>

namespace graphpipe::runtime {

struct TrafficCounter {
  std::atomic<std::int64_t> bytes{0};
  std::atomic<std::int64_t> collectives{0};
};

class CountingGroup : public c10d::ProcessGroup {
 public:
  // Counts into a new counter.
  explicit CountingGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner);
  // Counts into `counter` (shared with other groups).
  CountingGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner, std::shared_ptr<TrafficCounter> counter);

  // A CountingGroup over `other` that adds into this group's counter.
  c10::intrusive_ptr<CountingGroup> sharing(c10::intrusive_ptr<c10d::ProcessGroup> other) const;

  const c10::intrusive_ptr<c10d::ProcessGroup>& inner() const { return inner_; }
  std::int64_t bytes_communicated() const { return counter_->bytes.load(); }
  std::int64_t collectives() const { return counter_->collectives.load(); }
  void reset() {
    counter_->bytes = 0;
    counter_->collectives = 0;
  }

  const std::string getBackendName() const override { return inner_->getBackendName(); }
  void setTimeout(std::chrono::milliseconds timeout) override { inner_->setTimeout(timeout); }
  void startCoalescing(c10::DeviceType device) override { inner_->startCoalescing(device); }
  c10::intrusive_ptr<c10d::Work> endCoalescing(c10::DeviceType device) override {
    return inner_->endCoalescing(device);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                   std::vector<std::int64_t>& output_splits,
                                                   std::vector<std::int64_t>& input_splits,
                                                   const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

 private:
  void count(std::int64_t bytes) const;

  c10::intrusive_ptr<c10d::ProcessGroup> inner_;
  std::shared_ptr<TrafficCounter> counter_;
};

}  // namespace graphpipe::runtime
