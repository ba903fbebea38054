#include "runtime/executor.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <sstream>

#include "common/log.h"
#include "runtime/errors.h"
#include "runtime/instruction_range.h"
#include "runtime/split_backward.h"

namespace graphpipe::runtime {

using schedule::Instruction;
using schedule::OpKind;

namespace {

const std::vector<Instruction> kEmpty;
const std::vector<int> kNoPeers;              // (also: no edges)
const std::vector<int>& kNoEdges = kNoPeers;  // a compute instruction's peers in the flight recorder
// Waits at least this long are logged as long (debug level): where the pipeline's bubbles are.
constexpr double kLongWaitMs = 10.0;

bool carries_grad(const at::Tensor& spec) {
  return at::isFloatingType(spec.scalar_type()) || at::isComplexType(spec.scalar_type());
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type();
  return s.str();
}

int tag_of(int edge, bool gradient, std::size_t k) {
  return (edge * 2 + (gradient ? 1 : 0)) * 64 + static_cast<int>(k % 64);
}

std::int64_t payload_bytes(const std::vector<TransferOp>& ops) {
  std::int64_t bytes = 0;
  for (const auto& op : ops) bytes += static_cast<std::int64_t>(op.tensor.nbytes());
  return bytes;
}

std::string first_line(const char* what) {
  std::string text(what);
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

Executor::Executor(schedule::Schedule schedule, int rank, c10::intrusive_ptr<c10d::ProcessGroup> group,
                   std::chrono::milliseconds timeout)
    : schedule_(std::move(schedule)), rank_(rank), transport_(std::move(group), timeout) {
  schedule::validate(schedule_);
  if (transport_.rank() != rank_) {
    throw Error("graphpipe runtime: executor for rank " + std::to_string(rank_) +
                " got a process group in which this process is rank " + std::to_string(transport_.rank()));
  }
  if (schedule_.num_ranks() > transport_.size()) {
    throw Error("graphpipe runtime: the schedule needs " + std::to_string(schedule_.num_ranks()) +
                " ranks but the process group has " + std::to_string(transport_.size()));
  }
  for (int s = 0; s < schedule_.num_stages(); ++s) {
    const auto& ranks = schedule_.stage_ranks[s];
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      if (ranks[k] != rank_) continue;
      stages_.push_back(s);
      if (ranks.size() > 1) {
        replicated_stage_ = s;
        replica_ = static_cast<int>(k);
      }
    }
  }
  if (replicated_stage_ >= 0) {
    for (int r : schedule_.stage_ranks[replicated_stage_]) {
      if (r != rank_) replica_peers_.push_back(r);
    }
  }
  in_edges_.resize(schedule_.stage_ranks.size());
  out_edges_.resize(schedule_.stage_ranks.size());
  for (int e = 0; e < static_cast<int>(schedule_.edges.size()); ++e) {
    const auto& se = schedule_.edges[e];
    if (holds(se.dst)) in_edges_[se.dst].push_back(e);
    if (holds(se.src)) out_edges_[se.src].push_back(e);
  }
}

bool Executor::holds(int stage) const { return std::binary_search(stages_.begin(), stages_.end(), stage); }

const std::vector<int>& Executor::in_edges(int stage) const {
  return holds(stage) ? in_edges_[static_cast<std::size_t>(stage)] : kNoEdges;
}

const std::vector<int>& Executor::out_edges(int stage) const {
  return holds(stage) ? out_edges_[static_cast<std::size_t>(stage)] : kNoEdges;
}

void Executor::set_parameters(int stage, std::vector<at::Tensor> parameters) {
  if (!holds(stage)) {
    throw Error("graphpipe runtime: set_parameters for stage " + std::to_string(stage) + ", which rank " +
                std::to_string(rank_) + " does not hold");
  }
  parameters_[stage] = std::move(parameters);
}

const std::vector<Instruction>& Executor::program() const {
  if (rank_ >= schedule_.num_ranks()) return kEmpty;
  return schedule_.ranks[rank_];
}

schedule::RowRange Executor::my_rows(std::int64_t rows) const {
  if (replicated_stage_ < 0) return {0, rows};
  return schedule::shard_rows(rows, schedule_.replicas(replicated_stage_), replica_);
}

void Executor::set_edge_specs(std::vector<std::vector<at::Tensor>> specs, std::int64_t rows) {
  if (specs.size() != schedule_.edges.size()) {
    throw Error("graphpipe runtime: " + std::to_string(specs.size()) + " edge specs for " +
                std::to_string(schedule_.edges.size()) + " stage edges");
  }
  for (int s = 0; s < schedule_.num_stages(); ++s) {
    if (schedule_.replicas(s) < 2) continue;
    if (rows < 1) {
      throw Error("graphpipe runtime: stage " + std::to_string(s) +
                  " is replicated, so set_edge_specs needs the micro-batch's row count");
    }
    schedule::shard_rows(rows, schedule_.replicas(s), 0);  // throws when a replica gets no row
  }
  for (std::size_t e = 0; e < specs.size(); ++e) {
    if (!sharded(static_cast<int>(e))) continue;
    const auto& se = schedule_.edges[e];
    for (std::size_t k = 0; k < specs[e].size(); ++k) {
      const auto& t = specs[e][k];
      if (t.dim() == 0 || t.size(0) != rows) {
        throw TransferMismatch(
            "stage edge " + std::to_string(e) + " (stage " + std::to_string(se.src) + " -> stage " +
            std::to_string(se.dst) + ") carries tensor " + std::to_string(k) + " of shape " + shape_of(t) +
            ", whose first dimension is not the micro-batch (" + std::to_string(rows) +
            " rows); a replicated stage splits every tensor it sends or receives by rows, so such a "
            "value cannot cross into or out of one: give those stages one device each, or cut elsewhere");
      }
    }
  }
  specs_ = std::move(specs);
  rows_ = rows;
}

bool Executor::sharded(int edge) const {
  const auto& se = schedule_.edges.at(static_cast<std::size_t>(edge));
  return schedule_.replicas(se.src) > 1 || schedule_.replicas(se.dst) > 1;
}

std::vector<int64_t> Executor::local_shape(const at::Tensor& spec) const {
  std::vector<int64_t> shape(spec.sizes().begin(), spec.sizes().end());
  if (replicated_stage_ >= 0) shape.at(0) = my_rows(rows_).size();
  return shape;
}

std::vector<Executor::Piece> Executor::pieces(const Instruction& ins) const {
  const auto& peers = schedule_.peer_ranks(ins);
  if (!sharded(ins.edge)) return {{peers.front(), 0, -1}};
  const auto& se = schedule_.edges[ins.edge];
  const int other = ins.stage == se.src ? se.dst : se.src;
  const auto mine = my_rows(rows_);
  std::vector<Piece> out;
  for (std::size_t j = 0; j < peers.size(); ++j) {
    const auto theirs = schedule::shard_rows(rows_, schedule_.replicas(other), static_cast<int>(j));
    const auto shared = schedule::overlap(mine, theirs);
    if (shared.size() > 0) out.push_back({peers[j], shared.begin - mine.begin, shared.size()});
  }
  return out;
}

std::string Executor::where(const Instruction& ins) const {
  std::string text = schedule::to_token(ins) + " (" + schedule::describe(ins);
  if (ins.edge >= 0) {
    const auto& e = schedule_.edges[ins.edge];
    text += ", edge " + std::to_string(ins.edge) + ": stage " + std::to_string(e.src) + " -> stage " +
            std::to_string(e.dst);
  }
  return text + ")";
}

std::string Executor::describe_piece(const Instruction& ins, std::size_t k, std::size_t n, const Piece& part) const {
  std::string text = where(ins) + ", tensor " + std::to_string(k) + " of " + std::to_string(n);
  if (part.length >= 0) {
    text += ", rows " + std::to_string(part.offset) + ".." + std::to_string(part.offset + part.length) +
            " of this replica's";
  }
  return text;
}

void Executor::check_outputs(int stage, int micro_batch, const StageOutput& out) const {
  const auto& outs = out_edges(stage);
  if (out.edges.size() != outs.size()) {
    throw TransferMismatch("stage " + std::to_string(stage) + " forward of micro-batch " + std::to_string(micro_batch) +
                           " returned tensors for " + std::to_string(out.edges.size()) + " outgoing edges, expected " +
                           std::to_string(outs.size()));
  }
  for (std::size_t i = 0; i < outs.size(); ++i) check_edge_outputs(stage, micro_batch, outs[i], out.edges[i]);
}

void Executor::check_edge_outputs(int stage, int micro_batch, int e, const std::vector<at::Tensor>& got) const {
  const auto& want = specs_[e];
  auto edge = [&] {
    const auto& se = schedule_.edges[e];
    return "edge " + std::to_string(e) + " (stage " + std::to_string(se.src) + " -> stage " + std::to_string(se.dst) +
           ")";
  };
  if (got.size() != want.size()) {
    throw TransferMismatch("stage " + std::to_string(stage) + " produced " + std::to_string(got.size()) +
                           " tensors for " + edge() + " in micro-batch " + std::to_string(micro_batch) +
                           ", the edge declares " + std::to_string(want.size()));
  }
  const bool replicated = schedule_.replicas(stage) > 1;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const bool fits =
        got[k].defined() && got[k].scalar_type() == want[k].scalar_type() &&
        (replicated ? got[k].sizes() == c10::IntArrayRef(local_shape(want[k])) : got[k].sizes() == want[k].sizes());
    if (fits) continue;
    std::ostringstream declared;
    declared << c10::IntArrayRef(local_shape(want[k])) << " " << want[k].scalar_type();
    throw TransferMismatch("stage " + std::to_string(stage) + ", micro-batch " + std::to_string(micro_batch) +
                           ": tensor " + std::to_string(k) + " of " + edge() + " is " +
                           (got[k].defined() ? shape_of(got[k]) : std::string("undefined")) + ", the edge declares " +
                           declared.str() + " (shapes are fixed by the shape propagation at the micro-batch size" +
                           (replicated ? ", cut to this replica's rows)" : ")"));
  }
}

void Executor::post(const Instruction& ins, bool train, std::vector<TransferOp>& ops,
                    std::vector<at::Tensor>& buffers) {
  const auto& spec = specs_.at(ins.edge);
  const auto parts = pieces(ins);
  // One send or receive per tensor and peer: the rows this rank and the peer share (all of the
  // tensor unless a replicated stage is at either end of the edge).
  auto add = [&](bool send, bool grad, std::size_t k, const at::Tensor& t) {
    for (const auto& part : parts) {
      TransferOp op;
      op.send = send;
      op.peer = part.peer;
      op.tag = tag_of(ins.edge, grad, k);
      op.tensor = part.length < 0 ? t : t.narrow(0, part.offset, part.length);
      if (send) op.tensor = op.tensor.contiguous();
      op.what = [this, ins, k, n = spec.size(), part] { return describe_piece(ins, k, n, part); };
      ops.push_back(std::move(op));
    }
  };
  auto missing = [&](const char* before) {
    return Error("graphpipe runtime: rank " + std::to_string(rank_) + " " + where(ins) + before);
  };
  auto& st = state_of(ins.stage, ins.micro_batch);
  switch (ins.kind) {
    case OpKind::recv_activation:
    case OpKind::recv_gradient: {
      const bool grad = ins.kind == OpKind::recv_gradient;
      for (std::size_t k = 0; k < spec.size(); ++k) {
        if (grad && !carries_grad(spec[k])) {  // only floating tensors travel back
          buffers.emplace_back();
          continue;
        }
        buffers.push_back(at::empty(local_shape(spec[k]), spec[k].options().device(device_)));
        add(false, grad, k, buffers.back());
      }
      break;
    }
    case OpKind::send_activation: {
      auto it = st.outputs.find(ins.edge);
      if (it == st.outputs.end()) throw missing(" before its forward");
      for (std::size_t k = 0; k < it->second.size(); ++k) add(true, false, k, it->second[k].detach().contiguous());
      if (!train) st.outputs.erase(it);
      break;
    }
    case OpKind::send_gradient: {
      auto it = st.received.find(ins.edge);
      if (it == st.received.end()) throw missing(" before its receive");
      for (std::size_t k = 0; k < it->second.size(); ++k) {
        const auto& leaf = it->second[k];
        if (!carries_grad(spec[k])) continue;
        at::Tensor g = leaf.grad();
        add(true, true, k, g.defined() ? g.contiguous() : at::zeros_like(leaf));
      }
      st.received.erase(it);
      break;
    }
    default:
      break;
  }
}

void Executor::forward(const Instruction& ins, const ForwardFn& fn, bool train) {
  auto& st = state_of(ins.stage, ins.micro_batch);
  const auto& ins_edges = in_edges(ins.stage);
  const auto& outs = out_edges(ins.stage);
  std::vector<std::vector<at::Tensor>> inputs;
  inputs.reserve(ins_edges.size());
  for (int e : ins_edges) {
    auto it = st.received.find(e);
    if (it == st.received.end()) {
      throw Error("graphpipe runtime: rank " + std::to_string(rank_) + " " + where(ins) +
                  " runs before the activations of edge " + std::to_string(e) + " arrived");
    }
    // Evaluation keeps nothing after the forward: the inputs move into the call.
    inputs.push_back(train ? it->second : std::move(it->second));
  }
  if (!train) {
    for (int e : ins_edges) st.received.erase(e);
  }
  StageOutput out = fn(ins.stage, ins.micro_batch, inputs);
  check_outputs(ins.stage, ins.micro_batch, out);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    if (schedule_.local(outs[i])) hand_over_activations(ins.micro_batch, outs[i], out.edges[i], train);
    // Evaluation sends and drops; a local edge's outputs are already the consumer's.
    if (train || !schedule_.local(outs[i])) st.outputs[outs[i]] = std::move(out.edges[i]);
  }
  if (train) st.loss = std::move(out.loss);
}

