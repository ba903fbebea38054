// Injected faults: what the executor does, for failure tests, before the first instruction of
// chosen kinds in one run. graphpipe/runtime/faults.py parses GRAPHPIPE_FAULT and decides which
// instruction kinds a phase means; the executor only gets "before the first of these kinds,
// do this" for its next run (Executor::set_faults), so the rule lives in one language.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "schedule/instruction.h"

namespace graphpipe::runtime {

enum class FaultAction : std::uint8_t {
  raise,  // throw an InjectedFaultError (runtime/errors.h) naming the fault
  hang,   // sleep `seconds`, then go on
  kill,   // SIGKILL of this process
};

// "raise", "hang" or "kill"; throws Error naming anything else.
FaultAction parse_fault_action(const std::string& name);

struct InjectedFault {
  std::vector<schedule::OpKind> kinds;  // fires before the first instruction of any of these
  FaultAction action = FaultAction::raise;
  double seconds = 0.0;  // how long a hang sleeps
  std::string label;     // names the fault in errors and in the flight recorder
};

// The faults of one run: each fires once, before the first instruction of its kinds.
class FaultPlan {
 public:
  void arm(std::vector<InjectedFault> faults) { faults_ = std::move(faults); }
  void clear() { faults_.clear(); }
  bool empty() const { return faults_.empty(); }
  // Removes and returns the first fault due before an instruction of `kind` (or none).
  std::optional<InjectedFault> take(schedule::OpKind kind);

 private:
  std::vector<InjectedFault> faults_;
};

// Carries out `fault` before the instruction described by `where`: throws (raise), sleeps
// (hang) or kills this process (kill).
void fire(const InjectedFault& fault, const std::string& where);

}  // namespace graphpipe::runtime
