#include "runtime/future_wait.h"

#include <ATen/core/jit_type.h>

#include <condition_variable>
#include <memory>
#include <mutex>

namespace graphpipe::runtime {

bool wait_for(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::chrono::milliseconds timeout) {
  if (future->completed()) return true;
  // Shared with the callback, which may run after this function returned (on a timeout).
  struct Signal {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
  };
  auto signal = std::make_shared<Signal>();
  future->addCallback([signal](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(signal->mutex);
    signal->done = true;
    signal->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(signal->mutex);
  return signal->cv.wait_for(lock, timeout, [&] { return signal->done; });
}

c10::intrusive_ptr<c10::ivalue::Future> completed_future(const at::Tensor& value) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  future->markCompleted(value);
  return future;
}

}  // namespace graphpipe::runtime
