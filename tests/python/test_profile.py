"""graphpipe.profile: per-operator forward/backward times stored on the graph."""

from __future__ import annotations

import pytest
import torch

import graphpipe
from graphpipe.models import build_model


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
