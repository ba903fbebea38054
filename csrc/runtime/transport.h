// Transport: point-to-point batches over a torch.distributed (c10d) process group.
//
// post() starts sends and receives without waiting; wait() then waits for one posted operation,
// at most `timeout` from the moment it is called. Posting before waiting is what makes Gloo's
// rendezvous sends safe (a send completes only once its receive is posted, so send().wait()
// before a receive would deadlock two ranks that exchange). exchange() is one communication
// batch: post all, then wait for all. The schedule guarantees that every pair of ranks posts
// its transfers in one order, and tags separate edges and directions, so messages match FIFO.
//
// Failures become runtime errors (runtime/errors.h) that name this rank, the peer and the
// operation's description: PipelineTimeout when the deadline passes, PeerError otherwise.
// Gloo needs CPU, contiguous tensors; exchange() does not copy, the caller passes them so.
// Cost: one c10d send/recv per tensor; no allocation besides the Work handles; descriptions are
// formatted only for a message.
//
// Host staging (set_host_staging): for a backend that moves only CPU memory (Gloo) under stages
// that compute on a GPU, each GPU tensor travels through a CPU copy: a send copies to the host
// when it is posted (on the current stream, so after the kernels that produced it), a receive
// lands in a CPU buffer and wait() copies it into the GPU tensor on the current stream. That
// costs two copies and a host synchronisation per transfer; NCCL needs none of it. It exists for
// GPUs without NCCL between them, e.g. several ranks sharing one GPU, which NCCL refuses.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace graphpipe::runtime {

struct TransferOp {
  bool send = false;
  int peer = 0;  // rank in the process group
  int tag = 0;   // >= 0
  at::Tensor tensor;
  // For messages: "0SF1e2 (send of the activation ... over edge 2 (0->1)), tensor 0 of 2". A
  // function, called only when a message needs it: formatting it for every operation cost more
  // than posting the operation.
  std::function<std::string()> what;

  std::string describe() const { return what ? what() : "a transfer"; }
};

class Transport {
 public:
  Transport(c10::intrusive_ptr<c10d::ProcessGroup> group, std::chrono::milliseconds timeout);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // rank(), size(), matches_by_tag(), post() and exchange() need the group: not after disconnect().
  int rank() const;
  int size() const;
  // Whether the backend matches a receive to a send by (peer, tag) rather than by the order of
  // all operations between the pair (Gloo: yes; NCCL: no). Only then may a rank post receives of
  // different tags out of the schedule's order.
  bool matches_by_tag() const;
  std::string backend_name() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  void set_host_staging(bool on) { host_staging_ = on; }

  // A posted operation: the op (its tensor, the one on the wire, stays alive while in flight),
  // its Work and, for a host-staged receive, the device tensor wait() copies the result into.
  struct Posted {
    TransferOp op;
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor staged_target;
  };

  // Starts every op; throws PeerError if the process group refuses one.
  std::vector<Posted> post(std::vector<TransferOp> ops);
  // Waits for one posted op, at most the timeout; throws PeerError/PipelineTimeout.
  void wait(const Posted& posted);
  // Posts every op, then waits for all of them. Throws PeerError/PipelineTimeout.
  void exchange(std::vector<TransferOp>& ops);

  // Drops this transport's handle on the process group, so that the group closes its
  // connections when its last other handle goes, whoever still holds the transport.
  void disconnect() { group_.reset(); }
  bool connected() const { return static_cast<bool>(group_); }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::chrono::milliseconds timeout_;
  bool host_staging_ = false;
};

}  // namespace graphpipe::runtime
