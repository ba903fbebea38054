// GradientBuckets: sums the gradients of a replicated stage over its replicas, overlapped with
// the last backward of the iteration.
//
// A stage with several ranks runs data parallel (schedule/schedule.h): each replica computes the
// gradients of its rows of every micro-batch, and the loss is scaled so that these are exact
// shares of the single-process gradient (graphpipe/runtime/pipeline.py), so the replicas' sum is
// that gradient. The sum runs in buckets (cost/gradient_buckets.h): parameters are grouped, in
// reverse registration order, into flat buffers of about `bucket_bytes` (per dtype and device),
// and a hook on each parameter's gradient accumulator notices when the last backward has
// produced its gradient. Once every gradient of a bucket is final, the bucket is copied into
// its flat buffer and summed with an asynchronous all-reduce on the stage's own process group,
// while the backward goes on with the other parameters. finish() then starts the buckets still
// waiting (parameters the backward did not reach), waits for every sum within the timeout, and
// copies the sums back into the gradients.
//
// This is the idea of DDP's reducer, written here because DDP's cannot be driven by a pipeline:
// DDP decides at the forward whether the next backward synchronises, and a pipeline runs the
// last micro-batch's forward before the backwards of earlier micro-batches (docs/design.md says
// more, §7.4). Hooks fire only between arm() and finish(); outside, backwards accumulate as usual.
//
// Gradients that are undefined stay undefined (their bucket slot sums zeros), as every replica
// runs the same graph and so leaves the same ones undefined. Errors: PipelineTimeout when a sum
// does not finish within the timeout, PeerError when the group fails. The hooks are removed by
// the destructor (RAII). Thread safety: hooks may run on autograd's threads; state is guarded.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace graphpipe::runtime {

class GradientBuckets {
 public:
  GradientBuckets(std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::ProcessGroup> group,
                  std::chrono::milliseconds timeout, double bucket_bytes);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets&) = delete;
  GradientBuckets& operator=(const GradientBuckets&) = delete;

  // The next backward is the iteration's last: start each bucket once its gradients are final.
  void arm();
  // Starts the buckets not started yet, waits for every sum and writes it into the gradients;
  // disarms. Returns when the first bucket was started (for measured traces).
  std::chrono::steady_clock::time_point finish();

  // After a failed iteration: disarms and forgets sums in flight, without waiting for them.
  void abandon();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  double bytes() const;  // gradient bytes summed per iteration
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

 private:
  struct Bucket {
    std::vector<int> parameters;  // indices into parameters_
    std::int64_t numel = 0;
    at::Tensor flat;
    int pending = 0;              // gradients not yet final in this iteration
    c10::intrusive_ptr<c10d::Work> work;
  };
  void ready(int parameter);               // a gradient is final (called with mutex_ held)
  void launch(Bucket& bucket);             // copy into the flat buffer and start the sum
  void check_group_error(const std::string& what, const std::string& failure) const;

  std::vector<at::Tensor> parameters_;
  std::vector<int> bucket_of_;              // parameter -> bucket
  std::vector<std::int64_t> offset_;        // parameter -> offset in its bucket's flat buffer
  std::vector<Bucket> buckets_;
  std::vector<char> seen_;                  // parameter's gradient final in this iteration
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::chrono::milliseconds timeout_;
  // The accumulators are kept alive (a parameter's accumulator is otherwise recreated, without
  // the hook, when the last graph that referenced it is freed), with their hooks' keys.
  std::vector<std::pair<decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>())), std::uintptr_t>>
      hooks_;
  std::mutex mutex_;
  bool armed_ = false;
  std::optional<std::chrono::steady_clock::time_point> first_launch_;
};

}  // namespace graphpipe::runtime
