#include "runtime/instruction_range.h"

namespace graphpipe::runtime {

InstructionRange::InstructionRange(const schedule::Instruction& ins, std::string_view phase)
    : range_(at::RecordScope::USER_SCOPE) {
  if (!range_.isActive()) return;
  name_ = "graphpipe::" + schedule::to_token(ins);
  name_ += phase;
  range_.before(std::string_view(name_), c10::ArrayRef<const c10::IValue>{});
}

}  // namespace graphpipe::runtime