void Executor::hand_over_activations(int micro_batch, int edge, const std::vector<at::Tensor>& outputs, bool train) {
  const auto& spec = specs_.at(static_cast<std::size_t>(edge));
  std::vector<at::Tensor> leaves;
  leaves.reserve(outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    // What a receive gives: a tensor of its own, cut from the producer's graph. A floating one
    // shares the storage (it becomes a leaf that requires grad, which nothing may write in
    // place); any other is copied, since the consumer may write it in place.
    at::Tensor t = carries_grad(spec[k]) ? outputs[k].detach() : outputs[k].detach().clone();
    if (train && carries_grad(spec[k])) t.requires_grad_(true);
    leaves.push_back(std::move(t));
  }
  state_of(schedule_.edges[edge].dst, micro_batch).received[edge] = std::move(leaves);
}

void Executor::hand_back_gradients(int micro_batch, int stage) {
  auto& st = state_of(stage, micro_batch);
  for (int e : in_edges(stage)) {
    if (!schedule_.local(e)) continue;
    auto it = st.received.find(e);
    if (it == st.received.end()) continue;
    const auto& spec = specs_.at(static_cast<std::size_t>(e));
    std::vector<at::Tensor> grads;
    for (std::size_t k = 0; k < it->second.size(); ++k) {
      const auto& leaf = it->second[k];
      if (!carries_grad(spec[k])) {
        grads.emplace_back();  // as over the wire: only floating tensors travel back
        continue;
      }
      const at::Tensor& g = leaf.grad();
      grads.push_back(g.defined() ? g : at::zeros_like(leaf));
    }
    state_of(schedule_.edges[e].src, micro_batch).grads[e] = std::move(grads);
    st.received.erase(it);
  }
}

