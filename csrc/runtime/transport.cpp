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
bool Transport::matches_by_tag() const { return backend_name() == "gloo"; }
std::string Transport::backend_name() const { return group_->getBackendName(); }

std::vector<Transport::Posted> Transport::post(std::vector<TransferOp> ops) {
  const int me = rank();
  std::vector<Posted> posted;
  posted.reserve(ops.size());
  for (auto& op : ops) {
    at::Tensor staged_target;
    if (host_staging_ && !op.tensor.is_cpu()) {
      if (op.send) {
        op.tensor = op.tensor.to(at::kCPU);
      } else {
        staged_target = op.tensor;
        op.tensor = at::empty(staged_target.sizes(), staged_target.options().device(at::kCPU));
      }
    }
    std::vector<at::Tensor> tensors{op.tensor};
    try {
      auto work = op.send ? group_->send(tensors, op.peer, op.tag) : group_->recv(tensors, op.peer, op.tag);
      posted.push_back(Posted{std::move(op), std::move(work), std::move(staged_target)});
    } catch (const std::exception& e) {
      throw PeerError("rank " + std::to_string(me) + ": posting " + op.describe() + " with peer rank " +
                      std::to_string(op.peer) + " failed: " + first_line(e.what()));
    }
  }
  return posted;
}

void Transport::wait(const Posted& posted) {
  const auto& op = posted.op;
  bool done = false;
  std::string failure;
  try {
    done = posted.work->wait(timeout_);
  } catch (const std::exception& e) {
    failure = first_line(e.what());
  }
  if (done && failure.empty()) {
    if (posted.staged_target.defined()) posted.staged_target.copy_(op.tensor);
    return;
  }
  const int me = rank();
  std::ostringstream message;
  const double seconds = static_cast<double>(timeout_.count()) / 1000.0;
  if (failure.empty() || looks_like_timeout(failure)) {
    message << "rank " << me << ": timed out after " << seconds << " s waiting for peer rank " << op.peer << " on "
            << op.describe() << " (the peer is stuck or dead; the process group is unusable now)";
    if (!failure.empty()) message << " [" << failure << "]";
    throw PipelineTimeout(message.str());
  }
  message << "rank " << me << ": peer rank " << op.peer << " failed during " << op.describe() << ": " << failure;
  throw PeerError(message.str());
}

void Transport::exchange(std::vector<TransferOp>& ops) {
  for (const auto& p : post(std::move(ops))) wait(p);
  ops.clear();
}

}  // namespace graphpipe::runtime
