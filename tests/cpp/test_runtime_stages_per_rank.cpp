// The executor with several stages per rank (each alone on it): a chain whose stages sit on
// fewer ranks, looping or in a V, trains to the gradients of one process under every policy,
// with local edges (both stages on one rank) handing tensors over without a transfer, a
// parameter tied between two stages of one rank, and an integer tensor on a local edge.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <exception>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "loopback_group.h"
#include "runtime/executor.h"
#include "schedule/generate.h"
#include "schedule_plans.h"

using namespace graphpipe;
using graphpipe::testing::LoopbackGroup;
using graphpipe::testing::Mailbox;
using runtime::Executor;
using runtime::StageOutput;

namespace {

constexpr int kRows = 2;   // per micro-batch
constexpr int kWidth = 3;  // every activation is kRows x kWidth

// A chain of S stages: stage 0 computes tanh(x W0) and sends it with the micro-batch's index (an
// integer tensor); stage s < S - 1 computes tanh(h W_s); the last stage's loss is
// sum((h W_last W0)^2) / M, so W0 is tied between the first and the last stage.
struct ChainModel {
  int stages = 4;
  int M = 4;
  at::Tensor x;
  std::vector<at::Tensor> w;

  ChainModel(int s, int m) : stages(s), M(m) {
    at::manual_seed(0);
    x = at::randn({kRows * M, kWidth});
    for (int k = 0; k < stages; ++k) w.push_back((at::randn({kWidth, kWidth}) * 0.7).requires_grad_(true));
  }

  std::vector<std::vector<at::Tensor>> specs() const {
    auto meta = at::TensorOptions().device(at::kMeta);
    std::vector<std::vector<at::Tensor>> out(static_cast<std::size_t>(stages - 1), {at::empty({kRows, kWidth}, meta)});
    out[0].push_back(at::empty({kRows}, meta.dtype(at::kLong)));
    return out;
  }

  // The tensors each stage computes with: the tied W0 is in the first and the last stage's.
  std::vector<at::Tensor> parameters(int s) const {
    if (s == stages - 1) return {w[static_cast<std::size_t>(s)], w[0]};
    return {w[static_cast<std::size_t>(s)]};
  }

  runtime::ForwardFn forward() {
    return [this](int s, int m, std::vector<std::vector<at::Tensor>>& in) {
      StageOutput out;
      at::Tensor h;
      if (s == 0) {
        EXPECT_TRUE(in.empty());
        h = at::tanh(at::matmul(x.narrow(0, kRows * m, kRows), w[0]));
        out.edges = {{h, at::full({kRows}, m, at::kLong)}};
        return out;
      }
      EXPECT_EQ(in.size(), 1u);
      EXPECT_TRUE(in[0][0].requires_grad());
      if (s == 1) EXPECT_EQ(in[0].at(1)[0].item<long>(), m);
      if (s < stages - 1) {
        out.edges = {{at::tanh(at::matmul(in[0][0], w[static_cast<std::size_t>(s)]))}};
      } else {
        out.loss = at::matmul(at::matmul(in[0][0], w[static_cast<std::size_t>(s)]), w[0]).pow(2).sum() / M;
      }
      return out;
    };
  }