void Executor::take_roots(const Instruction& ins, std::vector<at::Tensor>& roots, std::vector<at::Tensor>& grads) {
  auto& st = state_of(ins.stage, ins.micro_batch);
  const auto& outs = out_edges(ins.stage);
  if (st.loss.defined() && st.loss.requires_grad()) {
    roots.push_back(st.loss);
    grads.push_back(at::ones_like(st.loss));
  }
  for (int e : outs) {
    auto out = st.outputs.find(e);
    auto got = st.grads.find(e);
    if (out == st.outputs.end() || got == st.grads.end()) {
      throw Error("graphpipe runtime: rank " + std::to_string(rank_) + " " + where(ins) +
                  " runs before the outputs and gradients of edge " + std::to_string(e) + " are there");
    }
    for (std::size_t k = 0; k < out->second.size(); ++k) {
      const auto& t = out->second[k];
      const auto& g = got->second[k];
      if (!g.defined() || !t.requires_grad()) continue;
      roots.push_back(t);
      grads.push_back(g);
    }
  }
  for (int e : outs) {
    st.outputs.erase(e);
    st.grads.erase(e);
  }
  st.loss = at::Tensor();
}

void Executor::backward(const Instruction& ins) {
  std::vector<at::Tensor> roots, grads;
  take_roots(ins, roots, grads);
  if (!roots.empty()) {
    torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false);
  }
  hand_back_gradients(ins.micro_batch, ins.stage);
}

