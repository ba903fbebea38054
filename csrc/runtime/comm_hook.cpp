#include "runtime/comm_hook.h"

#include "common/error.h"

namespace graphpipe::runtime {

void CommHook::attach(const c10::intrusive_ptr<CountingGroup>& group, std::chrono::milliseconds timeout) {
  if (attached_) {
    throw Error("graphpipe runtime: the communication hook " + name() +
                " already serves a GradientBuckets; a hook keeps per-bucket state, make one per stage");
  }
  on_attach(group, timeout);
  attached_ = true;
}

void CommHook::load_state_dict(const StateDict& state) {
  if (!state.empty()) {
    throw Error("graphpipe runtime: the communication hook " + name() + " has no state, but was given " +
                std::to_string(state.size()) + " entries (first: '" + state.begin()->first + "')");
  }
}

}  // namespace graphpipe::runtime
