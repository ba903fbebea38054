// The runtime's Executor and Transport from C++ alone: ranks are threads and the process group
// is an in-memory loopback (loopback_group.h), so no Python and no Gloo headers are needed.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <map>
#include <thread>
#include <tuple>

#include "loopback_group.h"
#include "runtime/errors.h"
#include "runtime/executor.h"
#include "schedule/generate.h"
#include "schedule_plans.h"

using namespace graphpipe;
using graphpipe::testing::LoopbackGroup;
using graphpipe::testing::Mailbox;
using runtime::Executor;
using runtime::StageOutput;

namespace {

// Two stages: stage 0 computes h = x W0 (and sends h and an integer tensor), stage 1 the loss
// sum((h W1)^2) / M per micro-batch. Compared with sum over the whole batch / M in one thread.
struct TwoStageModel {
  at::Tensor x = at::randn({8, 4});
  at::Tensor w0 = at::randn({4, 3}).requires_grad_(true);
  at::Tensor w1 = at::randn({3, 2}).requires_grad_(true);
  int M = 4;

  std::vector<std::vector<at::Tensor>> specs() const {
    auto meta = at::TensorOptions().device(at::kMeta);
    return {{at::empty({2, 3}, meta), at::empty({2}, meta.dtype(at::kLong))}};
  }
  runtime::ForwardFn stage0() {
    return [this](int, int m, std::vector<std::vector<at::Tensor>>& in) {
      EXPECT_TRUE(in.empty());
      StageOutput out;
      auto xm = x.narrow(0, 2 * m, 2);
      out.edges = {{at::matmul(xm, w0), at::arange(2, at::kLong) + m}};
      return out;
    };
  }
  runtime::ForwardFn stage1() {
    return [this](int, int m, std::vector<std::vector<at::Tensor>>& in) {
      EXPECT_EQ(in.size(), 1u);
      EXPECT_TRUE(in[0][0].requires_grad());
      EXPECT_FALSE(in[0][1].requires_grad());
      EXPECT_EQ(in[0][1][0].item<long>(), m);
      StageOutput out;
      out.loss = at::matmul(in[0][0], w1).pow(2).sum() / M;
      return out;
    };
  }
};

schedule::Schedule two_stage_schedule(int M, const std::string& policy) {
  return schedule::generate(graphpipe::testing::chain_plan(2, M), policy);
}

}  // namespace

class RuntimeExecutor : public ::testing::TestWithParam<std::string> {};

