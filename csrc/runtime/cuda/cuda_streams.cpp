#include "runtime/cuda/cuda_streams.h"

#if GRAPHPIPE_WITH_CUDA

#include <c10/core/Event.h>

namespace graphpipe::runtime::cuda {

TransferStreams::TransferStreams(c10::DeviceIndex device)
    : device_(c10::DeviceType::CUDA, device),
      impl_(c10::DeviceType::CUDA),
      compute_(impl_.getStream(device_)),
      transfer_(impl_.getStreamFromGlobalPool(device_, /*isHighPriority=*/true)) {}

void TransferStreams::enter() {
  compute_ = impl_.getStream(device_);  // the stream forwards and backwards were queued on
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(compute_);
  ready.block(transfer_);
  impl_.exchangeStream(transfer_);
}

void TransferStreams::exit() {
  c10::Event landed(c10::DeviceType::CUDA);
  landed.record(transfer_);
  landed.block(compute_);
  impl_.exchangeStream(compute_);
}

std::shared_ptr<TransferStreams> use_cuda(Executor& executor, c10::DeviceIndex device) {
  auto streams = std::make_shared<TransferStreams>(device);
  executor.set_device(c10::Device(c10::DeviceType::CUDA, device));
  TransferHooks hooks;
  hooks.enter = [streams] { streams->enter(); };
  hooks.exit = [streams] { streams->exit(); };
  executor.set_transfer_hooks(std::move(hooks));
  return streams;
}

}  // namespace graphpipe::runtime::cuda

#endif  // GRAPHPIPE_WITH_CUDA
