"""Emulation mode: stages that wait their predicted durations and return zeros of the real shapes."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from graphpipe.emulation import EmulatedStage, wait


def test_wait_never_returns_early() -> None:
    for seconds in (0.0, 1e-4, 2e-3):
        start = time.perf_counter()
        wait(seconds)
        elapsed = time.perf_counter() - start
        assert elapsed >= seconds
        assert elapsed < seconds + 0.05  # generous: a loaded CI machine may deschedule us


class _TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 5)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> dict:
        return {"h": self.lin(x), "idx": idx + 1}


def test_emulated_stage_shapes_and_waits() -> None:
    stage = EmulatedStage(_TwoOutputs(), forward_seconds=0.004, backward_seconds=0.006)
    x = torch.randn(2, 3, requires_grad=True)
    idx = torch.arange(2)
    first = stage(x, idx)  # runs the real module once, to learn the output shapes
    assert first["h"].shape == (2, 5) and first["idx"].dtype == torch.int64
    start = time.perf_counter()
    out = stage(x, idx)
    forward = time.perf_counter() - start
    assert forward >= 0.004
    assert out["h"].shape == (2, 5) and not out["h"].any()
    assert out["idx"].shape == (2,) and out["idx"].dtype == torch.int64 and not out["idx"].is_floating_point()
    start = time.perf_counter()
    out["h"].sum().backward()
    backward = time.perf_counter() - start
    assert backward >= 0.006
    assert x.grad is not None and x.grad.shape == x.shape and not x.grad.any()


def _emulated_pipeline(rank: int, world: int) -> dict:
    """emulate_stage switches a real pipeline's stage through Pipeline.swap_stage_module: the
    stage module becomes an EmulatedStage, the split backward's W gets its anchor, and a step
    (zero-bubble schedule, so W runs) still runs every transfer and returns a loss."""
    import graphpipe
    from graphpipe.emulation import emulate_stage
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    plan = manual_plan(trace_module(model, (x,)).graph, {"0": 0, "1": 0, "2": 1}, 2)
    with graphpipe.wrap(model, (x,), nn.functional.mse_loss, plan=plan, schedule="zb_graph", timeout=60) as pipe:
        real = pipe.module
        emulate_stage(pipe, 0.001, 0.002)
        loss = pipe.step((x,), y)
        return {"emulated": isinstance(pipe.module, EmulatedStage), "wraps_real": pipe.module.real is real,
                "anchor_grad": pipe.module.anchor.grad is not None, "loss": float(loss),
                "zeros_loss": float(nn.functional.mse_loss(torch.zeros_like(y), y))}


def test_emulate_stage_uses_the_pipelines_seam() -> None:
    from graphpipe.testing import run_ranks

    for r in run_ranks(_emulated_pipeline, 2, timeout=120):
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        assert r.value["emulated"] and r.value["wraps_real"] and r.value["anchor_grad"], r.value
        # The emulated output stage returns zeros of the real shape: the loss is that of zeros.
        assert r.value["loss"] == pytest.approx(r.value["zeros_loss"], rel=1e-6)


class _Tower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # ~1.1 MiB of parameters per layer: one gradient group (GROUP_BYTES) each.
        self.layers = nn.ModuleList(nn.Linear(540, 540) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_replicated_stage_hands_its_gradients_over_the_backward() -> None:
    # A replicated stage's emulated backward gives every real parameter a zero gradient, the
    # runtime's buckets' order first (the last layer's), at an even pace over the backward, the
    # inputs' gradient at its end: the accumulator hooks that start the buckets fire during it.
    stage = EmulatedStage(_Tower(), forward_seconds=0.0, backward_seconds=0.08, input_seconds=0.04, replicated=True)
    params = list(stage.real.parameters())
    assert len(stage._groups) == 4  # one per layer, in reverse registration order
    assert stage._groups[0][0] is params[-1]
    x = torch.randn(2, 540, requires_grad=True)
    stage(x)
    arrived: dict[int, float] = {}
    def noting(i: int) -> object:
        def hook(_: torch.Tensor) -> None:
            arrived.setdefault(i, time.perf_counter())
        return hook

    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(noting(i))
    out = stage(x)
    start = time.perf_counter()
    out.sum().backward()
    elapsed = time.perf_counter() - start
    assert elapsed >= 0.08
    assert sorted(arrived) == list(range(len(params)))
    assert all(p.grad is not None and not p.grad.any() for p in params)
    assert x.grad is not None and not x.grad.any()
    layer_times = [arrived[2 * k] - start for k in range(4)]  # each layer's weight
    assert layer_times == sorted(layer_times, reverse=True)  # the last layer's first
    # Each group's wait (its share of the weight half) after the input half's piece before it:
    # the first group is final after 1/4 of the backward, not after the input half.
    assert layer_times[3] < 0.5 * elapsed
    assert layer_times[0] >= 0.08 - 0.01 - 1e-3


def test_replicated_stage_hands_gradients_only_in_the_iterations_last_backward() -> None:
    # Only the backward the runtime's buckets are armed for hands the real parameters zeros; the
    # others wait as long, in one piece per half, and leave the gradients alone (handing zeros in
    # every backward accumulated every parameter's gradient each micro-batch: CPU work beside the
    # emulated compute).
    armed = [False]
    stage = EmulatedStage(_Tower(), forward_seconds=0.0, backward_seconds=0.02, input_seconds=0.01, replicated=True,
                          armed=lambda: armed[0])
    params = list(stage.real.parameters())
    x = torch.randn(2, 540, requires_grad=True)
    stage(x)
    start = time.perf_counter()
    stage(x).sum().backward()
    assert time.perf_counter() - start >= 0.02
    assert all(p.grad is None for p in params)
    assert x.grad is not None and not x.grad.any()
    armed[0] = True
    start = time.perf_counter()
    stage(x).sum().backward()
    assert time.perf_counter() - start >= 0.02
    assert all(p.grad is not None and not p.grad.any() for p in params)


class _FakeClock:
    """A clock for emulate's waits that moves only when told: by each wait, by each parameter
    gradient made (3 ms) and by each accumulation hook (2 ms a parameter: the gradient buckets'
    copy), so a test reads where the CPU work of a replicated backward lands."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stage: EmulatedStage) -> None:
        from graphpipe import emulation as emulate

        self.now = 0.0
        self.waits: list[float] = []
        real_zeros = torch.zeros

        def zeros(*args, **kwargs):
            if args and tuple(args[0]) in {tuple(p.shape) for p in stage.real.parameters()}:
                self.now += 0.003
            return real_zeros(*args, **kwargs)

        def wait(seconds: float) -> None:
            self.waits.append(seconds)
            self.now += max(0.0, seconds)

        monkeypatch.setattr(emulate.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(emulate, "wait", wait)
        monkeypatch.setattr(emulate.torch, "zeros", zeros)
        for p in stage.real.parameters():
            p.register_post_accumulate_grad_hook(lambda p: setattr(self, "now", self.now + 0.002))


def _timed_stage() -> tuple[EmulatedStage, torch.Tensor, torch.Tensor]:
    """A replicated stage of four one-group layers (0.1 s input half, 0.3 s weight half) and
    one micro-batch's output, its backward still to run."""
    stage = EmulatedStage(_Tower(), forward_seconds=0.0, backward_seconds=0.4, input_seconds=0.1, replicated=True)
    assert [len(g) for g in stage._groups] == [2, 2, 2, 2]  # one layer's weight and bias a group
    x = torch.randn(2, 540, requires_grad=True)
    stage(x)
    return stage, x, stage(x).sum()


def test_armed_backward_holds_its_cpu_work_inside_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The pieces wait until deadlines counted from the backward's start: the gradients' making
    # and the buckets' hooks between the pieces (40 ms of CPU here) lie inside the backward's
    # 0.4 s, as on a GPU, whose kernels run while the CPU works. Waiting each piece's whole
    # share after that work made emulated replicated backwards twice the simulator's.
    stage, _x, out = _timed_stage()
    clock = _FakeClock(monkeypatch, stage)
    out.backward()
    assert clock.now == pytest.approx(0.4)
    assert sum(clock.waits) == pytest.approx(0.4 - 8 * 0.005)
    assert all(p.grad is not None for p in stage.real.parameters())


def test_split_backward_starts_each_halfs_clock_where_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # A zero-bubble schedule runs I, other instructions, then W: W's pieces count from W's own
    # start (counted from I's, its deadlines would have passed and W would not wait at all).
    stage, x, out = _timed_stage()
    clock = _FakeClock(monkeypatch, stage)
    torch.autograd.grad(out, [x], retain_graph=True)
    assert clock.now == pytest.approx(0.1)
    clock.now = 5.0  # the instructions between I and W
    torch.autograd.backward(out, inputs=[stage.anchor] + list(stage.real.parameters()))
    assert clock.now == pytest.approx(5.3 + 0.004)  # the last group's hooks run after its wait
    assert all(p.grad is not None for p in stage.real.parameters())


def test_one_group_whole_backward_keeps_one_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # A stage of one gradient group: the whole backward runs the weight piece, then the input
    # piece, the other chain already at its end, as in a split backward's W. The input piece
    # must go on from the weight piece's deadline, not start anew, or the hooks between the two
    # (4 ms here) would be charged on top of the backward's 0.4 s.
    stage = EmulatedStage(nn.Linear(8, 8), forward_seconds=0.0, backward_seconds=0.4, input_seconds=0.1,
                          replicated=True)
    assert len(stage._groups) == 1
    x = torch.randn(2, 8, requires_grad=True)
    stage(x)
    out = stage(x).sum()
    clock = _FakeClock(monkeypatch, stage)
    out.backward()
    assert clock.now == pytest.approx(0.4)
    assert all(p.grad is not None for p in stage.real.parameters()) and x.grad is not None


def test_unreplicated_stage_leaves_the_real_parameters_alone() -> None:
    stage = EmulatedStage(_Tower(), forward_seconds=0.0, backward_seconds=0.002)
    x = torch.randn(2, 540, requires_grad=True)
    stage(x)
    stage(x).sum().backward()
    assert all(p.grad is None for p in stage.real.parameters()) and stage.anchor.grad is not None


def test_emulated_optimizer_waits_and_drops_gradients() -> None:
    from graphpipe.emulation import EmulatedOptimizer

    p = nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = EmulatedOptimizer([p], 0.003)
    start = time.perf_counter()
    opt.step()
    assert time.perf_counter() - start >= 0.003
    opt.zero_grad()
    assert p.grad is None and torch.equal(p.detach(), torch.ones(3))


def _replicated_overlap(rank: int, world: int) -> dict:
    """Both ranks hold one replicated stage, emulated: the bucket all-reduces start during the
    backward (the recorded all_reduce instruction ends later than it starts, and the time from
    the backward's end to the all-reduce's end is shorter than the all-reduce alone)."""
    import graphpipe
    from graphpipe.emulation import emulate_stage
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    torch.manual_seed(0)
    model = _Tower()
    x, y = torch.randn(8, 540), torch.randn(8, 540)
    plan = manual_plan(trace_module(model, (x,)).graph, {"layers": 0}, 1, stage_devices={0: [0, 1]})
    with graphpipe.wrap(model, (x,), nn.functional.mse_loss, plan=plan, timeout=60) as pipe:
        emulate_stage(pipe, 0.001, 0.2)
        pipe.step((x,), y)
        pipe.step((x,), y, record=True)
        tasks = pipe.measured_tasks(gather=False)
        grads = all(p.grad is not None for p in pipe.module.real.parameters())
    backward = next(t for t in tasks if t["kind"] == "backward")
    reduce = next(t for t in tasks if t["kind"] == "all_reduce")
    return {"backward": (backward["start"], backward["end"]), "grads": grads,
            "reduce": (reduce["start"], reduce["end"])}


def test_emulated_replicas_overlap_their_all_reduce_with_the_backward() -> None:
    from graphpipe.testing import run_ranks

    for r in run_ranks(_replicated_overlap, 2, timeout=120):
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        assert r.value["grads"]
        (b0, b1), (r0, r1) = r.value["backward"], r.value["reduce"]
        # 4 buckets of ~1.1 MiB, each final after its group's wait: the first bucket's sum (the
        # recorded all-reduce's start) begins in the backward's first half, not after its end.
        assert b1 - b0 >= 0.2
        assert r0 < b0 + 0.5 * (b1 - b0) and r1 >= b1, r.value
