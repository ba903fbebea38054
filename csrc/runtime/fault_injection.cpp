#include "runtime/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"
#include "runtime/errors.h"

namespace graphpipe::runtime {

FaultAction parse_fault_action(const std::string& name) {
  if (name == "raise") return FaultAction::raise;
  if (name == "hang") return FaultAction::hang;
  if (name == "kill") return FaultAction::kill;
  throw Error("graphpipe runtime: unknown injected fault action '" + name + "' (raise, hang or kill)");
}

std::optional<InjectedFault> FaultPlan::take(schedule::OpKind kind) {
  auto it = std::find_if(faults_.begin(), faults_.end(), [kind](const InjectedFault& f) {
    return std::find(f.kinds.begin(), f.kinds.end(), kind) != f.kinds.end();
  });
  if (it == faults_.end()) return std::nullopt;
  InjectedFault fault = std::move(*it);
  faults_.erase(it);
  return fault;
}

void fire(const InjectedFault& fault, const std::string& where) {
  switch (fault.action) {
    case FaultAction::raise:
      throw InjectedFaultError(fault.label + ": raise before " + where);
    case FaultAction::hang:
      std::this_thread::sleep_for(std::chrono::duration<double>(fault.seconds));
      return;
    case FaultAction::kill:
      ::kill(::getpid(), SIGKILL);
      std::this_thread::sleep_for(std::chrono::seconds(60));  // SIGKILL is not delivered at once
      return;
  }
}

}  // namespace graphpipe::runtime
