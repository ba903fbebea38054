// The CUDA path of the runtime (compiled only with -DGRAPHPIPE_WITH_CUDA=ON, which defines
// GRAPHPIPE_WITH_CUDA=1): transfers of a stage run on their own CUDA stream, ordered against the
// stage's compute stream with events, so communication overlaps computation; the backend is NCCL.
//
// Around every communication batch (Executor's TransferHooks):
//   enter: record an event on the compute stream (the current stream: forwards and backwards
//          were queued there) and make the transfer stream wait for it, so a send never reads an
//          activation or gradient before the kernel producing it has run; then make the
//          transfer stream current, so that ProcessGroupNCCL orders its internal NCCL streams
//          after it when the sends and receives are posted, and Work::wait() makes it (not the
//          compute stream) wait for the NCCL kernels;
//   exit:  record an event on the transfer stream and make the compute stream wait for it, so
//          kernels that read received tensors are queued after the receives; the compute stream
//          is current again. Neither blocks the host: only Work::wait with the runtime's timeout
//          does (ProcessGroupNCCL blocks the calling thread until completion or timeout when a
//          timeout is given), which keeps the no-hang guarantee of the CPU path.
// Receive buffers are allocated on the stage's device (Executor::set_device).
//
// Only torch's device-generic stream and event API is used (c10::Stream, c10::Event and the
// CUDA guard implementation that libc10_cuda registers), so this compiles against any torch
// build, CPU wheels included, and needs no CUDA headers; constructing TransferStreams without a
// CUDA torch at run time throws (no CUDA guard registered).
#pragma once

#if GRAPHPIPE_WITH_CUDA

#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <memory>

#include "runtime/executor.h"

namespace graphpipe::runtime::cuda {

class TransferStreams {
 public:
  explicit TransferStreams(c10::DeviceIndex device);
  void enter();
  void exit();
  c10::Stream transfer_stream() const { return transfer_; }

 private:
  c10::Device device_;
  c10::impl::VirtualGuardImpl impl_;
  c10::Stream compute_;
  c10::Stream transfer_;
};

// Runs `executor`'s transfers on a dedicated stream of GPU `device` and allocates its receive
// buffers there. The executor's hooks share ownership of the returned streams.
std::shared_ptr<TransferStreams> use_cuda(Executor& executor, c10::DeviceIndex device);

}  // namespace graphpipe::runtime::cuda

#endif  // GRAPHPIPE_WITH_CUDA