void Executor::backward_input(const Instruction& ins) {
  auto& st = state_of(ins.stage, ins.micro_batch);
  std::vector<at::Tensor> roots, grads;
  take_roots(ins, roots, grads);
  std::vector<at::Tensor> leaves;
  for (const auto& [edge, tensors] : st.received) {
    for (const auto& t : tensors) {
      if (t.requires_grad()) leaves.push_back(t);
    }
  }
  // split_backward.h: I records the gradients where the parameters' paths join the input path,
  // so that W starts there instead of walking the activation gradients again.
  std::vector<at::Tensor> got;
  st.pending = runtime::backward_input(roots, grads, leaves, parameters_.at(ins.stage), &got);
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    if (got[k].defined()) leaves[k].mutable_grad() = got[k];
  }
  hand_back_gradients(ins.micro_batch, ins.stage);
}

void Executor::backward_weight(const Instruction& ins) {
  // A parameter W does not reach (used under no_grad, or only by another micro-batch's branch)
  // just gets no gradient; running it frees the graph that I kept.
  PendingWeights pending = std::move(state_of(ins.stage, ins.micro_batch).pending);
  pending.run();
}

// ---------------------------------------------------------------------------------------------
// run(): one pass over the program, each instruction through the dispatch table.
//
// Transfers are posted when the program reaches them and waited for only when needed: a
// receive just before the compute that reads it, a send at the end of the run (or once seen
// complete). A compute thus never waits for transfers of other micro-batches that happen to
// sit in the same run of transfer instructions, which is what the simulator assumes too.
// Posting stays in program order, so every pair of ranks still posts in the schedule's one
// order; and waiting less than check.h's batch model never makes a schedule hang.
//
// Receives one ahead (backends that match by tag): reaching a receive also posts the next
// receive of the same kind over the same edge. Gloo's send is a rendezvous: its data moves
// only once the receive is posted, and then from the sender's communication thread, which a
// busy host may leave waiting for a CPU for milliseconds while the sender computes (seen on 2
// cores: 2-5 ms per late receive, against 0.1-0.3 ms). Posted one micro-batch early, the
// receive is usually there when the sender sends, so the send goes out at once. Order per
// (peer, tag) stays the program's, so messages still match; a receive posted early is never
// waited for before its own instruction, so no new wait exists that could deadlock. NCCL
// matches by order, not tag, and keeps the program's order. Cost: one more receive buffer per
// incoming edge and direction.
//
// One ahead is not always early enough: where the sender runs further ahead, or the receive's
// notice reaches the sender while it computes, the sender's communication thread has not read
// the notice when the send is posted, and the send waits for that thread after all. In traces
// of the V on 2 bound CPU ranks (benchmarks/sim_gap_bench.py) a third to a half of the waits
// for another rank's output still landed 1-17 ms late. ReceivePosting::whole_step posts every
// receive of the run at its start, while the peers are at the start of theirs too, so most
// notices are read before their sends: 0-4 late landings a run where one ahead had 11-26
// (benchmarks/receive_posting_bench.py, docs/results.md). Cost: the receive buffers of every
// micro-batch of every stage on the rank from the run's start, while they fit the budget (what the
// plan leaves of its memory limit on the rank, at most kWholeStepBytes; the rest one ahead); a run
// longer than the flight recorder's ring posts one ahead.

