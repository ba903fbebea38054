// AllReduceHook: the default communication hook of GradientBuckets, one all-reduce (sum) of the
// bucket over the stage's replicas. Sum convention (comm_hook.h): the buckets hand over exact
// gradient shares and get back their exact sum, as before hooks existed.
//
// This is torch's c10d::_AllReduceBySumCommHook (default_comm_hooks.hpp, what DDP's reducer runs
// when no hook is registered), written again here because torch does not export that class from
// libtorch (its header lacks TORCH_API): the same runHook, an asynchronous all-reduce whose
// future yields the summed buffer.
#pragma once

#include "runtime/comm_hook.h"

namespace graphpipe::runtime {

class AllReduceHook final : public CommHook {
 public:
  std::string name() const override { return "all_reduce"; }
  HookResult convention() const override { return HookResult::sum; }
  bool serial() const override { return false; }

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;
  at::Tensor parseHookResult(const c10::IValue& result) override;

 protected:
  void on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) override;

 private:
  c10::intrusive_ptr<CountingGroup> group_;
};

}  // namespace graphpipe::runtime
