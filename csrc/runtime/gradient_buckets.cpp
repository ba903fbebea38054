#include "runtime/gradient_buckets.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <sstream>
#include <string>

#include "cost/gradient_buckets.h"
#include "runtime/all_reduce_hook.h"
#include "runtime/errors.h"
#include "runtime/future_wait.h"

namespace graphpipe::runtime {

namespace {

std::string first_line(const std::string& message) {
  auto end = message.find('\n');
  return end == std::string::npos ? message : message.substr(0, end);
}

c10::intrusive_ptr<CountingGroup> counted(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  if (!group) throw Error("graphpipe runtime: no process group given for the replicas' gradients");
  if (auto already = c10::dynamic_intrusive_pointer_cast<CountingGroup>(group)) return already;
  return c10::make_intrusive<CountingGroup>(std::move(group));
}

}  // namespace

GradientBuckets::GradientBuckets(std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                 std::chrono::milliseconds timeout, double bucket_bytes, std::shared_ptr<CommHook> hook)
    : parameters_(std::move(parameters)),
      group_(counted(std::move(group))),
      hook_(hook ? std::move(hook) : std::make_shared<AllReduceHook>()),
      timeout_(timeout) {
  const int P = static_cast<int>(parameters_.size());
  bucket_of_.assign(P, -1);
  offset_.assign(P, 0);
  seen_.assign(P, 0);
  // The cost model's layout (cost/gradient_buckets.h: reverse registration order, so that the
  // first buckets fill and start first; one open bucket per dtype and device).
  std::vector<cost::BucketEntry> entries;
  entries.reserve(P);
  for (const auto& t : parameters_) {
    entries.push_back({std::string(c10::toString(t.scalar_type())), t.device().str(),
                       static_cast<int>(t.element_size()), t.numel(), t.requires_grad()});
  }
  for (const cost::GradientBucket& layout : cost::bucket_layout(entries, bucket_bytes)) {
    Bucket& b = buckets_.emplace_back();
    for (int p : layout.parameters) {
      bucket_of_[p] = static_cast<int>(buckets_.size()) - 1;
      offset_[p] = b.numel;
      b.numel += parameters_[p].numel();
      b.parameters.push_back(p);
    }
  }
  for (auto& b : buckets_) {
    const auto& first = parameters_[b.parameters.front()];
    b.flat = at::zeros({b.numel}, first.options().requires_grad(false));
  }
  // Before the accumulator hooks exist: attaching may communicate (a hook's check of its groups)
  // and may throw.
  hook_->attach(group_, timeout_);
  for (int p = 0; p < P; ++p) {
    if (bucket_of_[p] < 0) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[p]);
    const auto key = accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, p](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          std::lock_guard<std::mutex> lock(mutex_);
          if (armed_) ready(p);
          return outputs;
        }));
    hooks_.emplace_back(std::move(accumulator), key);
  }
}

GradientBuckets::~GradientBuckets() {
  for (auto& [accumulator, key] : hooks_) accumulator->del_post_hook(key);
}

double GradientBuckets::bytes() const {
  double total = 0.0;
  for (const auto& b : buckets_) total += static_cast<double>(b.numel * b.flat.element_size());
  return total;
}

void GradientBuckets::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  first_launch_.reset();
  next_ = 0;
  previous_.reset();
  std::fill(seen_.begin(), seen_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.parameters.size());
    b.started = false;
    b.future.reset();
  }
}

void GradientBuckets::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  previous_.reset();
  for (auto& b : buckets_) b.future.reset();
}

void GradientBuckets::ready(int p) {
  if (seen_[p]) return;  // one call per backward; guard against a parameter reached twice
  seen_[p] = 1;
  --buckets_[bucket_of_[p]].pending;
  start_ready();
}

void GradientBuckets::start_ready() {
  while (next_ < buckets_.size() && buckets_[next_].pending == 0) start(next_++);
}

c10d::GradBucket GradientBuckets::grad_bucket(std::size_t k) const {
  const Bucket& b = buckets_[k];
  std::vector<std::size_t> offsets;
  std::vector<std::size_t> lengths;
  std::vector<c10::IntArrayRef> sizes;  // refer to the parameters' own sizes, alive as long as they are
  std::vector<at::Tensor> parameters;
  for (int p : b.parameters) {
    offsets.push_back(static_cast<std::size_t>(offset_[p]));
    lengths.push_back(static_cast<std::size_t>(parameters_[p].numel()));
    sizes.push_back(parameters_[p].sizes());
    parameters.push_back(parameters_[p]);
  }
  return c10d::GradBucket(k, buckets_.size(), b.flat, std::move(offsets), std::move(lengths), std::move(sizes),
                          std::move(parameters), std::nullopt);
}

