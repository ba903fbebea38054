// Executor: runs one rank's instruction list of a Schedule on real tensors.
//
// The rank holds one stage (schedule.h: one stage per rank). Per instruction:
//   RF  receive the activation tensors of a stage edge into fresh buffers of the edge's declared
//       shapes and dtypes; floating ones become leaves with requires_grad (training);
//   F   call the stage's forward function (a callback: the Python stage module) with the
//       received tensors of every incoming edge; it returns the tensors of every outgoing edge
//       and, on the loss stage, the micro-batch's loss (already scaled by 1/M); all are stashed;
//   SF  send the stashed outputs of an edge (detached, contiguous);
//   RB  receive the gradients of an outgoing edge's floating tensors;
//   B   torch::autograd::backward over the stashed loss (gradient 1) and the outputs that require
//       grad (their received gradients), then drop the stash of that micro-batch's outputs;
//   SB  send the .grad of the edge's received leaves (zeros where autograd left none);
//   OPT nothing: the user's optimizer steps after run().
// Transfers are posted in program order and waited for lazily: a receive right before the
// compute that reads it, a send at the end of the run (transport.h, executor.cpp). Over a
// backend that matches by tag (Gloo), receives are posted one ahead: reaching a receive also
// posts the next one of the same kind over the same edge, so that a rendezvous send finds its
// receive waiting (executor.cpp says why).
// Only floating tensors carry gradients, decided by the declared dtype on both ends, so a sender
// and a receiver always agree on which tensors travel back; a tensor that does not require grad
// on the sending side just ignores its gradient.
//
// Evaluation (train = false) runs only RF, F and SF, in schedule order: dropping the backward half
// of a deadlock-free global order keeps it deadlock-free.
//
// The core knows no Python: the forward is a std::function, which the bindings implement by
// calling the Python stage with the GIL held; run() is called with the GIL released.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/transport.h"
#include "schedule/schedule.h"

namespace graphpipe::runtime {

struct StageOutput {
  std::vector<std::vector<at::Tensor>> edges;  // per outgoing edge (out_edges() order)
  at::Tensor loss;                             // undefined unless this is the loss stage
};

// (micro_batch, tensors per incoming edge in in_edges() order) -> outputs.
using ForwardFn = std::function<StageOutput(int, std::vector<std::vector<at::Tensor>>&)>;

// Called around every communication batch: enter() before the first operation is posted,
// exit() after every wait returned (also when one threw). The CUDA path (cuda/cuda_streams.h)
// uses them to run transfers on their own stream, ordered against compute with events.
struct TransferHooks {
  std::function<void()> enter;
  std::function<void()> exit;
};

// One executed instruction and when it ran; the instruction itself, so that readers (the
// measured traces of graphpipe.runtime.measure) need not parse its token.
struct InstructionTiming {
  schedule::Instruction instruction;
  double start = 0.0;  // seconds since the start of run()
  double end = 0.0;
};

class Executor {
 public:
  Executor(schedule::Schedule schedule, int rank, c10::intrusive_ptr<c10d::ProcessGroup> group,
           std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int stage() const { return stage_; }  // -1 when the rank holds no stage
  const schedule::Schedule& schedule() const { return schedule_; }
  const std::vector<schedule::Instruction>& program() const;
  const std::vector<int>& in_edges() const { return in_edges_; }
  const std::vector<int>& out_edges() const { return out_edges_; }

  // Declared tensors of every stage edge (index = edge): prototypes whose shape and dtype are
  // those of the transferred tensors (meta tensors are fine). Must be set before run().
  void set_edge_specs(std::vector<std::vector<at::Tensor>> specs);
  void set_timeout(std::chrono::milliseconds timeout) { transport_.set_timeout(timeout); }
  // Where receive buffers are allocated: CPU (default, Gloo) or the stage's GPU (NCCL).
  void set_device(c10::Device device) { device_ = device; }
  // GPU stages over a CPU-only backend (Gloo): transfers go through host copies (transport.h).
  void set_host_staging(bool on) { transport_.set_host_staging(on); }
  c10::Device device() const { return device_; }
  void set_transfer_hooks(TransferHooks hooks) { hooks_ = std::move(hooks); }

  // Runs this rank's program once; returns per-instruction timings when `record`.
  std::vector<InstructionTiming> run(const ForwardFn& forward, bool train, bool record = false);

 private:
  struct MicroBatchState {
    std::map<int, std::vector<at::Tensor>> received;   // in-edge -> activations (leaves)
    std::map<int, std::vector<at::Tensor>> outputs;    // out-edge -> produced tensors
    std::map<int, std::vector<at::Tensor>> grads;      // out-edge -> received gradients
    at::Tensor loss;
  };

  std::string where(const schedule::Instruction& ins) const;
  void post(const schedule::Instruction& ins, bool train, std::vector<TransferOp>& ops,
            std::vector<std::pair<schedule::Instruction, std::vector<at::Tensor>>>& landed);
  void forward(const schedule::Instruction& ins, const ForwardFn& fn, bool train);
  void backward(const schedule::Instruction& ins);
  void check_outputs(int micro_batch, const StageOutput& out) const;

  schedule::Schedule schedule_;
  int rank_;
  int stage_ = -1;
  std::vector<int> in_edges_, out_edges_;
  std::vector<std::vector<at::Tensor>> specs_;
  Transport transport_;
  c10::Device device_{c10::kCPU};
  TransferHooks hooks_;
  std::map<int, MicroBatchState> state_;
};

}  // namespace graphpipe::runtime
