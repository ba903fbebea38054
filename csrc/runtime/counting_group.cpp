#include "runtime/counting_group.h"

#include "common/error.h"

namespace graphpipe::runtime {

namespace {

std::int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  std::int64_t total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += static_cast<std::int64_t>(t.numel()) * static_cast<std::int64_t>(t.element_size());
  }
  return total;
}

std::int64_t bytes_of(const std::vector<std::vector<at::Tensor>>& lists) {
  std::int64_t total = 0;
  for (const auto& list : lists) total += bytes_of(list);
  return total;
}

std::int64_t bytes_of(const at::Tensor& t) { return bytes_of(std::vector<at::Tensor>{t}); }

const c10::intrusive_ptr<c10d::ProcessGroup>& checked(const c10::intrusive_ptr<c10d::ProcessGroup>& inner) {
  if (!inner) throw Error("graphpipe runtime: a counting process group needs a process group to wrap, got None");
  return inner;
}

}  // namespace

CountingGroup::CountingGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner)
    : CountingGroup(std::move(inner), std::make_shared<TrafficCounter>()) {}

CountingGroup::CountingGroup(c10::intrusive_ptr<c10d::ProcessGroup> inner, std::shared_ptr<TrafficCounter> counter)
    : c10d::ProcessGroup(checked(inner)->getStore(), inner->getRank(), inner->getSize()),
      inner_(std::move(inner)),
      counter_(std::move(counter)) {
  // The wrapped group's backend type, so that code asking for it (barrier's device choice, the
  // backend's name) answers as for the real group.
  setDefaultBackend(inner_->getBackendType());
}

c10::intrusive_ptr<CountingGroup> CountingGroup::sharing(c10::intrusive_ptr<c10d::ProcessGroup> other) const {
  return c10::make_intrusive<CountingGroup>(std::move(other), counter_);
}

void CountingGroup::count(std::int64_t bytes) const {
  counter_->bytes += bytes;
  counter_->collectives += 1;
}

c10::intrusive_ptr<c10d::Work> CountingGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  count(bytes_of(tensors));
  return inner_->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  count(bytes_of(tensors));
  return inner_->allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                  const c10d::AllreduceCoalescedOptions& opts) {
  count(bytes_of(tensors));
  return inner_->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  count(bytes_of(tensors));
  return inner_->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllgatherOptions& opts) {
  count(bytes_of(inputs));
  return inner_->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::all_gather_single(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  count(bytes_of(input));
  return inner_->all_gather_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                  std::vector<at::Tensor>& inputs,
                                                                  const c10d::AllgatherOptions& opts) {
  count(bytes_of(inputs));
  return inner_->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::all_gather_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                          std::vector<at::Tensor>& inputs,
                                                                          const c10d::AllgatherOptions& opts) {
  count(bytes_of(inputs));
  return inner_->all_gather_single_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  count(bytes_of(inputs));
  return inner_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  count(bytes_of(inputs));
  return inner_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                             std::vector<std::vector<at::Tensor>>& inputs,
                                                             const c10d::ReduceScatterOptions& opts) {
  count(bytes_of(inputs));
  return inner_->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::ReduceScatterOptions& opts) {
  count(bytes_of(input));
  return inner_->reduce_scatter_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::reduce_scatter_single_coalesced(std::vector<at::Tensor>& outputs,
                                                                              std::vector<at::Tensor>& inputs,
                                                                              const c10d::ReduceScatterOptions& opts) {
  count(bytes_of(inputs));
  return inner_->reduce_scatter_single_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                                std::vector<std::int64_t>& output_splits,
                                                                std::vector<std::int64_t>& input_splits,
                                                                const c10d::AllToAllOptions& opts) {
  count(bytes_of(input));
  return inner_->all_to_all_single(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  count(bytes_of(inputs));
  return inner_->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  count(bytes_of(tensors));
  return inner_->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  count(0);
  return inner_->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  count(0);
  return inner_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> CountingGroup::barrier(const c10d::BarrierOptions& opts) {
  count(0);
  return inner_->barrier(opts);
}

void CountingGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  count(0);
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace graphpipe::runtime