void GradientBuckets::start(std::size_t k) {
  Bucket& b = buckets_[k];
  for (int p : b.parameters) {
    const at::Tensor grad = parameters_[p].grad();
    auto slot = b.flat.narrow(0, offset_[p], parameters_[p].numel());
    if (grad.defined()) {
      slot.copy_(grad.reshape({-1}));
    } else {
      slot.zero_();
    }
  }
  // An averaging hook gets what DDP would give it (share x replicas), so its average is the sum.
  if (hook_->convention() == HookResult::average) b.flat.mul_(group_->getSize());
  if (!first_launch_) first_launch_ = std::chrono::steady_clock::now();
  b.started = true;
  auto hook = hook_;  // callbacks hold the hook and the bucket, never this object
  auto bucket = grad_bucket(k);
  if (hook->serial() && previous_ && !previous_->completed()) {
    b.future = previous_->thenAsync(
        [hook, bucket](c10::ivalue::Future& previous) mutable -> c10::intrusive_ptr<c10::ivalue::Future> {
          if (previous.hasError()) std::rethrow_exception(previous.exception_ptr());
          return hook->runHook(bucket);
        },
        c10::AnyType::get());
  } else {
    try {
      b.future = hook->runHook(bucket);
    } catch (...) {
      // Reported by finish() with the bucket's name, not thrown into autograd's engine.
      b.future = c10::make_intrusive<c10::ivalue::Future>(c10::AnyType::get());
      b.future->setError(std::current_exception());
    }
  }
  previous_ = b.future;
}

std::chrono::steady_clock::time_point GradientBuckets::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (next_ < buckets_.size()) start(next_++);
  armed_ = false;
  const auto first = first_launch_.value_or(std::chrono::steady_clock::now());
  lock.unlock();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    auto future = std::move(b.future);
    if (!wait_for(future, timeout_)) {
      check_group_error("the communication hook " + hook_->name() + " of gradient bucket " + std::to_string(k) +
                            " of " + std::to_string(buckets_.size()) + " over the stage's " +
                            std::to_string(group_->getSize()) + " replicas",
                        "");
    }
    if (future->hasError()) fail(k, future->exception_ptr());
    at::Tensor result;
    try {
      result = hook_->parseHookResult(future->value());
    } catch (...) {
      fail(k, std::current_exception());
    }
    if (!result.defined() || result.numel() != b.numel) {
      throw Error("graphpipe runtime: the communication hook " + hook_->name() + " returned " +
                  (result.defined() ? std::to_string(result.numel()) + " elements" : std::string("no tensor")) +
                  " for gradient bucket " + std::to_string(k) + " of " + std::to_string(b.numel) + " elements");
    }
    result = result.reshape({-1});
    for (int p : b.parameters) {
      at::Tensor grad = parameters_[p].mutable_grad();
      if (grad.defined()) grad.copy_(result.narrow(0, offset_[p], grad.numel()).view_as(grad));
    }
  }
  previous_.reset();
  return first;
}

void GradientBuckets::fail(std::size_t k, std::exception_ptr error) const {
  const std::string what = "the communication hook " + hook_->name() + " of gradient bucket " + std::to_string(k) +
                           " of " + std::to_string(buckets_.size()) + " over the stage's " +
                           std::to_string(group_->getSize()) + " replicas";
  try {
    std::rethrow_exception(error);
  } catch (const PeerError&) {
    throw;
  } catch (const Error& e) {
    // The hook's own refusal (a bad state, bad input): not a peer's failure.
    throw Error("rank " + std::to_string(group_->getRank()) + " of the replicas: " + what + " failed: " + e.what());
  } catch (const std::exception& e) {
    check_group_error(what, first_line(e.what()));
  } catch (...) {
    check_group_error(what, "unknown error");
  }
  throw Error(what + " failed");  // not reached: check_group_error throws
}

[[noreturn]] void GradientBuckets::check_group_error(const std::string& what, const std::string& failure) const {
  std::ostringstream seconds;
  seconds << static_cast<double>(timeout_.count()) / 1000.0;
  const std::string rank = "rank " + std::to_string(group_->getRank()) + " of the replicas";
  if (failure.empty() || failure.find("imed out") != std::string::npos || failure.find("imeout") != std::string::npos) {
    throw PipelineTimeout(rank + ": timed out after " + seconds.str() + " s waiting for " + what +
                          " (a replica is stuck or dead)" + (failure.empty() ? "" : " [" + failure + "]"));
  }
  throw PeerError(rank + ": " + what + " failed: " + failure);
}

}  // namespace graphpipe::runtime
