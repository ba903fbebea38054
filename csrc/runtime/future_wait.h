// Bounded waits and small building blocks for c10 futures, the results of communication hooks.
//
// c10::ivalue::Future::wait() has no timeout, and every blocking wait of the runtime must have
// one (a dead peer must surface as PipelineTimeout, not a hang), so wait_for waits on a callback
// with a deadline. completed_future makes the already-finished future that a skipped step of a
// chain (thenAsync) returns.
#pragma once

#include <ATen/core/ivalue.h>

#include <chrono>

namespace graphpipe::runtime {

// Waits until `future` completes (with a value or an error) or `timeout` passes; true if it
// completed. Never throws the future's error: the caller reads it.
bool wait_for(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::chrono::milliseconds timeout);

// A future of tensor type, completed with `value`.
c10::intrusive_ptr<c10::ivalue::Future> completed_future(const at::Tensor& value);

}  // namespace graphpipe::runtime
