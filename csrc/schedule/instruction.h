// Instruction: one step of one rank's program in a pipeline schedule.
//
// A schedule (schedule.h) gives every rank an ordered list of instructions. Each names what to
// do (receive an activation, run a forward, send an activation, receive a gradient, run a
// backward, send a gradient, step the optimizer, sum the gradients of a replicated stage's replicas), the stage it
// belongs to, the micro-batch and, for transfers, the stage edge (an index into Plan::edges) that the tensor travels
// on.
//
// Tokens. Every instruction prints as one short token, in the spirit of
// torch.distributed.pipelining's "1F0": <stage><code>[<micro-batch>][e<edge>]
//
//   code  kind              micro-batch  edge   example
//   F     forward           yes          no     1F0     stage 1, forward of micro-batch 0
//   B     backward          yes          no     1B0
//   I     backward_input    yes          no     1I0     the input-gradient half of a backward
//   W     backward_weight   yes          no     1W0     its weight-gradient half
//   RF    recv_activation   yes          yes    1RF0e0  stage 1 receives activation 0 over edge 0
//   SF    send_activation   yes          yes    0SF0e0  stage 0 sends it
//   RB    recv_gradient     yes          yes    0RB0e0  stage 0 receives the gradient back
//   SB    send_gradient     yes          yes    1SB0e0
//   OPT   optimizer_step    no           no     1OPT
//   AR    all_reduce        no           no     1AR     the replicas' gradients summed
//
// Zero-bubble schedules split a backward in two: I computes the gradients of the stage's inputs
// (which the previous stage waits for), W those of its parameters (which nothing waits for, so
// it can fill a bubble). A stage's micro-batch has either one B, or one I and, later, one W.
//
// A send and a receive of the same transfer carry the same edge and micro-batch; the stage is
// the one on the instruction's own rank (the sender's stage on a send, the receiver's on a
// receive). parse_token(to_token(i)) == i for every valid instruction. Both are O(length).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace graphpipe::schedule {

enum class OpKind : std::uint8_t {
  recv_activation,
  forward,
  send_activation,
  recv_gradient,
  backward,
  send_gradient,
  optimizer_step,
  all_reduce,
  backward_input,
  backward_weight,
};

struct Instruction {
  OpKind kind = OpKind::forward;
  int stage = 0;
  int micro_batch = -1;  // -1 for optimizer_step and all_reduce
  int edge = -1;         // index into Plan::edges for sends and receives, -1 otherwise

  bool operator==(const Instruction&) const = default;
};

// Which instructions move data between ranks, and in which direction.
bool is_transfer(OpKind kind);
bool is_send(OpKind kind);
bool is_recv(OpKind kind);
// forward, the backwards, optimizer_step, all_reduce: instructions that run on the rank's own device.
inline bool is_compute(OpKind kind) { return !is_transfer(kind); }
bool has_micro_batch(OpKind kind);
// backward or backward_input: the instruction that produces the gradients a stage sends back.
inline bool produces_input_gradients(OpKind kind) { return kind == OpKind::backward || kind == OpKind::backward_input; }

// "forward", "recv_activation", ... (the enum names); parse_kind_name is the inverse.
std::string_view kind_name(OpKind kind);
OpKind parse_kind_name(std::string_view name);
// "F", "RF", ... as in the table above.
std::string_view kind_code(OpKind kind);

std::string to_token(const Instruction& instruction);
// Parses one token; throws FormatError naming the token and what is wrong with it.
Instruction parse_token(std::string_view token);

// The instruction on the other rank that a send or receive pairs with (same edge, micro-batch,
// direction); `peer_stage` is the stage at the other end of the edge.
Instruction matching_transfer(const Instruction& instruction, int peer_stage);

// "forward of micro-batch 3 at stage 1", "receive of the activation of micro-batch 0 over edge 2
// at stage 1", for messages.
std::string describe(const Instruction& instruction);

}  // namespace graphpipe::schedule