TEST_P(RuntimeExecutor, TwoThreadsEqualOneProcess) {
  at::manual_seed(0);
  TwoStageModel model;
  auto box = std::make_shared<Mailbox>();
  auto sched = two_stage_schedule(model.M, GetParam());
  Executor e0(sched, 0, c10::make_intrusive<LoopbackGroup>(box, 0, 2), std::chrono::milliseconds(5000));
  Executor e1(sched, 1, c10::make_intrusive<LoopbackGroup>(box, 1, 2), std::chrono::milliseconds(5000));
  e0.set_edge_specs(model.specs());
  e1.set_edge_specs(model.specs());
  EXPECT_EQ(e0.stage(), 0);
  EXPECT_EQ(e1.in_edges(1), std::vector<int>{0});
  std::exception_ptr failure;
  std::thread t1([&] {
    try {
      e1.run(model.stage1(), true);
    } catch (...) {
      failure = std::current_exception();
    }
  });
  auto timings = e0.run(model.stage0(), true, /*record=*/true);
  t1.join();
  if (failure) std::rethrow_exception(failure);
  EXPECT_EQ(timings.size(), e0.program().size());

  auto g0 = model.w0.grad().clone();
  auto g1 = model.w1.grad().clone();
  auto w0 = model.w0.detach().clone().requires_grad_(true);
  auto w1 = model.w1.detach().clone().requires_grad_(true);
  auto loss = at::matmul(at::matmul(model.x, w0), w1).pow(2).sum() / model.M;
  torch::autograd::backward({loss});
  EXPECT_TRUE(at::allclose(g0, w0.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(g1, w1.grad(), 1e-5, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Policies, RuntimeExecutor, ::testing::Values("1f1b", "fill_drain", "1f1b_greedy"));

TEST(RuntimeTransport, MissingPeerTimesOutNamingPeerAndInstruction) {
  TwoStageModel model;
  auto box = std::make_shared<Mailbox>();
  Executor e0(two_stage_schedule(2, "1f1b"), 0, c10::make_intrusive<LoopbackGroup>(box, 0, 2),
              std::chrono::milliseconds(200));
  e0.set_edge_specs(model.specs());
  auto start = std::chrono::steady_clock::now();
  try {
    e0.run(model.stage0(), true);
    FAIL() << "no timeout";
  } catch (const runtime::PipelineTimeout& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("peer rank 1"), std::string::npos) << message;
    // Sends are waited for lazily, so the first wait that cannot finish is the gradient that
    // stage 0 needs for its first backward.
    EXPECT_NE(message.find("0RB0e0"), std::string::npos) << message;
    EXPECT_NE(message.find("edge 0"), std::string::npos) << message;
  }
  // At the timeout (200 ms; 203-210 ms alone), not a hang. The bound leaves room for a loaded
  // machine: under ctest -j2 beside the planner's tests one run took 412 ms, and 1045 ms with a
  // compile running beside the whole CI.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(5000));
}

TEST(RuntimeTransport, BrokenPeerIsPeerError) {
  TwoStageModel model;
  auto box = std::make_shared<Mailbox>();
  box->closed = true;
  Executor e1(two_stage_schedule(2, "1f1b"), 1, c10::make_intrusive<LoopbackGroup>(box, 1, 2),
              std::chrono::milliseconds(2000));
  e1.set_edge_specs(model.specs());
  try {
    e1.run(model.stage1(), true);
    FAIL() << "no error";
  } catch (const runtime::PipelineTimeout&) {
    FAIL() << "a closed connection is not a timeout";
  } catch (const runtime::PeerError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("peer rank 0 failed during 1RF0e0"), std::string::npos) << message;
  }
}

TEST(RuntimeExecutor, WrongShapeNamesTheEdge) {
  TwoStageModel model;
  auto box = std::make_shared<Mailbox>();
  Executor e0(two_stage_schedule(2, "1f1b"), 0, c10::make_intrusive<LoopbackGroup>(box, 0, 2),
              std::chrono::milliseconds(200));
  auto specs = model.specs();
  specs[0][0] = at::empty({2, 5}, at::TensorOptions().device(at::kMeta));
  e0.set_edge_specs(specs);
  try {
    e0.run(model.stage0(), true);
    FAIL() << "no mismatch";
  } catch (const runtime::TransferMismatch& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("tensor 0 of edge 0 (stage 0 -> stage 1)"), std::string::npos) << message;
    EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
  }
}

TEST(RuntimeExecutor, RankGroupMismatchIsRejected) {
  auto box = std::make_shared<Mailbox>();
  EXPECT_THROW(Executor(two_stage_schedule(2, "1f1b"), 1, c10::make_intrusive<LoopbackGroup>(box, 0, 2),
                        std::chrono::milliseconds(100)),
               Error);
}