  // The gradients of one process over the whole batch.
  std::vector<at::Tensor> reference() const {
    std::vector<at::Tensor> r;
    for (const auto& t : w) r.push_back(t.detach().clone().requires_grad_(true));
    at::Tensor h = at::tanh(at::matmul(x, r[0]));
    for (int s = 1; s + 1 < stages; ++s) h = at::tanh(at::matmul(h, r[static_cast<std::size_t>(s)]));
    auto loss = at::matmul(at::matmul(h, r.back()), r[0]).pow(2).sum() / M;
    torch::autograd::backward({loss});
    std::vector<at::Tensor> grads;
    for (const auto& t : r) grads.push_back(t.grad());
    return grads;
  }
};

// Runs every rank's executor in its own thread over one loopback group.
void run_ranks(const schedule::Schedule& sched, ChainModel& model, int ranks) {
  auto box = std::make_shared<Mailbox>();
  std::vector<std::unique_ptr<Executor>> ex;
  for (int r = 0; r < ranks; ++r) {
    ex.push_back(std::make_unique<Executor>(sched, r, c10::make_intrusive<LoopbackGroup>(box, r, ranks),
                                            std::chrono::milliseconds(10000)));
    ex[r]->set_edge_specs(model.specs());
    for (int s : ex[r]->stages()) ex[r]->set_parameters(s, model.parameters(s));
  }
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        ex[r]->run(model.forward(), true);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  for (const auto& e : ex) EXPECT_EQ(e->held_micro_batches(), 0u);  // nothing kept past run()
}

// A chain of `devices.size()` stages, stage s on rank devices[s].
schedule::Schedule placed(const std::vector<int>& devices, int M, const std::string& policy) {
  plan::Plan plan = graphpipe::testing::chain_plan(static_cast<int>(devices.size()), M);
  int ranks = 0;
  for (std::size_t s = 0; s < devices.size(); ++s) {
    plan.stages[s].devices = {devices[s]};
    ranks = std::max(ranks, devices[s] + 1);
  }
  plan.num_devices = ranks;
  return schedule::generate(plan, policy);
}

struct Placement {
  std::string name;
  std::vector<int> devices;
};

void PrintTo(const Placement& p, std::ostream* os) { *os << p.name; }

class StagesPerRank : public ::testing::TestWithParam<std::tuple<std::string, Placement>> {};

TEST_P(StagesPerRank, EqualsOneProcess) {
  const auto& [policy, where] = GetParam();
  ChainModel model(static_cast<int>(where.devices.size()), 4);
  const auto sched = placed(where.devices, model.M, policy);
  int ranks = 0;
  for (int d : where.devices) ranks = std::max(ranks, d + 1);
  run_ranks(sched, model, ranks);
  const auto expected = model.reference();
  for (std::size_t k = 0; k < expected.size(); ++k) {
    ASSERT_TRUE(model.w[k].grad().defined()) << "W" << k;
    EXPECT_TRUE(at::allclose(model.w[k].grad(), expected[k], 1e-5, 1e-6)) << "W" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndPlacements, StagesPerRank,
                         ::testing::Combine(::testing::ValuesIn(schedule::policy_names()),
                                            ::testing::Values(Placement{"looping_2_per_rank", {0, 1, 0, 1}},
                                                              Placement{"v_2_per_rank", {0, 1, 1, 0}},
                                                              Placement{"v_2_per_rank_on_3", {0, 1, 2, 2, 1, 0}},
                                                              Placement{"3_per_rank", {0, 1, 1, 0, 0, 1}})),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

// A local edge moves nothing: the V's middle edge (stages 1 -> 2, both on rank 1) has no
// transfer instruction, and rank 1's executor holds both stages.
TEST(StagesPerRankExecutor, LocalEdgeHasNoTransfer) {
  const auto sched = placed({0, 1, 1, 0}, 2, "1f1b");
  ASSERT_TRUE(sched.local(1));
  for (const auto& program : sched.ranks) {
    for (const auto& ins : program) EXPECT_FALSE(ins.edge == 1) << schedule::to_token(ins);
  }
  auto box = std::make_shared<Mailbox>();
  Executor e1(sched, 1, c10::make_intrusive<LoopbackGroup>(box, 1, 2), std::chrono::milliseconds(100));
  EXPECT_EQ(e1.stages(), (std::vector<int>{1, 2}));
  EXPECT_EQ(e1.in_edges(2), std::vector<int>{1});
  EXPECT_TRUE(e1.in_edges(0).empty());
  EXPECT_THROW(e1.set_parameters(0, {}), Error);
}

}  // namespace
