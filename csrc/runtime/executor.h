// Executor: runs one rank's instruction list of a Schedule on real tensors.
//
// The rank holds one stage, or several stages that each run on it alone (plan/rank_sharing.h);
// every instruction names its stage, and each stage keeps its own micro-batch state. Per
// instruction:
//   RF  receive the activation tensors of a stage edge into fresh buffers of the edge's declared
//       shapes and dtypes; floating ones become leaves with requires_grad (training);
//   F   call the stage's forward function (a callback: the Python stage module) with the
//       received tensors of every incoming edge; it returns the tensors of every outgoing edge
//       and, on the loss stage, the micro-batch's loss (already scaled by 1/M); all are stashed;
//   SF  send the stashed outputs of an edge (detached, contiguous);
//   RB  receive the gradients of an outgoing edge's floating tensors;
//   B   torch::autograd::backward over the stashed loss (gradient 1) and the outputs that require
//       grad (their received gradients), then drop the stash of that micro-batch's outputs;
//   I   (zero-bubble schedules) the input-gradient half: the gradients of the same roots with
//       respect to the received activations only, into their .grad, recording on the way the
//       gradients that arrive where the parameters' paths join the input path; the roots and
//       the rest of the graph I ran are released (runtime/split_backward.h). A stage without
//       trainable parameters keeps nothing: its I is its whole backward;
//   W   the weight-gradient half: autograd from those joins, fed the recorded gradients, to the
//       stage's parameters (set_parameters), accumulating into their .grad and freeing the
//       graph. It computes no activation gradient that I computed, so I + W costs about one B
//       (docs/results.md). A stage whose received tensors need no gradient (the first) has no
//       input path: its W is the plain backward from the roots;
//   SB  send the .grad of the edge's received leaves (zeros where autograd left none);
//   AR  (replicated stages) wait for the replicas' gradient sum, started bucket by bucket during
//       the last backward (gradient_buckets.h), and write it into the gradients; nothing where
//       the replicas update locally (set_local_updates: local SGD averages after the step);
//   OPT nothing: the user's optimizer steps after run().
// Local edges (Schedule::local: both stages on this rank) have no transfer instructions: the
// producer's F hands its outputs to the consumer as fresh leaves (detached from its graph, as a
// receive would give them), and the consumer's B or I hands the leaves' gradients back as if
// they had been received, so each stage's backward stays its own (and splits into I and W on
// its own). A parameter tied between two stages of one rank is one tensor in both stage modules:
// both backwards accumulate into its one .grad.
// Replicated stages (schedule.h): the rank runs replica r of its stage on the rows
// schedule::shard_rows gives it in every micro-batch; its inputs, outputs and gradients have
// those rows. A transfer exchanges, with every rank of the other stage, the rows both own
// (schedule/shards.h), each piece its own send or receive; a receive lands every piece in its
// rows of one buffer. Every tensor on an edge of a replicated stage is split along its first
// dimension, which must be the micro-batch (set_edge_specs checks it).
// Transfers are posted in program order and waited for lazily: a receive right before the
// compute that reads it, a send at the end of the run (transport.h, executor.cpp). Over a
// backend that matches by tag (Gloo), receives are posted one ahead: reaching a receive also
// posts the next one of the same kind over the same edge, so that a rendezvous send finds its
// receive waiting (executor.cpp says why); or, with ReceivePosting::whole_step, the run's
// receives are posted at its start, as many as fit the memory the plan leaves on the rank.
// Only floating tensors carry gradients, decided by the declared dtype on both ends, so a sender
// and a receiver always agree on which tensors travel back; a tensor that does not require grad
// on the sending side just ignores its gradient.
//
// Evaluation (train = false) runs only RF, F and SF, in schedule order: dropping the backward half
// of a deadlock-free global order keeps it deadlock-free.
//
// Every instruction and the gradient all-reduce are recorded in a flight recorder
// (flight_recorder.h; on by default, shared with its readers so that it outlives the executor),
// and injected faults (fault_injection.h) fire before the first instruction of their kinds.
//
// The core knows no Python: the forward is a std::function, which the bindings implement by
// calling the Python stage with the GIL held; run() is called with the GIL released.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/fault_injection.h"
#include "runtime/flight_recorder.h"
#include "runtime/gradient_buckets.h"
#include "runtime/split_backward.h"
#include "runtime/transport.h"
#include "schedule/schedule.h"
#include "schedule/shards.h"