// Zero-bubble (split backward, I then W) with a stage that has no trainable parameters in the
// middle of a chain: stage 0 h = x W0, stage 1 tanh(h) (parameter-free, as a partitioner cuts
// out an activation or a buffer read), stage 2 sum((g W1)^2) / M. The middle stage's I must
// still send its input gradients and its W do nothing; before, an empty parameter list was
// refused as if set_parameters had never been called.
TEST(RuntimeExecutor, ZeroBubbleWithAParameterFreeStageEqualsOneProcess) {
  at::manual_seed(0);
  const int M = 4;
  auto x = at::randn({8, 4});
  auto w0 = at::randn({4, 3}).requires_grad_(true);
  auto w1 = at::randn({3, 2}).requires_grad_(true);
  auto meta = at::TensorOptions().device(at::kMeta);
  const std::vector<std::vector<at::Tensor>> specs = {{at::empty({2, 3}, meta)}, {at::empty({2, 3}, meta)}};
  std::vector<runtime::ForwardFn> fns = {
      [&](int, int m, std::vector<std::vector<at::Tensor>>&) {
        StageOutput out;
        out.edges = {{at::matmul(x.narrow(0, 2 * m, 2), w0)}};
        return out;
      },
      [&](int, int, std::vector<std::vector<at::Tensor>>& in) {
        StageOutput out;
        out.edges = {{at::tanh(in.at(0).at(0))}};
        return out;
      },
      [&](int, int, std::vector<std::vector<at::Tensor>>& in) {
        StageOutput out;
        out.loss = at::matmul(in.at(0).at(0), w1).pow(2).sum() / M;
        return out;
      },
  };
  const std::vector<std::vector<at::Tensor>> params = {{w0}, {}, {w1}};
  auto sched = schedule::generate(graphpipe::testing::chain_plan(3, M), "zb_graph");
  auto box = std::make_shared<Mailbox>();
  std::vector<std::unique_ptr<Executor>> ex;
  for (int r = 0; r < 3; ++r) {
    ex.push_back(std::make_unique<Executor>(sched, r, c10::make_intrusive<LoopbackGroup>(box, r, 3),
                                            std::chrono::milliseconds(5000)));
    ex[r]->set_edge_specs(specs);
    ex[r]->set_parameters(r, params[r]);
  }
  bool split = false;
  for (const auto& ins : ex[1]->program()) split = split || ins.kind == schedule::OpKind::backward_weight;
  ASSERT_TRUE(split) << "zb_graph should split the middle stage's backwards";
  std::vector<std::exception_ptr> failures(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        ex[r]->run(fns[r], true);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& f : failures) {
    if (f) std::rethrow_exception(f);
  }
  for (const auto& e : ex) EXPECT_EQ(e->held_micro_batches(), 0u);  // no graph kept past run()

  auto r0 = w0.detach().clone().requires_grad_(true);
  auto r1 = w1.detach().clone().requires_grad_(true);
  auto loss = at::matmul(at::tanh(at::matmul(x, r0)), r1).pow(2).sum() / M;
  torch::autograd::backward({loss});
  ASSERT_TRUE(w0.grad().defined());
  EXPECT_TRUE(at::allclose(w0.grad(), r0.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(w1.grad(), r1.grad(), 1e-5, 1e-5));
}

TEST(RuntimeExecutor, ZeroBubbleWithoutSetParametersIsRefused) {
  auto box = std::make_shared<Mailbox>();
  Executor e1(schedule::generate(graphpipe::testing::chain_plan(2, 2), "zb_graph"), 1,
              c10::make_intrusive<LoopbackGroup>(box, 1, 2), std::chrono::milliseconds(200));
  TwoStageModel model;
  e1.set_edge_specs(model.specs());
  try {
    e1.run(model.stage1(), true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_parameters() was never called"), std::string::npos) << e.what();
  }
}

// After a failure the executor lets go of its group (Executor::disconnect, so that Gloo closes
// this rank's connections and wakes its peers): running it again is refused with an error
// that says why, not a crash on the dropped group, and the group has no holder left here.
TEST(RuntimeExecutor, RunAfterDisconnectIsRefused) {
  auto box = std::make_shared<Mailbox>();
  auto group = c10::make_intrusive<LoopbackGroup>(box, 0, 2);
  Executor e0(two_stage_schedule(2, "1f1b"), 0, group, std::chrono::milliseconds(200));
  TwoStageModel model;
  e0.set_edge_specs(model.specs());
  const auto held = group.use_count();
  e0.disconnect();
  EXPECT_LT(group.use_count(), held);
  try {
    e0.run(model.stage0(), true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disconnected after a failure"), std::string::npos) << e.what();
  }
}

// Every receive of a step posted at its start (ReceivePosting::whole_step) is only for a backend
// that matches messages by tag: over one that matches by order (here the loopback group) it is
// refused, naming the backend, and the executor keeps posting one ahead.
TEST(RuntimeExecutor, WholeStepPostingNeedsATagMatchingBackend) {
  auto box = std::make_shared<Mailbox>();
  Executor e0(two_stage_schedule(2, "1f1b"), 0, c10::make_intrusive<LoopbackGroup>(box, 0, 2),
              std::chrono::milliseconds(200));
  EXPECT_EQ(e0.receive_posting(), graphpipe::runtime::ReceivePosting::one_ahead);
  try {
    e0.set_receive_posting(graphpipe::runtime::ReceivePosting::whole_step);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend, loopback, matches them by order"), std::string::npos) << e.what();
  }
  EXPECT_EQ(e0.receive_posting(), graphpipe::runtime::ReceivePosting::one_ahead);
  e0.set_receive_posting(graphpipe::runtime::ReceivePosting::one_ahead);
}
