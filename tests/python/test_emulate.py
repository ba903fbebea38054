"""Emulation mode: stages that wait their predicted durations and return zeros of the real shapes."""

from __future__ import annotations

import time

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
