"""graphpipe.profile: per-operator forward/backward times stored on the graph."""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest
import torch
from torch import nn

import graphpipe
from graphpipe.models import build_model

# The module, not the function graphpipe.profile that the package exports under its name.
profile_module = importlib.import_module("graphpipe.profile")


def test_profile_stores_every_batch_size_and_cost_per_sample_falls() -> None:
    model, inputs = build_model("candle_uno:branches=2")
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(1, 4, 32), repeats=5)
    totals = {1: 0.0, 4: 0.0, 32: 0.0}
    for node in graph.nodes:
        assert [p.batch_size for p in node.profile] == [1, 4, 32]
        for p in node.profile:
            totals[p.batch_size] += p.forward_seconds + p.backward_seconds
    linears = [n for n in graph.nodes if n.target == "Linear"]
    assert all(p.forward_seconds > 0 and p.backward_seconds > 0 for n in linears for p in n.profile)
    # Fixed per-call overhead dominates these tiny operators: per-sample time must fall.
    assert totals[32] / 32 < totals[1] / 1
    # The profile survives a JSON round trip.
    back = graphpipe.OpGraph.from_json(graph.to_json())
    assert back.nodes[3].profile[2].batch_size == 32
    # Profiling does not leave gradients behind.
    assert all(p.grad is None for p in model.parameters())


class _Sleepy(nn.Module):
    """A linear layer whose forward takes at least ``seconds`` longer."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return self.linear(x)


class _TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.slow = _Sleepy(0.004)
        self.norm = nn.BatchNorm1d(8)
        self.fast = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast(self.norm(self.slow(x)))


def test_profile_times_each_operator_in_the_forward_of_the_whole_graph() -> None:
    model, inputs = _TwoLayers(), (torch.randn(4, 8),)
    graph = graphpipe.trace(model, inputs, leaf_modules=[_Sleepy])
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4), repeats=3, warmup=1, leaf_modules=[_Sleepy])
    by_target = {n.target: n for n in graph.nodes}
    assert all(p.forward_seconds >= 0.004 for p in by_target["_Sleepy"].profile)
    assert all(p.forward_seconds < 0.004 for p in by_target["Linear"].profile)


def test_profile_scales_operator_backwards_to_the_whole_graph_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward split comes from each operator timed alone, the total from the whole-graph
    run: here the whole-graph run is replaced by one that reports known figures."""
    model, inputs = build_model("candle_uno:branches=2")
    graph = graphpipe.trace(model, inputs)
    real = profile_module._whole_graph_runs
    reported: dict[int, dict[str, float]] = {}

    def known(gm: Any, values: Any, sync: Any, warmup: int, repeats: int) -> Any:
        forward, _, env = real(gm, values, sync, warmup, repeats)
        batch = values[0].shape[0]
        reported[batch] = {name: 1e-3 * (i + 1) for i, name in enumerate(forward)}
        return reported[batch], 0.25 * batch, env

    monkeypatch.setattr(profile_module, "_whole_graph_runs", known)
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4), repeats=1, warmup=0)
    for i, batch in enumerate((2, 4)):
        assert sum(n.profile[i].backward_seconds for n in graph.nodes) == pytest.approx(0.25 * batch)
        assert all(n.profile[i].backward_seconds > 0 for n in graph.nodes if n.target == "Linear")
        for n in graph.nodes:
            assert n.profile[i].forward_seconds == pytest.approx(reported[batch].get(n.name, 0.0))


def test_scale_to_total() -> None:
    assert profile_module._scale_to_total([1.0, 3.0], 8.0) == [2.0, 6.0]
    assert profile_module._scale_to_total([0.0, 0.0], 8.0) == [0.0, 0.0]  # nothing to share out
    assert profile_module._scale_to_total([1.0, 3.0], 0.0) == [1.0, 3.0]  # nothing measured


def test_profile_leaves_the_model_as_it_was() -> None:
    model, inputs = _TwoLayers(), (torch.randn(4, 8),)
    graph = graphpipe.trace(model, inputs, leaf_modules=[_Sleepy])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graphpipe.profile(graph, model, inputs, batch_sizes=(4,), repeats=2, warmup=1, leaf_modules=[_Sleepy])
    for key, value in model.state_dict().items():  # BatchNorm's running statistics included
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in model.parameters())


def test_profile_rejects_a_graph_of_another_model() -> None:
    model, inputs = build_model("candle_uno:branches=2")
    other, other_inputs = build_model("candle_uno:branches=3")
    graph = graphpipe.trace(other, other_inputs)
    with pytest.raises(graphpipe.GraphError, match="does not match the model"):
        graphpipe.profile(graph, model, inputs, batch_sizes=(1,))


def test_profile_argument_errors() -> None:
    model, inputs = build_model("candle_uno:branches=2")
    graph = graphpipe.trace(model, inputs)
    with pytest.raises(graphpipe.InputError, match="increasing"):
        graphpipe.profile(graph, model, inputs, batch_sizes=(4, 2))
    with pytest.raises(graphpipe.InputError, match="meta"):
        graphpipe.profile(graph, model, inputs, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_on_cuda() -> None:
    model, inputs = build_model("candle_uno:branches=2")
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, device="cuda", batch_sizes=(1, 2))
    assert all(len(n.profile) == 2 for n in graph.nodes)