struct Executor::Run {
  Run(const ForwardFn& f, bool tr, bool rec) : fn(f), train(tr), record(rec) {}

  const ForwardFn& fn;
  const bool train;
  const bool record;
  const bool debug = log::enabled(log::Level::debug);
  bool replicated = false;
  const std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::vector<Instruction> list;                           // the program's instructions that run (train: all)
  std::vector<std::size_t> next_receive;                   // index of the next receive of the same stream (or size)
  std::size_t last_backward = 0;                           // the last B or W: it finishes the weight gradients
  std::map<std::tuple<int, int, int>, InFlight> receives;  // (kind, micro-batch, edge)
  std::set<std::tuple<int, int, int>> landed;              // receives waited for and stored
  std::vector<InFlight> sends;
  std::vector<InstructionTiming> timings;

  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  static std::tuple<int, int, int> key(OpKind kind, int mb, int edge) {
    return std::make_tuple(static_cast<int>(kind), mb, edge);
  }
  bool posted(const Instruction& ins) const { return receives.count(key(ins.kind, ins.micro_batch, ins.edge)) > 0; }
  // Posted now or before (a receive posted for the whole step may land before its instruction).
  bool handled(const Instruction& ins) const {
    return posted(ins) || landed.count(key(ins.kind, ins.micro_batch, ins.edge)) > 0;
  }
};

// One case per schedule::OpKind (the header says why a switch).
void Executor::dispatch(Run& run, std::size_t i) {
  switch (run.list[i].kind) {
    case OpKind::recv_activation:
      return exec_recv_activation(run, i);
    case OpKind::forward:
      return exec_forward(run, i);
    case OpKind::send_activation:
      return exec_send_activation(run, i);
    case OpKind::recv_gradient:
      return exec_recv_gradient(run, i);
    case OpKind::backward:
      return exec_backward(run, i);
    case OpKind::send_gradient:
      return exec_send_gradient(run, i);
    case OpKind::optimizer_step:
      return exec_optimizer_step(run, i);
    case OpKind::all_reduce:
      return exec_all_reduce(run, i);
    case OpKind::backward_input:
      return exec_backward_input(run, i);
    case OpKind::backward_weight:
      return exec_backward_weight(run, i);
  }
  throw std::logic_error("executor: instruction of unknown kind " + std::to_string(static_cast<int>(run.list[i].kind)));
}

