// GradientBuckets: synchronises the gradients of a replicated stage over its replicas, bucket by
// bucket, overlapped with the last backward of the iteration, through a communication hook.
//
// A stage with several ranks runs data parallel (schedule/schedule.h): each replica computes the
// gradients of its rows of every micro-batch, and the loss is scaled so that these are exact
// shares of the single-process gradient (graphpipe/runtime/pipeline.py), so the replicas' sum is
// that gradient. Parameters are grouped, in reverse registration order, into flat buffers of
// about `bucket_bytes` (per dtype and device; cost/gradient_buckets.h), and a hook on each
// parameter's gradient accumulator notices when the last backward has produced its gradient.
//
// Buckets start in index order, as DDP's reducer starts them: bucket k starts once its gradients
// and those of every bucket before it are final (the backward reaches the last layers first, so
// this is nearly the order in which they fill). Starting a bucket copies its gradients into its
// flat buffer, wraps it in torch's c10d::GradBucket (index, bucket count, buffer, per-parameter
// offsets, lengths, shapes and parameters; GradBucket::isLast() is true for the last bucket, the
// last one started in an iteration, which PowerSGD counts iterations by) and runs the
// communication hook on it (comm_hook.h: torch's c10d::CommHookInterface), keeping the Future it
// returns, while the backward goes on. The fixed order makes every replica issue its collectives
// in the same order, which Gloo and NCCL require. finish() starts the buckets still waiting
// (parameters the backward did not reach), waits for every bucket's future within the timeout,
// and copies the hook's result (parseHookResult) back into the gradients.
//
// Hooks: the default (AllReduceHook) sums, so that the result is the replicas' exact sum, as it
// has always been. A hook that averages (DDP's convention: torch's hooks) is handed the bucket
// multiplied by the number of replicas, so that its average is the sum (comm_hook.h says why).
// For a serial hook (one that issues collectives from completion callbacks) bucket k + 1 starts
// only when bucket k's future has completed.
//
// Measured traffic: the hook communicates through a CountingGroup (counting_group.h) that wraps
// the stage's group; `group` may already be one (made by the caller so that a hook's own state,
// e.g. PowerSGD's, can name it), otherwise one is made here. bytes_communicated() and
// collectives() are that group's counters: cumulative over iterations, reset by reset_traffic().
//
// This is the idea of DDP's reducer, written here because DDP's cannot be driven by a pipeline:
// DDP decides at the forward whether the next backward synchronises, and a pipeline runs the
// last micro-batch's forward before the backwards of earlier micro-batches (docs/design.md says
// more, §7.4). Hooks fire only between arm() and finish(); outside, backwards accumulate as usual.
//
// Gradients that are undefined stay undefined (their bucket slot holds zeros), as every replica
// runs the same graph and so leaves the same ones undefined. Errors, each naming the bucket and
// the hook: PipelineTimeout when a bucket does not finish within the timeout; a graphpipe::Error
// the hook raised (e.g. a bad state) as a graphpipe::Error; anything else (a failed collective,
// but also a Python hook's exception, which cannot be told apart from one) as PeerError. A hook's
// exception is reported by finish(), never thrown into autograd's engine.
// The hooks on the accumulators are removed by the destructor (RAII). Thread safety: accumulator
// hooks may run on autograd's threads, and hooks' callbacks on the backend's; state is guarded,
// and callbacks hold only what they use (never this object).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/comm_hook.h"
#include "runtime/counting_group.h"

namespace graphpipe::runtime {

class GradientBuckets {
 public:
  // `hook` null: AllReduceHook. The hook is attached to the counted group here (comm_hook.h).
  GradientBuckets(std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::ProcessGroup> group,
                  std::chrono::milliseconds timeout, double bucket_bytes, std::shared_ptr<CommHook> hook = nullptr);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // The next backward is the iteration's last: start each bucket once its gradients are final.
  void arm();
  // Starts the buckets not started yet, waits for every bucket's hook and writes its result into
  // the gradients; disarms. Returns when the first bucket was started (for measured traces).
  std::chrono::steady_clock::time_point finish();

  // After a failed iteration: disarms and forgets the hooks' futures, without waiting for them.
  void abandon();
  // Whether the backward running now is the iteration's last (between arm() and finish()): an
  // emulated stage (graphpipe/testing/emulate.py) hands the parameters gradients only then.
  bool armed() const { return armed_.load(); }

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  double bytes() const;  // gradient bytes synchronised per iteration (the buckets' sizes)
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  const c10::intrusive_ptr<CountingGroup>& group() const { return group_; }
  const std::shared_ptr<CommHook>& hook() const { return hook_; }
  // Payload bytes and collectives the hook handed to its groups (counting_group.h), cumulative.
  std::int64_t bytes_communicated() const { return group_->bytes_communicated(); }
  std::int64_t collectives() const { return group_->collectives(); }
  void reset_traffic() { group_->reset(); }

 private:
  struct Bucket {
    std::vector<int> parameters;  // indices into parameters_
    std::int64_t numel = 0;
    at::Tensor flat;
    int pending = 0;  // gradients not yet final in this iteration
    bool started = false;
    c10::intrusive_ptr<c10::ivalue::Future> future;  // the hook's result
  };
  void ready(int parameter);      // a gradient is final (called with mutex_ held)
  void start_ready();             // start the buckets whose turn it is (mutex_ held)
  void start(std::size_t index);  // copy into the flat buffer and run the hook
  c10d::GradBucket grad_bucket(std::size_t index) const;
  [[noreturn]] void fail(std::size_t index, std::exception_ptr error) const;
  [[noreturn]] void check_group_error(const std::string& what, const std::string& failure) const;

  std::vector<at::Tensor> parameters_;
  std::vector<int> bucket_of_;        // parameter -> bucket
  std::vector<std::int64_t> offset_;  // parameter -> offset in its bucket's flat buffer
  std::vector<Bucket> buckets_;
  std::vector<char> seen_;  // parameter's gradient final in this iteration
  c10::intrusive_ptr<CountingGroup> group_;
  std::shared_ptr<CommHook> hook_;
  std::chrono::milliseconds timeout_;
  std::size_t next_ = 0;                              // the next bucket to start, in index order
  c10::intrusive_ptr<c10::ivalue::Future> previous_;  // the last started bucket's future (serial hooks)
  // The accumulators are kept alive (a parameter's accumulator is otherwise recreated, without
  // the hook, when the last graph that referenced it is freed), with their hooks' keys.
  std::vector<std::pair<decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>())), std::uintptr_t>>
      hooks_;
  std::mutex mutex_;
  // Written under mutex_; atomic so that armed() reads it without the lock (from autograd's
  // threads, while an accumulator hook may hold it).
  std::atomic<bool> armed_ = false;
  std::optional<std::chrono::steady_clock::time_point> first_launch_;
};

}  // namespace graphpipe::runtime
