// TopKHook: top-k sparsification with error feedback, a communication hook for GradientBuckets
// that sends a fixed fraction of each bucket instead of all of it.
//
// Per bucket of n elements, on every replica (Stich et al., "Sparsified SGD with memory",
// NeurIPS 2018; Lin et al., "Deep Gradient Compression", ICLR 2018):
//   acc       = bucket + residual               (residual: what this rank did not send before)
//   k         = ceil(ratio x n), at least 1
//   sent      = the k entries of acc of largest magnitude (values and positions)
//   residual  = acc - sent                      (acc with the sent entries zeroed: exact)
// then one all-gather of every rank's (values, positions), a fixed k per rank so the all-gather
// needs no sizes first, and every rank adds the d ranks' entries into a dense zero tensor, in
// rank order, so every replica gets the same result: the sum of what the ranks sent. Sum
// convention (comm_hook.h): the buckets hand over exact shares, and what is not sent this
// iteration is carried, not lost, so over iterations every share is applied.
//
// Traffic: the payload is the k values (the bucket's dtype) followed by the k positions (int32
// when n < 2^31, else int64), packed as bytes into one tensor, so one all-gather per bucket of
// k x (value bytes + position bytes) handed over per rank (counting_group.h). The residual
// update runs inside runHook; only the dense sum waits for the all-gather (a then-callback), so
// the backward is not blocked, and the hook is not serial.
//
// State: one residual per bucket index, created as zeros on first use; state_dict() names them
// "residual.<bucket index>" (copies, for checkpoints), load_state_dict() restores them and the
// next runHook checks each against its bucket (size, dtype) with an error naming the bucket.
// Guarded by a mutex (state_dict may be read while a backward runs).
#pragma once

#include <map>
#include <mutex>

#include "runtime/comm_hook.h"

namespace graphpipe::runtime {

class TopKHook final : public CommHook {
 public:
  // ratio in (0, 1]; graphpipe::Error otherwise.
  explicit TopKHook(double ratio);

  std::string name() const override;
  HookResult convention() const override { return HookResult::sum; }
  bool serial() const override { return false; }
  double ratio() const { return ratio_; }
  // Entries sent per rank for a bucket of `numel` elements.
  std::int64_t k_for(std::int64_t numel) const;

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;
  at::Tensor parseHookResult(const c10::IValue& result) override;

  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 protected:
  void on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) override;

 private:
  double ratio_;
  c10::intrusive_ptr<CountingGroup> group_;
  mutable std::mutex mutex_;
  std::map<std::size_t, at::Tensor> residuals_;  // bucket index -> residual
};

}  // namespace graphpipe::runtime