template <class Body>
void Executor::with_transfer_hooks(Body&& body) {
  if (hooks_.enter) hooks_.enter();
  try {
    body();
  } catch (...) {
    if (hooks_.exit) hooks_.exit();
    throw;
  }
  if (hooks_.exit) hooks_.exit();
}

template <class Body>
void Executor::recorded(FlightRecorder::Id id, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    flight_->end(id, FlightState::failed, first_line(e.what()));
    throw;
  } catch (...) {
    flight_->end(id, FlightState::failed, "unknown error");
    throw;
  }
}

template <class Body>
void Executor::compute(Run& run, std::size_t i, Body&& body) {
  const Instruction& ins = run.list[i];
  double start = run.record ? run.now() : 0.0;
  // AR waits for the replicas' all-reduce; everything else computes on this rank.
  const bool collective = ins.kind == OpKind::all_reduce && buckets_;
  const auto id = collective ? flight_->begin(ins, FlightState::waiting, replica_peers_,
                                              static_cast<std::int64_t>(buckets_->bytes()))
                             : flight_->begin(ins, FlightState::running, kNoPeers, 0);
  recorded(id, [&] {
    InstructionRange range(ins);
    if constexpr (std::is_same_v<decltype(body()), double>) {
      start = body();
    } else {
      body();
    }
  });
  flight_->end(id, FlightState::completed);
  if (run.record) run.timings.push_back({ins, start, run.now()});
  reap_sends(run, false);
}

void Executor::finish(Run& run, InFlight& f) {
  InstructionRange range(f.ins, " wait");
  const auto waited_from = std::chrono::steady_clock::now();
  flight_->wait(f.flight);
  recorded(f.flight, [&] {
    with_transfer_hooks([&] {
      for (const auto& p : f.posted) transport_.wait(p);
    });
  });
  flight_->end(f.flight, FlightState::completed);
  if (run.debug) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waited_from).count();
    // A long wait is where a pipeline's bubble shows: say so above the per-transfer lines.
    log::debug("rank " + std::to_string(rank_) + (ms >= kLongWaitMs ? ": waited long, " : ": completed ") +
               where(f.ins) + " after " + std::to_string(ms) + " ms of waiting");
  }
  if (run.record) run.timings.push_back({f.ins, f.start, run.now()});
}

void Executor::land(Run& run, OpKind kind, int mb, int edge) {
  auto it = run.receives.find(Run::key(kind, mb, edge));
  if (it == run.receives.end()) return;
  finish(run, it->second);
  const auto& se = schedule_.edges[static_cast<std::size_t>(edge)];
  auto& st = state_of(kind == OpKind::recv_activation ? se.dst : se.src, mb);
  run.landed.insert(it->first);
  auto tensors = std::move(it->second.tensors);
  if (kind == OpKind::recv_activation) {
    if (run.train) {
      for (auto& t : tensors) {
        if (carries_grad(t)) t.requires_grad_(true);
      }
    }
    st.received[edge] = std::move(tensors);
  } else {
    st.grads[edge] = std::move(tensors);
  }
  run.receives.erase(it);
}

void Executor::reap_sends(Run& run, bool all) {
  std::size_t kept = 0;
  for (auto& f : run.sends) {
    bool done = true;
    for (const auto& p : f.posted) done = done && p.work->isCompleted();
    if (all || done) {
      finish(run, f);
    } else {
      if (&run.sends[kept] != &f) run.sends[kept] = std::move(f);
      ++kept;
    }
  }
  run.sends.resize(kept);
}

void Executor::post_transfer(Run& run, const Instruction& ins) {
  std::vector<TransferOp> ops;
  std::vector<at::Tensor> buffers;
  post(ins, run.train, ops, buffers);
  InFlight f{ins, {}, std::move(buffers), run.record ? run.now() : 0.0};
  f.flight = flight_->begin(ins, FlightState::posted, schedule_.peer_ranks(ins), payload_bytes(ops));
  InstructionRange range(ins, " post");
  if (run.debug) log::debug("rank " + std::to_string(rank_) + ": posted " + where(ins));
  recorded(f.flight, [&] { with_transfer_hooks([&] { f.posted = transport_.post(std::move(ops)); }); });
  if (schedule::is_recv(ins.kind)) {
    run.receives[Run::key(ins.kind, ins.micro_batch, ins.edge)] = std::move(f);
  } else {
    run.sends.push_back(std::move(f));
  }
}

