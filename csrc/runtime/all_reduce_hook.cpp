#include "runtime/all_reduce_hook.h"

#include <ATen/core/jit_type.h>

namespace graphpipe::runtime {

void AllReduceHook::on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds) {
  group_ = group;
}

c10::intrusive_ptr<c10::ivalue::Future> AllReduceHook::runHook(c10d::GradBucket& bucket) {
  std::vector<at::Tensor> tensors{bucket.getBufferRef()};
  at::Tensor buffer = tensors.front();
  // The all-reduce sums in place; the future's value is the list of reduced tensors, read back
  // as the buffer itself.
  return group_->allreduce(tensors, c10d::AllreduceOptions())
      ->getFuture()
      ->then(
          [buffer](c10::ivalue::Future& done) -> c10::IValue {
            done.value();  // rethrows the collective's error
            return buffer;
          },
          c10::TensorType::get());
}

at::Tensor AllReduceHook::parseHookResult(const c10::IValue& result) { return result.toTensor(); }

}  // namespace graphpipe::runtime
