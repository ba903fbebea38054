"""Emulation mode: stages that wait their predicted durations and return zeros of the real shapes."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from graphpipe.testing.emulate import EmulatedStage, wait


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
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.testing.emulate import emulate_stage
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
