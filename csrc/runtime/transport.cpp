#include "runtime/transport.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <exception>
#include <sstream>

#include "runtime/errors.h"

namespace graphpipe::runtime {

namespace {

bool looks_like_timeout(const std::string& message) {
  return message.find("imed out") != std::string::npos || message.find("imeout") != std::string::npos;
}

std::string first_line(const std::string& message) {
  auto end = message.find('\n');
  return end == std::string::npos ? message : message.substr(0, end);
}

}  // namespace

Transport::Transport(c10::intrusive_ptr<c10d::ProcessGroup> group, std::chrono::milliseconds timeout)
    : group_(std::move(group)), timeout_(timeout) {
  if (!group_) throw Error("graphpipe runtime: no process group given");
  if (timeout_.count() <= 0) throw Error("graphpipe runtime: the timeout must be positive");
}

Transport::~Transport() = default;

int Transport::rank() const { return group_->getRank(); }
int Transport::size() const { return group_->getSize(); }

void Transport::exchange(std::vector<TransferOp>& ops) {
  const int me = rank();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(ops.size());
  for (auto& op : ops) {
    std::vector<at::Tensor> tensors{op.tensor};
    try {
      works.push_back(op.send ? group_->send(tensors, op.peer, op.tag)
                              : group_->recv(tensors, op.peer, op.tag));
    } catch (const std::exception& e) {
      throw PeerError("rank " + std::to_string(me) + ": posting " + op.what + " with peer rank " +
                      std::to_string(op.peer) + " failed: " + first_line(e.what()));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (std::size_t i = 0; i < works.size(); ++i) {
    const auto& op = ops[i];
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() < 1) left = std::chrono::milliseconds(1);
    bool done = false;
    std::string failure;
    try {
      done = works[i]->wait(left);
    } catch (const std::exception& e) {
      failure = first_line(e.what());
    }
    if (done && failure.empty()) continue;
    std::ostringstream message;
    const double seconds = static_cast<double>(timeout_.count()) / 1000.0;
    if (failure.empty() || looks_like_timeout(failure)) {
      message << "rank " << me << ": timed out after " << seconds << " s waiting for peer rank "
              << op.peer << " on " << op.what
              << " (the peer is stuck or dead; the process group is unusable now)";
      if (!failure.empty()) message << " [" << failure << "]";
      throw PipelineTimeout(message.str());
    }
    message << "rank " << me << ": peer rank " << op.peer << " failed during " << op.what << ": "
            << failure;
    throw PeerError(message.str());
  }
}

}  // namespace graphpipe::runtime
