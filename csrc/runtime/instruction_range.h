// torch.profiler ranges for the executor's instructions.
//
// Every instruction the executor runs (a forward, a backward or its I and W halves, the
// all-reduce wait, and each transfer's post and wait) runs inside an at::RecordFunction of the
// user scope named "graphpipe::<token>" after the instruction's schedule token ("1F0": stage 1,
// forward, micro-batch 0; "0SF2e1": stage 0 sends micro-batch 2's activation over edge 1; see
// schedule/instruction.h), with " post" or " wait" appended for the two halves of a transfer.
// A torch.profiler trace (and Perfetto) thus shows which forward, backward, send or receive of
// which micro-batch each kernel belongs to. When no profiler listens, a range costs the one
// check RecordFunction makes; its name is built only when a callback is active.
#pragma once

#include <ATen/record_function.h>

#include <string>
#include <string_view>

#include "schedule/instruction.h"

namespace graphpipe::runtime {

class InstructionRange {
 public:
  // Opens the range; it closes when the object goes out of scope. `phase` is appended to the
  // name ("" for computes, " post" or " wait" for transfers).
  explicit InstructionRange(const schedule::Instruction& ins, std::string_view phase = {});

  InstructionRange(const InstructionRange&) = delete;
  InstructionRange& operator=(const InstructionRange&) = delete;

 private:
  std::string name_;  // outlives range_ (members are destroyed in reverse order)
  at::RecordFunction range_;
};

}  // namespace graphpipe::runtime
