#include "runtime/topk_hook.h"

#include "cost/sync_cost.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "runtime/future_wait.h"

namespace graphpipe::runtime {

namespace {

constexpr const char* kResidualPrefix = "residual.";

std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.numel() << " elements of " << t.scalar_type();
  return out.str();
}

}  // namespace

TopKHook::TopKHook(double ratio) : ratio_(ratio) {
  if (!(ratio > 0.0 && ratio <= 1.0)) {
    std::ostringstream value;
    value << ratio;
    throw Error("graphpipe runtime: topk_hook: the ratio of entries sent must be in (0, 1], got " + value.str());
  }
}

std::string TopKHook::name() const {
  std::ostringstream out;
  out << "topk(ratio=" << ratio_ << ")";
  return out.str();
}

std::int64_t TopKHook::k_for(std::int64_t numel) const {
  if (numel <= 0) return 0;
  const auto k = static_cast<std::int64_t>(std::ceil(ratio_ * static_cast<double>(numel)));
  return std::min(numel, std::max<std::int64_t>(1, k));
}

void TopKHook::on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds) { group_ = group; }

c10::intrusive_ptr<c10::ivalue::Future> TopKHook::runHook(c10d::GradBucket& bucket) {
  const at::Tensor& buffer = bucket.getBuffer();
  const std::size_t index = bucket.getIndex();
  const std::int64_t n = buffer.numel();
  const std::int64_t k = k_for(n);
  if (k == 0) return completed_future(buffer);

  at::Tensor values;
  at::Tensor positions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = residuals_.find(index);
    if (it == residuals_.end()) {
      it = residuals_.emplace(index, at::zeros_like(buffer)).first;
    } else if (it->second.numel() != n || it->second.scalar_type() != buffer.scalar_type()) {
      throw Error("graphpipe runtime: " + name() + ": the residual of gradient bucket " + std::to_string(index) +
                  " has " + describe(it->second) + " but the bucket has " + describe(buffer) +
                  " (a state from another model, or other bucket sizes?)");
    }
    at::Tensor acc = buffer.add(it->second.to(buffer.device()));
    // The k largest magnitudes; order does not matter (every rank adds all entries anyway).
    positions = std::get<1>(acc.abs().topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false));
    values = acc.index_select(0, positions);
    // residual = acc - sent, exactly: the sent entries become zero, the others are kept.
    acc.index_fill_(0, positions, 0);
    it->second = acc;
  }
  const bool narrow_positions = cost::top_k_narrow_positions(static_cast<double>(n));
  const auto position_type = narrow_positions ? at::kInt : at::kLong;
  positions = positions.to(position_type);
  const std::int64_t value_bytes = k * static_cast<std::int64_t>(values.element_size());
  const std::int64_t position_bytes = k * static_cast<std::int64_t>(positions.element_size());
  // One payload per rank, so one collective: the values' bytes, then the positions' bytes.
  std::vector<at::Tensor> inputs{
      at::cat({values.contiguous().view(at::kByte), positions.contiguous().view(at::kByte)})};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < group_->getSize(); ++r) outputs[0].push_back(at::empty_like(inputs[0]));
  auto work = group_->allgather(outputs, inputs, c10d::AllgatherOptions());

  const auto value_type = buffer.scalar_type();
  const auto options = buffer.options();
  std::vector<at::Tensor> gathered = outputs[0];
  return work->getFuture()->then(
      [gathered, n, value_bytes, position_bytes, value_type, position_type,
       options](c10::ivalue::Future& done) -> c10::IValue {
        done.value();  // rethrows the collective's error
        at::Tensor dense = at::zeros({n}, options);
        for (const auto& payload : gathered) {
          // clone(): a byte slice at an offset cannot always be viewed as a wider type in place.
          at::Tensor v = payload.narrow(0, 0, value_bytes).clone().view(value_type);
          at::Tensor p = payload.narrow(0, value_bytes, position_bytes).clone().view(position_type);
          dense.index_add_(0, p, v);
        }
        return dense;
      },
      c10::TensorType::get());
}

at::Tensor TopKHook::parseHookResult(const c10::IValue& result) { return result.toTensor(); }

CommHook::StateDict TopKHook::state_dict() const {
  std::lock_guard<std::mutex> lock(mutex_);
  StateDict state;
  for (const auto& [index, residual] : residuals_) state[kResidualPrefix + std::to_string(index)] = residual.clone();
  return state;
}

void TopKHook::load_state_dict(const StateDict& state) {
  std::map<std::size_t, at::Tensor> loaded;
  const std::string prefix = kResidualPrefix;
  for (const auto& [key, tensor] : state) {
    std::size_t index = 0;
    bool ok = key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0;
    if (ok) {
      const std::string digits = key.substr(prefix.size());
      ok = digits.find_first_not_of("0123456789") == std::string::npos && digits.size() < 10;
      if (ok) index = static_cast<std::size_t>(std::stoul(digits));
    }
    if (!ok) {
      throw Error("graphpipe runtime: " + name() + ": load_state_dict: unexpected key '" + key +
                  "' (expected 'residual.<bucket index>')");
    }
    if (!tensor.defined() || tensor.dim() != 1) {
      throw Error("graphpipe runtime: " + name() + ": load_state_dict: '" + key +
                  "' must be a 1-D tensor (a bucket's residual)");
    }
    loaded[index] = tensor.detach().clone();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  residuals_ = std::move(loaded);
}

}  // namespace graphpipe::runtime
