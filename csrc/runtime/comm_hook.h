// CommHook: how GradientBuckets (gradient_buckets.h) synchronises one bucket of a replicated
// stage's gradients. It is torch's DDP communication-hook interface (c10d::CommHookInterface,
// torch/csrc/distributed/c10d/comm.hpp: runHook(GradBucket) -> Future, parseHookResult) plus what
// the buckets must know to drive a hook that DDP's reducer would drive:
//
//   convention()  what the hook's result is. DDP's hooks (torch's allreduce, fp16 compression,
//                 PowerSGD) return the AVERAGE of the replicas' buckets, since DDP hands each
//                 rank's full local gradient over. graphpipe's replicas hold exact SHARES of the
//                 gradient (docs/design.md §7.4) whose SUM is the gradient. For an averaging hook
//                 the buckets therefore hand over share x (number of replicas), which is what DDP
//                 would hand over (a local-mean gradient), so that the average is the sum; the
//                 hooks written here sum and get the shares unscaled, so the default all-reduce
//                 stays exactly as exact as a plain sum.
//   serial()      whether the hook issues collectives from completion callbacks (a chain:
//                 PowerSGD's P then Q all-reduce, the hierarchical reduce-scatter, all-reduce,
//                 all-gather). Collectives on one group must be issued in the same order on every
//                 rank (Gloo matches them by a per-group sequence tag, NCCL by order); a chain's
//                 later steps, issued from a callback, could interleave differently with the next
//                 bucket's first step on different ranks. For such a hook the buckets start
//                 bucket k + 1 only once bucket k's future has completed. A hook that issues all
//                 its collectives inside runHook is not serial and overlaps freely.
//   attach()      called once, by the GradientBuckets the hook serves, with the stage's counted
//                 process group (counting_group.h) and the timeout: a hook communicates through
//                 that group (or groups sharing its counter) so its traffic is measured.
//   state_dict()  the hook's state that a checkpoint must carry (e.g. top-k's residuals), by
//                 name; load_state_dict() restores it. Default: none.
//
// A hook serves one GradientBuckets (attach throws on a second). Hooks run on autograd's thread or
// on a completion callback's thread, never two buckets of a serial hook at once.
#pragma once

#include <torch/csrc/distributed/c10d/comm.hpp>

#include <chrono>
#include <map>
#include <string>

#include "runtime/counting_group.h"

namespace graphpipe::runtime {

enum class HookResult {
  sum,      // the result is the sum of the replicas' buckets
  average,  // the result is their average (DDP's convention)
};

class CommHook : public c10d::CommHookInterface {
 public:
  using StateDict = std::map<std::string, at::Tensor>;

  virtual std::string name() const = 0;
  virtual HookResult convention() const = 0;
  virtual bool serial() const = 0;

  // Binds the hook to the stage's counted group; throws graphpipe::Error when called twice or
  // when the hook cannot serve this group (e.g. groups that do not fit it).
  void attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout);
  bool attached() const { return attached_; }

  virtual StateDict state_dict() const { return {}; }
  // Restores what state_dict() returned; throws graphpipe::Error naming the problem otherwise.
  virtual void load_state_dict(const StateDict& state);

 protected:
  virtual void on_attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) = 0;

 private:
  bool attached_ = false;
};

}  // namespace graphpipe::runtime