namespace graphpipe::runtime {

struct StageOutput {
  std::vector<std::vector<at::Tensor>> edges;  // per outgoing edge (out_edges() order)
  at::Tensor loss;                             // undefined unless this is the loss stage
};

// (stage, micro_batch, tensors per incoming edge in in_edges(stage) order) -> outputs.
using ForwardFn = std::function<StageOutput(int, int, std::vector<std::vector<at::Tensor>>&)>;

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

// When a tag-matching backend's receives are posted (set_receive_posting). Gloo's send is a
// rendezvous: where its receive's notice has not reached the sender when the send is posted, the
// data leaves only once the sender's communication thread reads that notice, and on a rank that
// computes that thread may wait milliseconds for its CPU (docs/design.md, "Receives posted
// ahead").
enum class ReceivePosting {
  one_ahead,   // reaching a receive posts it and the next one of its stream (kind and edge)
  whole_step,  // the run's receives at its start, in program order, while their buffers fit
               // the posting's budget (the rest one ahead): those buffers live from then on,
               // memory the planner's model does not count (it counts the micro-batches a stage
               // holds), so the budget is what the plan leaves of its memory limit on the rank
               // (plan/rank_memory.h), and at most kWholeStepBytes
};
// The most receive buffers whole_step posts at a run's start, in bytes, where the plan has no
// memory limit. A run with more instructions than the flight recorder's ring holds (less
// kFaultRecords) posts one ahead: a record opened at the start must still be in the ring when its
// receive is waited for.
constexpr std::int64_t kWholeStepBytes = std::int64_t{256} << 20;
constexpr std::size_t kFaultRecords = 16;

class Executor {
 public:
  Executor(schedule::Schedule schedule, int rank, c10::intrusive_ptr<c10d::ProcessGroup> group,
           std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int stage() const { return stages_.empty() ? -1 : stages_.front(); }  // the first; -1: none
  const std::vector<int>& stages() const { return stages_; }            // every stage it holds
  int replica() const { return replica_; }                              // index among the stage's ranks (0: the lead)
  // This rank's rows of a micro-batch of `rows` rows (all of them unless the stage is replicated).
  schedule::RowRange my_rows(std::int64_t rows) const;
  const schedule::Schedule& schedule() const { return schedule_; }
  const std::vector<schedule::Instruction>& program() const;
  // A stage's incoming and outgoing edges, in the schedule's edge order (what ForwardFn takes
  // and returns); empty for a stage this rank does not hold.
  const std::vector<int>& in_edges(int stage) const;
  const std::vector<int>& out_edges(int stage) const;

  // Declared tensors of every stage edge (index = edge) for a whole micro-batch of `rows` rows:
  // prototypes whose shape and dtype are those of the transferred tensors (meta tensors are
  // fine). Must be set before run(). `rows` matters only where a stage is replicated (0: none
  // is). Throws TransferMismatch when an edge of a replicated stage carries a tensor whose first
  // dimension is not the micro-batch, PlanningError when a replica would get no row.
  void set_edge_specs(std::vector<std::vector<at::Tensor>> specs, std::int64_t rows = 0);
  // The sum of this replica's gradients with the other replicas' (required on a replicated
  // stage: its program has an all_reduce).
  void set_gradient_buckets(std::shared_ptr<GradientBuckets> buckets) { buckets_ = std::move(buckets); }
  // Instead, the replicas of this rank's stage update on their own gradients (local SGD,
  // graphpipe/runtime/replica_sync.py averages their parameters after the optimizer step): AR
  // then has nothing to wait for.
  void set_local_updates(bool on) { local_updates_ = on; }
  // A stage's trainable parameters: what its W instructions compute the gradients of (required
  // for every stage whose backwards the program splits). An empty list is a stage without
  // trainable parameters (only parameter-free operators, or frozen ones): its I frees the graph
  // at once and its W has nothing to do; not calling this at all is the error run() reports.
  // Throws when this rank does not hold `stage`.
  void set_parameters(int stage, std::vector<at::Tensor> parameters);
  // How many micro-batches' state (received activations, stashed outputs, graphs kept between an
  // I and its W) the executor holds: 0 after every run(), which is what tests check.
  // (Counted per stage and micro-batch.)
  std::size_t held_micro_batches() const { return state_.size(); }
  void set_timeout(std::chrono::milliseconds timeout) {
    transport_.set_timeout(timeout);
    if (buckets_) buckets_->set_timeout(timeout);
  }
  // Where receive buffers are allocated: CPU (default, Gloo) or the stage's GPU (NCCL).
  void set_device(c10::Device device) { device_ = device; }
  // GPU stages over a CPU-only backend (Gloo): transfers go through host copies (transport.h).
  void set_host_staging(bool on) { transport_.set_host_staging(on); }
  // When receives are posted (ReceivePosting; one_ahead unless set). whole_step needs a backend
  // that matches by tag (a backend matching by order, NCCL, would pair them wrongly): elsewhere
  // it throws Error naming the backend. whole_step posts buffers of at most
  // min(memory_headroom_bytes, kWholeStepBytes) at a run's start: the memory this rank may hold
  // beyond the plan's prediction (plan::rank_memory_headroom; infinity: no limit). A negative
  // or NaN headroom throws Error.
  void set_receive_posting(ReceivePosting posting,
                           double memory_headroom_bytes = std::numeric_limits<double>::infinity());
  ReceivePosting receive_posting() const { return receive_posting_; }
  // whole_step's budget, in bytes (kWholeStepBytes until set_receive_posting gives a headroom).
  std::int64_t whole_step_budget_bytes() const { return whole_step_budget_; }
  // The bytes of receive buffers the last run posted at its start (0 posting one ahead).
  std::int64_t posted_at_start_bytes() const { return posted_at_start_bytes_; }
  c10::Device device() const { return device_; }
  void set_transfer_hooks(TransferHooks hooks) { hooks_ = std::move(hooks); }
  // The ring of this rank's last instructions (shared: a watcher or a dump may outlive the
  // executor, e.g. after a failure closed the pipeline).
  const std::shared_ptr<FlightRecorder>& flight_recorder() const { return flight_; }
  // Faults for the next run() only (failure tests): each fires before the first instruction of
  // its kinds; run() forgets those left when it returns or throws.
  void set_faults(std::vector<InjectedFault> faults) { faults_.arm(std::move(faults)); }

  // Runs this rank's program once; returns per-instruction timings when `record`.
  std::vector<InstructionTiming> run(const ForwardFn& forward, bool train, bool record = false);

  // After a failure: drops the executor's handles on its process group (the transport's) and
  // on the gradient buckets (and so on the replicas' group), so that closing the groups closes
  // this rank's connections, which wakes the peers blocked on it, even while something still
  // holds the executor (a kept exception's traceback holds the frames that hold it). run()
  // throws afterwards.
  void disconnect() {
    transport_.disconnect();
    buckets_.reset();
  }

 private:
  struct MicroBatchState {
    std::map<int, std::vector<at::Tensor>> received;  // in-edge -> activations (leaves)
    std::map<int, std::vector<at::Tensor>> outputs;   // out-edge -> produced tensors
    std::map<int, std::vector<at::Tensor>> grads;     // out-edge -> received gradients
    at::Tensor loss;
    // Between an I and its W: where W starts, with the gradients I recorded there.
    PendingWeights pending;
  };
  // A transfer instruction posted and not yet waited for: its operations and, for a receive,
  // the buffers they land in.
  struct InFlight {
    schedule::Instruction ins;
    std::vector<Transport::Posted> posted;
    std::vector<at::Tensor> tensors;
    double start = 0.0;
    FlightRecorder::Id flight = FlightRecorder::kNone;
  };
  // One run()'s state (executor.cpp): the instructions that run, the transfers in flight, the
  // timings recorded.
  struct Run;
  // Runs instruction `i` of the run's list: a switch over schedule::OpKind, one case per kind
  // naming its handler below, so that reordering or adding a kind cannot dispatch to another
  // kind's handler (a kind without a case fails the build: -Werror=switch).
  void dispatch(Run& run, std::size_t i);

  void exec_recv_activation(Run& run, std::size_t i);  // RF
  void exec_forward(Run& run, std::size_t i);          // F
  void exec_send_activation(Run& run, std::size_t i);  // SF
  void exec_recv_gradient(Run& run, std::size_t i);    // RB
  void exec_backward(Run& run, std::size_t i);         // B
  void exec_send_gradient(Run& run, std::size_t i);    // SB
  void exec_optimizer_step(Run& run, std::size_t i);   // OPT
  void exec_all_reduce(Run& run, std::size_t i);       // AR
  void exec_backward_input(Run& run, std::size_t i);   // I
  void exec_backward_weight(Run& run, std::size_t i);  // W

  // run()'s steps.
  void check_ready(bool train) const;
  void prepare(Run& run) const;
  // ReceivePosting::whole_step: posts the run's receives in program order while their buffers
  // fit whole_step_budget_.
  void post_receives(Run& run);
  // The bytes of the buffers a receive instruction allocates on this rank.
  std::int64_t receive_bytes(const schedule::Instruction& ins) const;
  void drain(Run& run);
  // A transfer reached in program order: posts it unless posted ahead, and posts ahead the next
  // receive of its stream (tag-matching backends).
  void reach_transfer(Run& run, std::size_t i);
  void post_transfer(Run& run, const schedule::Instruction& ins);
  // Waits for a transfer's operations, between the transfer hooks; records its span.
  void finish(Run& run, InFlight& f);
  // Waits for the receive (kind, micro-batch, edge) if it is in flight, and stores what landed.
  void land(Run& run, schedule::OpKind kind, int micro_batch, int edge);
  // Waits for every send (all) or only those seen complete.
  void reap_sends(Run& run, bool all);
  // Runs `body` between the transfer hooks' enter() and exit() (exit() also when it throws).
  template <class Body>
  void with_transfer_hooks(Body&& body);
  // Opens the instruction's profiler range, runs `body` and records the instruction's span
  // (from `start`, or from what body returns when it returns a time).
  template <class Body>
  void compute(Run& run, std::size_t i, Body&& body);
  // Runs `body`; if it throws, closes flight record `id` as failed (with the error's first line)
  // before the exception goes on.
  template <class Body>
  void recorded(FlightRecorder::Id id, Body&& body);
  // Fires the injected fault due before instruction i, if any.
  void inject(Run& run, std::size_t i);

  bool holds(int stage) const;  // whether this rank runs `stage`
  std::string where(const schedule::Instruction& ins) const;
  void post(const schedule::Instruction& ins, bool train, std::vector<TransferOp>& ops,
            std::vector<at::Tensor>& buffers);
  void forward(const schedule::Instruction& ins, const ForwardFn& fn, bool train);
  // A local edge: the producer's outputs to the consumer as leaves (after F), the consumer's
  // leaves' gradients back to the producer (after B or I).
  void hand_over_activations(int micro_batch, int edge, const std::vector<at::Tensor>& outputs, bool train);
  void hand_back_gradients(int micro_batch, int stage);
  MicroBatchState& state_of(int stage, int micro_batch) { return state_[{stage, micro_batch}]; }
  void backward(const schedule::Instruction& ins);
  // The roots of a micro-batch's backward (its loss and outputs that require grad) and their
  // gradients; drops the stashed outputs and received gradients.
  void take_roots(const schedule::Instruction& ins, std::vector<at::Tensor>& roots, std::vector<at::Tensor>& grads);
  void backward_input(const schedule::Instruction& ins);
  void backward_weight(const schedule::Instruction& ins);
  void check_outputs(int stage, int micro_batch, const StageOutput& out) const;
  void check_edge_outputs(int stage, int micro_batch, int edge, const std::vector<at::Tensor>& got) const;
  // A tensor of edge `edge` as this rank holds it: the spec with its first dimension cut to this
  // replica's rows when the stage is replicated.
  std::vector<int64_t> local_shape(const at::Tensor& spec) const;
  // Whether a replicated stage is at either end of an edge (its tensors then travel by rows).
  bool sharded(int edge) const;
  // One peer's share of a transfer: the rows [offset, offset + length) of this rank's tensor
  // (length -1: the whole tensor, on an edge between stages of one rank each).
  struct Piece {
    int peer = 0;
    std::int64_t offset = 0;
    std::int64_t length = -1;
  };
  std::vector<Piece> pieces(const schedule::Instruction& ins) const;
  // The description of tensor k (of n) of a transfer's piece, for error messages: built only
  // when a transfer fails or is logged.
  std::string describe_piece(const schedule::Instruction& ins, std::size_t k, std::size_t n, const Piece& part) const;

  schedule::Schedule schedule_;
  int rank_;
  std::vector<int> stages_;  // this rank's stages, ascending
  // The stage that is replicated on this rank, -1 if none; the rank then holds no other stage
  // (a stage shares its rank only when it runs on it alone), so rows and replicas are its.
  int replicated_stage_ = -1;
  int replica_ = 0;
  std::vector<std::vector<int>> in_edges_, out_edges_;  // per stage (empty where not held)
  std::vector<std::vector<at::Tensor>> specs_;
  std::int64_t rows_ = 0;  // of a micro-batch, as given with the specs
  std::shared_ptr<GradientBuckets> buckets_;
  bool local_updates_ = false;
  std::map<int, std::vector<at::Tensor>> parameters_;  // per stage; absent: set_parameters never called
  Transport transport_;
  c10::Device device_{c10::kCPU};
  ReceivePosting receive_posting_ = ReceivePosting::one_ahead;
  std::int64_t whole_step_budget_ = kWholeStepBytes;
  std::int64_t posted_at_start_bytes_ = 0;
  TransferHooks hooks_;
  std::map<std::pair<int, int>, MicroBatchState> state_;  // (stage, micro-batch)
  std::vector<int> replica_peers_;                        // the other ranks of this rank's stage (AR's peers)
  std::shared_ptr<FlightRecorder> flight_ = std::make_shared<FlightRecorder>();
  FaultPlan faults_;
};

}  // namespace graphpipe::runtime
