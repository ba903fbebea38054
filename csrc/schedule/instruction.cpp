#include "schedule/instruction.h"

#include <array>
#include <cctype>

#include "common/error.h"

namespace graphpipe::schedule {

namespace {

struct KindInfo {
  OpKind kind;
  std::string_view name;
  std::string_view code;
};

constexpr std::array<KindInfo, 10> kKinds{{
    {OpKind::recv_activation, "recv_activation", "RF"},
    {OpKind::forward, "forward", "F"},
    {OpKind::send_activation, "send_activation", "SF"},
    {OpKind::recv_gradient, "recv_gradient", "RB"},
    {OpKind::backward, "backward", "B"},
    {OpKind::send_gradient, "send_gradient", "SB"},
    {OpKind::optimizer_step, "optimizer_step", "OPT"},
    {OpKind::all_reduce, "all_reduce", "AR"},
    {OpKind::backward_input, "backward_input", "I"},
    {OpKind::backward_weight, "backward_weight", "W"},
}};

const KindInfo& info(OpKind kind) { return kKinds[static_cast<std::size_t>(kind)]; }

// Reads a run of decimal digits at `pos`; -1 when there is none.
long read_number(std::string_view text, std::size_t& pos) {
  std::size_t start = pos;
  long value = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    value = value * 10 + (text[pos] - '0');
    if (value > 1'000'000'000) return -2;  // absurdly large: reported as malformed
    ++pos;
  }
  return pos == start ? -1 : value;
}

}  // namespace

bool is_send(OpKind kind) { return kind == OpKind::send_activation || kind == OpKind::send_gradient; }
bool is_recv(OpKind kind) { return kind == OpKind::recv_activation || kind == OpKind::recv_gradient; }
bool is_transfer(OpKind kind) { return is_send(kind) || is_recv(kind); }
bool has_micro_batch(OpKind kind) { return kind != OpKind::optimizer_step && kind != OpKind::all_reduce; }

std::string_view kind_name(OpKind kind) { return info(kind).name; }
std::string_view kind_code(OpKind kind) { return info(kind).code; }

OpKind parse_kind_name(std::string_view name) {
  for (const auto& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  throw FormatError("unknown instruction kind '" + std::string(name) +
                    "' (expected recv_activation, forward, send_activation, recv_gradient, "
                    "backward, send_gradient, optimizer_step, all_reduce, backward_input or backward_weight)");
}

std::string to_token(const Instruction& instruction) {
  std::string token = std::to_string(instruction.stage);
  token += kind_code(instruction.kind);
  if (has_micro_batch(instruction.kind)) token += std::to_string(instruction.micro_batch);
  if (is_transfer(instruction.kind)) token += "e" + std::to_string(instruction.edge);
  return token;
}

Instruction parse_token(std::string_view token) {
  auto bad = [&](const std::string& why) {
    return FormatError("bad schedule token '" + std::string(token) + "': " + why +
                       " (expected <stage><code>[<micro-batch>][e<edge>], e.g. 1F0, 0SF3e2, 1OPT)");
  };
  std::size_t pos = 0;
  long stage = read_number(token, pos);
  if (stage < 0) throw bad("it does not start with a stage number");
  std::size_t code_start = pos;
  while (pos < token.size() && std::isupper(static_cast<unsigned char>(token[pos]))) ++pos;
  std::string_view code = token.substr(code_start, pos - code_start);
  const KindInfo* found = nullptr;
  for (const auto& k : kKinds) {
    if (k.code == code) found = &k;
  }
  if (found == nullptr) throw bad("unknown code '" + std::string(code) + "'");
  Instruction result;
  result.kind = found->kind;
  result.stage = static_cast<int>(stage);
  if (has_micro_batch(result.kind)) {
    long mb = read_number(token, pos);
    if (mb < 0) throw bad("missing micro-batch number after '" + std::string(code) + "'");
    result.micro_batch = static_cast<int>(mb);
  }
  if (is_transfer(result.kind)) {
    if (pos >= token.size() || token[pos] != 'e') throw bad("a transfer needs 'e<edge>'");
    ++pos;
    long edge = read_number(token, pos);
    if (edge < 0) throw bad("missing edge number after 'e'");
    result.edge = static_cast<int>(edge);
  }
  if (pos != token.size()) throw bad("unexpected trailing '" + std::string(token.substr(pos)) + "'");
  return result;
}

Instruction matching_transfer(const Instruction& instruction, int peer_stage) {
  Instruction peer = instruction;
  peer.stage = peer_stage;
  switch (instruction.kind) {
    case OpKind::send_activation:
      peer.kind = OpKind::recv_activation;
      break;
    case OpKind::recv_activation:
      peer.kind = OpKind::send_activation;
      break;
    case OpKind::send_gradient:
      peer.kind = OpKind::recv_gradient;
      break;
    case OpKind::recv_gradient:
      peer.kind = OpKind::send_gradient;
      break;
    default:
      throw Error("matching_transfer: " + to_token(instruction) + " is not a transfer");
  }
  return peer;
}

std::string describe(const Instruction& i) {
  const std::string mb = std::to_string(i.micro_batch);
  const std::string at = " at stage " + std::to_string(i.stage);
  const std::string over = " over edge " + std::to_string(i.edge);
  switch (i.kind) {
    case OpKind::forward:
      return "forward of micro-batch " + mb + at;
    case OpKind::backward:
      return "backward of micro-batch " + mb + at;
    case OpKind::backward_input:
      return "input-gradient backward of micro-batch " + mb + at;
    case OpKind::backward_weight:
      return "weight-gradient backward of micro-batch " + mb + at;
    case OpKind::send_activation:
      return "send of the activation of micro-batch " + mb + over + at;
    case OpKind::recv_activation:
      return "receive of the activation of micro-batch " + mb + over + at;
    case OpKind::send_gradient:
      return "send of the gradient of micro-batch " + mb + over + at;
    case OpKind::recv_gradient:
      return "receive of the gradient of micro-batch " + mb + over + at;
    case OpKind::optimizer_step:
      return "optimizer step" + at;
    case OpKind::all_reduce:
      return "all-reduce of the replicas' gradients" + at;
  }
  return "?";
}

}  // namespace graphpipe::schedule
