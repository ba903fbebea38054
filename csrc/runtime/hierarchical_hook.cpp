#include "runtime/hierarchical_hook.h"

#include <ATen/ATen.h>
#include <ATen/core/jit_type.h>

#include <sstream>

#include "common/error.h"
#include "runtime/errors.h"
#include "runtime/future_wait.h"

namespace graphpipe::runtime {

namespace {

using FuturePtr = c10::intrusive_ptr<c10::ivalue::Future>;

// Waits for one collective of the fit check; the groups are the caller's, so a group that does
// not consist of the stage's ranks shows as a timeout here.
void wait_check(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout,
                const std::string& what) {
  const auto future = work->getFuture();
  if (!wait_for(future, timeout)) {
    std::ostringstream seconds;
    seconds << static_cast<double>(timeout.count()) / 1000.0;
    throw PipelineTimeout("graphpipe runtime: hierarchical_all_reduce_hook: " + what + " timed out after " +
                          seconds.str() +
                          " s (do the intra-node and inter-node groups consist of the stage's replicas?)");
  }
  if (future->hasError()) {
    throw PeerError("graphpipe runtime: hierarchical_all_reduce_hook: " + what +
                    " failed: " + future->tryRetrieveErrorMessage());
  }
}

at::Tensor longs(std::int64_t n) { return at::zeros({n}, at::TensorOptions().dtype(at::kLong)); }

// The future of a collective, completed with `value` (a collective's own future holds a list).
FuturePtr yielding(const c10::intrusive_ptr<c10d::Work>& work, at::Tensor value) {
  return work->getFuture()->then(
      [value](c10::ivalue::Future& done) -> c10::IValue {
        done.value();  // rethrows the collective's error
        return value;
      },
      c10::TensorType::get());
}

}  // namespace

HierarchicalAllReduceHook::HierarchicalAllReduceHook(c10::intrusive_ptr<c10d::ProcessGroup> intra_node,
                                                     c10::intrusive_ptr<c10d::ProcessGroup> inter_node)
    : intra_raw_(std::move(intra_node)), inter_raw_(std::move(inter_node)) {
  if (!intra_raw_ || !inter_raw_) {
    throw Error(
        "graphpipe runtime: hierarchical_all_reduce_hook needs an intra-node and an inter-node process "
        "group on every replica, got None");
  }
}

void HierarchicalAllReduceHook::on_attach(const c10::intrusive_ptr<CountingGroup>& group,
                                          std::chrono::milliseconds timeout) {
  check_fit(group, timeout);
  intra_ = group->sharing(intra_raw_);
  inter_ = group->sharing(inter_raw_);
}

void HierarchicalAllReduceHook::check_fit(const c10::intrusive_ptr<CountingGroup>& group,
                                          std::chrono::milliseconds timeout) const {
  const auto& stage = group->inner();  // uncounted: the check is not the hook's traffic
  const std::int64_t d = stage->getSize();
  const std::int64_t me = stage->getRank();
  const std::int64_t L = intra_raw_->getSize();
  const std::int64_t m = inter_raw_->getSize();
  const std::int64_t local = intra_raw_->getRank();

  // 1. Every replica's group sizes, over the stage's own group (safe whatever the subgroups are),
  //    so that all replicas reach the same verdict and none waits on a subgroup that cannot work.
  std::vector<at::Tensor> mine{longs(2)};
  mine[0][0] = L;
  mine[0][1] = m;
  std::vector<std::vector<at::Tensor>> sizes(1);
  for (std::int64_t r = 0; r < d; ++r) sizes[0].push_back(longs(2));
  wait_check(stage->allgather(sizes, mine, c10d::AllgatherOptions()), timeout, "gathering the replicas' group sizes");
  bool fits = true;
  std::ostringstream table;
  for (std::int64_t r = 0; r < d; ++r) {
    const auto Lr = sizes[0][r][0].item<std::int64_t>();
    const auto mr = sizes[0][r][1].item<std::int64_t>();
    fits = fits && Lr * mr == d && Lr == L && mr == m;
    table << (r ? ", " : "") << "replica " << r << ": " << Lr << " x " << mr;
  }
  if (!fits) {
    throw Error(
        "graphpipe runtime: hierarchical_all_reduce_hook: the intra-node and inter-node groups do not fit the "
        "stage's " +
        std::to_string(d) +
        " replicas: every node must hold the same number L of them and the "
        "inter-node group one per node, so that L x nodes = " +
        std::to_string(d) + " on every replica; got (intra-node ranks x inter-node ranks) " + table.str());
  }

  // 2. Membership: the node sums the one-hot vectors of its replicas (stage ranks); the inter-node
  //    group gathers the node vectors and local indices. The groups fit when the nodes met through
  //    the inter-node group cover every replica exactly once and share this rank's local index.
  std::vector<at::Tensor> node{longs(d + 1)};
  node[0][me] = 1;
  wait_check(intra_raw_->allreduce(node, c10d::AllreduceOptions()), timeout, "the intra-node membership check");
  node[0][d] = local;
  std::vector<std::vector<at::Tensor>> nodes(1);
  for (std::int64_t r = 0; r < m; ++r) nodes[0].push_back(longs(d + 1));
  wait_check(inter_raw_->allgather(nodes, node, c10d::AllgatherOptions()), timeout, "the inter-node membership check");
  at::Tensor reached = longs(d);
  bool same_local = true;
  for (const auto& v : nodes[0]) {
    reached += v.narrow(0, 0, d);
    same_local = same_local && v[d].item<std::int64_t>() == local;
  }
  const bool ok = same_local && reached.eq(1).all().item<bool>();

  // 3. Agree on the verdict, so that every replica raises or none does.
  std::vector<at::Tensor> verdict{longs(1)};
  verdict[0][0] = ok ? 1 : 0;
  std::vector<std::vector<at::Tensor>> verdicts(1);
  for (std::int64_t r = 0; r < d; ++r) verdicts[0].push_back(longs(1));
  wait_check(stage->allgather(verdicts, verdict, c10d::AllgatherOptions()), timeout, "agreeing on the group check");
  std::string failing;
  for (std::int64_t r = 0; r < d; ++r) {
    if (verdicts[0][r][0].item<std::int64_t>() == 0) failing += (failing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failing.empty()) {
    std::ostringstream detail;
    detail << "replica " << me << " reaches the replicas [";
    for (std::int64_t r = 0; r < d; ++r) detail << (r ? ", " : "") << reached[r].item<std::int64_t>();
    detail << "] times through its groups"
           << (same_local ? "" : " and its inter-node group joins ranks of other local indices");
    throw Error("graphpipe runtime: hierarchical_all_reduce_hook: on replicas " + failing +
                " the intra-node and inter-node groups do not factor the stage's replicas (each replica must be "
                "reached exactly once through its node and the inter-node group, which joins the ranks of one "
                "local index); " +
                detail.str());
  }
}

c10::intrusive_ptr<c10::ivalue::Future> HierarchicalAllReduceHook::runHook(c10d::GradBucket& bucket) {
  const at::Tensor buffer = bucket.getBuffer();
  const std::int64_t n = buffer.numel();
  if (n == 0) return completed_future(buffer);
  const std::int64_t L = intra_->getSize();
  const std::int64_t c = (n + L - 1) / L;
  auto intra = intra_;
  auto inter = inter_;

  // 1. Reduce-scatter inside the node: this rank keeps chunk (local index) of the node's sum. As an
  //    all-to-all (chunk j of every rank to rank j) and a local sum in rank order, not
  //    reduce_scatter_single: Gloo's reduce-scatter is an all-reduce of the whole buffer and has
  //    no future. The all-to-all moves what a reduce-scatter moves, (L - 1) chunks per rank.
  FuturePtr scattered;
  if (L > 1) {
    at::Tensor padded = at::zeros({L * c}, buffer.options());
    padded.narrow(0, 0, n).copy_(buffer);
    at::Tensor received = at::empty({L * c}, buffer.options());
    std::vector<std::int64_t> equal_splits;  // empty: L equal parts
    auto work = intra->all_to_all_single(received, padded, equal_splits, equal_splits, c10d::AllToAllOptions());
    scattered = work->getFuture()->then(
        [received, L, c](c10::ivalue::Future& done) -> c10::IValue {
          done.value();  // rethrows the collective's error
          at::Tensor parts = received.view({L, c});
          at::Tensor sum = parts[0].clone();
          for (std::int64_t r = 1; r < L; ++r) sum += parts[r];
          return sum;
        },
        c10::TensorType::get());
  } else {
    scattered = completed_future(buffer.clone());
  }
  // 2. All-reduce of the chunk across the nodes (ranks of the same local index).
  FuturePtr reduced = scattered->thenAsync(
      [inter](c10::ivalue::Future& done) -> FuturePtr {
        at::Tensor chunk = done.value().toTensor();
        if (inter->getSize() == 1) return completed_future(chunk);
        std::vector<at::Tensor> tensors{chunk};
        return yielding(inter->allreduce(tensors, c10d::AllreduceOptions()), chunk);
      },
      c10::TensorType::get());
  // 3. All-gather of the chunks inside the node.
  return reduced->thenAsync(
      [intra, L, c, n](c10::ivalue::Future& done) -> FuturePtr {
        at::Tensor chunk = done.value().toTensor();
        if (L == 1) return completed_future(chunk.narrow(0, 0, n));
        at::Tensor gathered = at::empty({L * c}, chunk.options());
        at::Tensor input = chunk;
        return yielding(intra->all_gather_single(gathered, input, c10d::AllgatherOptions()), gathered.narrow(0, 0, n));
      },
      c10::TensorType::get());
}

at::Tensor HierarchicalAllReduceHook::parseHookResult(const c10::IValue& result) { return result.toTensor(); }

}  // namespace graphpipe::runtime
