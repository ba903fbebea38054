// An in-memory process group for executor tests: ranks are threads of one process, and a
// send completes only once its receive is posted, FIFO per (src, dst, tag) (rendezvous
// semantics like Gloo's). A size mismatch breaks the pair, as it does in Gloo.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace graphpipe::testing {

struct Mailbox;

class LoopbackWork : public c10d::Work {
 public:
  LoopbackWork(std::shared_ptr<Mailbox> box) : box_(std::move(box)) {}
  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  bool done = false;

 private:
  std::shared_ptr<Mailbox> box_;
};

struct Pending {
  at::Tensor tensor;
  c10::intrusive_ptr<LoopbackWork> work;
};

struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  std::map<std::tuple<int, int, int>, std::deque<Pending>> sends, recvs;

  void match(const std::tuple<int, int, int>& key) {
    auto& s = sends[key];
    auto& r = recvs[key];
    while (!s.empty() && !r.empty()) {
      if (r.front().tensor.sizes() != s.front().tensor.sizes()) {
        closed = true;  // like a Gloo size mismatch: the pair is broken
      } else {
        r.front().tensor.copy_(s.front().tensor);
      }
      s.front().work->done = true;
      r.front().work->done = true;
      s.pop_front();
      r.pop_front();
    }
    cv.notify_all();
  }
};

inline bool LoopbackWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(box_->mu);
  if (!box_->cv.wait_for(lock, timeout, [&] { return done || box_->closed; })) {
    throw std::runtime_error("Timed out waiting " + std::to_string(timeout.count()) + "ms for the peer");
  }
  if (!done) throw std::runtime_error("Connection closed by peer");
  return true;
}

inline bool LoopbackWork::isCompleted() {
  std::lock_guard<std::mutex> lock(box_->mu);
  return done;
}

class LoopbackGroup : public c10d::ProcessGroup {
 public:
  LoopbackGroup(std::shared_ptr<Mailbox> box, int rank, int size) : ProcessGroup(rank, size), box_(std::move(box)) {}
  const std::string getBackendName() const override { return "loopback"; }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return post(true, tensors.at(0).clone(), getRank(), dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return post(false, tensors.at(0), src, getRank(), tag);
  }

 private:
  c10::intrusive_ptr<c10d::Work> post(bool send, at::Tensor t, int src, int dst, int tag) {
    auto work = c10::make_intrusive<LoopbackWork>(box_);
    std::lock_guard<std::mutex> lock(box_->mu);
    auto key = std::make_tuple(src, dst, tag);
    (send ? box_->sends : box_->recvs)[key].push_back({std::move(t), work});
    box_->match(key);
    return work;
  }
  std::shared_ptr<Mailbox> box_;
};

}  // namespace graphpipe::testing
