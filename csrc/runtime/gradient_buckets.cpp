#include "runtime/gradient_buckets.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <map>
#include <sstream>
#include <tuple>

#include "runtime/errors.h"

namespace graphpipe::runtime {

namespace {

std::string first_line(const std::string& message) {
  auto end = message.find('\n');
  return end == std::string::npos ? message : message.substr(0, end);
}

}  // namespace

GradientBuckets::GradientBuckets(std::vector<at::Tensor> parameters, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                 std::chrono::milliseconds timeout, double bucket_bytes)
    : parameters_(std::move(parameters)), group_(std::move(group)), timeout_(timeout) {
  if (!group_) throw Error("graphpipe runtime: no process group given for the replicas' gradients");
  const int P = static_cast<int>(parameters_.size());
  bucket_of_.assign(P, -1);
  offset_.assign(P, 0);
  seen_.assign(P, 0);
  // Reverse registration order, one open bucket per (dtype, device): the backward produces the
  // last layers' gradients first, so the first buckets fill (and start) first.
  std::map<std::tuple<int, int, int>, int> open;
  for (int p = P - 1; p >= 0; --p) {
    const auto& t = parameters_[p];
    if (!t.requires_grad()) continue;
    const auto key = std::make_tuple(static_cast<int>(t.scalar_type()), static_cast<int>(t.device().type()),
                                     static_cast<int>(t.device().index()));
    auto it = open.find(key);
    if (it == open.end() ||
        static_cast<double>(buckets_[it->second].numel * t.element_size()) >= bucket_bytes) {
      buckets_.emplace_back();
      it = open.insert_or_assign(key, static_cast<int>(buckets_.size()) - 1).first;
    }
    Bucket& b = buckets_[it->second];
    bucket_of_[p] = it->second;
    offset_[p] = b.numel;
    b.numel += t.numel();
    b.parameters.push_back(p);
  }
  for (auto& b : buckets_) {
    const auto& first = parameters_[b.parameters.front()];
    b.flat = at::zeros({b.numel}, first.options().requires_grad(false));
  }
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
  std::fill(seen_.begin(), seen_.end(), 0);
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.parameters.size());
    b.work.reset();
  }
}

void GradientBuckets::abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  for (auto& b : buckets_) b.work.reset();
}

void GradientBuckets::ready(int p) {
  if (seen_[p]) return;  // one call per backward; guard against a parameter reached twice
  seen_[p] = 1;
  Bucket& b = buckets_[bucket_of_[p]];
  if (--b.pending == 0) launch(b);
}

void GradientBuckets::launch(Bucket& b) {
  for (int p : b.parameters) {
    const at::Tensor grad = parameters_[p].grad();
    auto slot = b.flat.narrow(0, offset_[p], parameters_[p].numel());
    if (grad.defined()) {
      slot.copy_(grad.reshape({-1}));
    } else {
      slot.zero_();
    }
  }
  std::vector<at::Tensor> tensors{b.flat};
  if (!first_launch_) first_launch_ = std::chrono::steady_clock::now();
  try {
    b.work = group_->allreduce(tensors);
  } catch (const std::exception& e) {
    throw PeerError("the sum of a replicated stage's gradients could not start: " + first_line(e.what()));
  }
}

std::chrono::steady_clock::time_point GradientBuckets::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto& b : buckets_) {
    if (!b.work) launch(b);
  }
  armed_ = false;
  const auto first = first_launch_.value_or(std::chrono::steady_clock::now());
  lock.unlock();
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    Bucket& b = buckets_[k];
    std::string failure;
    bool done = false;
    try {
      done = b.work->wait(timeout_);
    } catch (const std::exception& e) {
      failure = first_line(e.what());
    }
    b.work.reset();
    if (!done || !failure.empty()) {
      const std::string what = "the all-reduce of gradient bucket " + std::to_string(k) + " of " +
                               std::to_string(buckets_.size()) + " over the stage's " +
                               std::to_string(group_->getSize()) + " replicas";
      check_group_error(what, failure);
    }
    for (int p : b.parameters) {
      at::Tensor grad = parameters_[p].mutable_grad();
      if (grad.defined()) grad.copy_(b.flat.narrow(0, offset_[p], grad.numel()).view_as(grad));
    }
  }
  return first;
}

void GradientBuckets::check_group_error(const std::string& what, const std::string& failure) const {
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