void Executor::set_receive_posting(ReceivePosting posting, double memory_headroom_bytes) {
  if (!(memory_headroom_bytes >= 0.0)) {
    throw Error("graphpipe runtime: rank " + std::to_string(rank_) + ": a memory headroom of " +
                std::to_string(memory_headroom_bytes) + " bytes for the receives posted ahead; it must be >= 0");
  }
  if (posting == ReceivePosting::whole_step && !transport_.matches_by_tag()) {
    throw Error("graphpipe runtime: rank " + std::to_string(rank_) +
                ": receives can be posted for the whole step only over a backend that matches messages by tag "
                "(gloo); this process group's backend, " +
                transport_.backend_name() + ", matches them by order");
  }
  receive_posting_ = posting;
  whole_step_budget_ = memory_headroom_bytes >= static_cast<double>(kWholeStepBytes)
                           ? kWholeStepBytes
                           : static_cast<std::int64_t>(memory_headroom_bytes);
}

std::int64_t Executor::receive_bytes(const Instruction& ins) const {
  const bool grad = ins.kind == OpKind::recv_gradient;
  std::int64_t bytes = 0;
  for (const auto& spec : specs_.at(ins.edge)) {
    if (grad && !carries_grad(spec)) continue;  // as post() allocates them
    std::int64_t numel = 1;
    for (auto d : local_shape(spec)) numel *= d;
    bytes += numel * static_cast<std::int64_t>(spec.element_size());
  }
  return bytes;
}

void Executor::post_receives(Run& run) {
  // A record opened now must still be in the flight recorder's ring when its receive is waited
  // for: the run opens about one record per instruction.
  const std::size_t ring = flight_->capacity();
  if (ring != 0 && run.list.size() + kFaultRecords > ring) return;
  // In program order, so each stream's receives keep the order its sends come in; while their
  // buffers fit the budget, the rest one ahead (stopping at the first that does not fit, so
  // that no later receive of a stream is posted before an earlier one).
  for (const auto& ins : run.list) {
    if (!schedule::is_recv(ins.kind) || run.posted(ins)) continue;
    const std::int64_t bytes = receive_bytes(ins);
    if (posted_at_start_bytes_ + bytes > whole_step_budget_) return;
    post_transfer(run, ins);
    posted_at_start_bytes_ += bytes;
  }
}

void Executor::reach_transfer(Run& run, std::size_t i) {
  const auto& ins = run.list[i];
  if (!run.handled(ins)) post_transfer(run, ins);
  if (run.next_receive[i] < run.list.size()) {
    const auto& ahead = run.list[run.next_receive[i]];
    if (!run.handled(ahead)) post_transfer(run, ahead);
  }
}

void Executor::inject(Run& run, std::size_t i) {
  const auto& ins = run.list[i];
  auto fault = faults_.take(ins.kind);
  if (!fault) return;
  // The rank is "in" the instruction while the fault acts: a hang shows there to its peers.
  const auto id = flight_->begin(ins, FlightState::running, kNoPeers, 0, fault->label);
  recorded(id, [&] { fire(*fault, "rank " + std::to_string(rank_) + " " + where(ins)); });
  flight_->end(id, FlightState::completed, fault->label);
}

void Executor::exec_recv_activation(Run& run, std::size_t i) { reach_transfer(run, i); }
void Executor::exec_send_activation(Run& run, std::size_t i) { reach_transfer(run, i); }
void Executor::exec_recv_gradient(Run& run, std::size_t i) { reach_transfer(run, i); }
void Executor::exec_send_gradient(Run& run, std::size_t i) { reach_transfer(run, i); }

void Executor::exec_forward(Run& run, std::size_t i) {
  const auto& ins = run.list[i];
  for (int e : in_edges(ins.stage)) land(run, OpKind::recv_activation, ins.micro_batch, e);
  compute(run, i, [&] {
    c10::AutoGradMode grad_mode(run.train);
    forward(ins, run.fn, run.train);
  });
}

void Executor::exec_backward(Run& run, std::size_t i) {
  const auto& ins = run.list[i];
  for (int e : out_edges(ins.stage)) land(run, OpKind::recv_gradient, ins.micro_batch, e);
  compute(run, i, [&] {
    // The last backward's gradients are final ones: the replicas' sum starts during it.
    if (i == run.last_backward && buckets_ && run.replicated) buckets_->arm();
    backward(ins);
  });
}

void Executor::exec_backward_input(Run& run, std::size_t i) {
  const auto& ins = run.list[i];
  for (int e : out_edges(ins.stage)) land(run, OpKind::recv_gradient, ins.micro_batch, e);
  compute(run, i, [&] { backward_input(ins); });
}

void Executor::exec_backward_weight(Run& run, std::size_t i) {
  compute(run, i, [&] {
    if (i == run.last_backward && buckets_ && run.replicated) buckets_->arm();
    backward_weight(run.list[i]);
  });
}

void Executor::exec_all_reduce(Run& run, std::size_t i) {
  if (!buckets_) {  // local updates: nothing to wait for
    compute(run, i, [] {});
    return;
  }
  // Its measured span starts when the first bucket's sum started, inside the backward.
  compute(run, i, [&] { return std::chrono::duration<double>(buckets_->finish() - run.t0).count(); });
}

void Executor::exec_optimizer_step(Run& run, std::size_t i) {
  reap_sends(run, true);  // the optimizer step closes the iteration: nothing stays in flight
  compute(run, i, [] {});
}

void Executor::check_ready(bool train) const {
  if (!transport_.connected()) {
    throw Error("graphpipe runtime: rank " + std::to_string(rank_) +
                "'s executor was disconnected after a failure; it cannot run again");
  }
  if (specs_.size() != schedule_.edges.size()) {
    throw Error("graphpipe runtime: set_edge_specs() must be called before run()");
  }
  if (replicated_stage_ >= 0 && train && !buckets_ && !local_updates_) {
    throw Error("graphpipe runtime: rank " + std::to_string(rank_) + " runs a replica of stage " +
                std::to_string(replicated_stage_) + " but was given no gradient buckets (set_gradient_buckets)");
  }
  // Only a missing set_parameters() is an error: an empty list is a legitimate stage without
  // trainable parameters (a stage of parameter-free operators between two others, which the
  // corpus's partitioners produce), whose W does nothing.
  if (!train) return;
  for (const auto& ins : program()) {
    if (ins.kind == OpKind::backward_weight && parameters_.count(ins.stage) == 0) {
      throw Error("graphpipe runtime: rank " + std::to_string(rank_) + "'s program splits the backwards of stage " +
                  std::to_string(ins.stage) +
                  " (I and W) but set_parameters() was never called for it "
                  "(pass an empty list for a stage without trainable parameters)");
    }
  }
}

void Executor::prepare(Run& run) const {
  run.replicated = replicated_stage_ >= 0;
  // Evaluation runs only RF, F and SF, in schedule order.
  for (const auto& ins : program()) {
    if (run.train || ins.kind == OpKind::recv_activation || ins.kind == OpKind::forward ||
        ins.kind == OpKind::send_activation) {
      run.list.push_back(ins);
    }
  }
  const std::size_t n = run.list.size();
  run.last_backward = n;
  for (std::size_t i = 0; i < n; ++i) {
    const auto kind = run.list[i].kind;
    if (kind == OpKind::backward || kind == OpKind::backward_weight) run.last_backward = i;
  }
  run.next_receive.assign(n, n);
  if (transport_.matches_by_tag()) {
    std::map<std::pair<int, int>, std::size_t> later;  // (kind, edge) -> next index seen from the back
    for (std::size_t i = n; i-- > 0;) {
      const auto& ins = run.list[i];
      if (!schedule::is_recv(ins.kind)) continue;
      const auto stream = std::make_pair(static_cast<int>(ins.kind), ins.edge);
      auto it = later.find(stream);
      if (it != later.end()) run.next_receive[i] = it->second;
      later[stream] = i;
    }
  }
  if (run.record) run.timings.reserve(2 * n);
}

void Executor::drain(Run& run) {
  while (!run.receives.empty()) {
    const auto& ins = run.receives.begin()->second.ins;
    land(run, ins.kind, ins.micro_batch, ins.edge);
  }
  reap_sends(run, true);
}

std::vector<InstructionTiming> Executor::run(const ForwardFn& fn, bool train, bool record) {
  check_ready(train);
  state_.clear();
  flight_->start_run();
  Run run(fn, train, record);
  prepare(run);
  try {
    posted_at_start_bytes_ = 0;
    if (receive_posting_ == ReceivePosting::whole_step) post_receives(run);
    for (std::size_t i = 0; i < run.list.size(); ++i) {
      if (!faults_.empty()) inject(run, i);
      dispatch(run, i);
    }
    drain(run);
  } catch (...) {
    state_.clear();
    faults_.clear();
    if (buckets_) buckets_->abandon();
    throw;
  }
  faults_.clear();
  state_.clear();
  return std::move(run.timings);
}

}  // namespace graphpipe::runtime
