"""The planner prices the precision a model computes in (graph/precision.h, cost/devices.h).

A model traced under ``torch.autocast(dtype=torch.bfloat16)`` records bfloat16 activations (half
the bytes of float32 on every edge a bfloat16 operator produces; integer inputs unchanged) and
``compute_dtype == "bfloat16"``; ``plan(..., dtype=)`` traces so, prices the devices' bfloat16 rate
(an A100's tensor cores) and shows the precision in ``print(plan)``; a graph traced in another
precision than ``dtype`` is refused rather than approximated.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import graphpipe
from graphpipe.errors import InputError

WIDTH = 1024
BATCH = 64


class TwoBranch(nn.Module):
    """Two Linear branches (one fed by an embedding of integer ids) joined by a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.left = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.embed = nn.Embedding(100, WIDTH)
        self.right = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
        self.head = nn.Linear(2 * WIDTH, 8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.left(x), self.right(self.embed(ids))], dim=1))


def _example() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return TwoBranch(), (torch.randn(BATCH, WIDTH), torch.randint(0, 100, (BATCH,)))


def _edge_bytes(graph) -> dict[tuple[str, str], float]:
    """Each edge's bytes per sample, keyed by its ends' names."""
    names = [graph.node(i).name for i in range(graph.num_nodes)]
    return {(names[e.src], names[e.dst]): e.bytes for e in graph.edges}


def test_trace_under_autocast_records_bfloat16_activations() -> None:
    model, inputs = _example()
    f32 = graphpipe.trace(model, inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = graphpipe.trace(model, inputs)
    assert (f32.compute_dtype, bf16.compute_dtype) == ("float32", "bfloat16")
    assert bf16.fingerprint() == f32.fingerprint()
    full, half = _edge_bytes(f32), _edge_bytes(bf16)
    assert full.keys() == half.keys()
    for (src, dst), nbytes in full.items():
        producer = dict(model.named_modules()).get(src.replace("_", "."))
        if src in ("x", "ids") or isinstance(producer, nn.Embedding):
            # inputs (the float one too: autocast casts inside operators) and the embedding
            # (not on autocast's bfloat16 list) are as in float32; the ids are int64 either way
            assert half[(src, dst)] == nbytes, (src, dst)
        elif src.startswith(("left", "right")):
            assert half[(src, dst)] == nbytes / 2, (src, dst)
    assert half[("ids", "embed")] == 8  # one int64 id per sample


def test_plan_in_bfloat16_halves_transfers_and_runs_faster_on_a100() -> None:
    model, inputs = _example()
    devices = graphpipe.devices(2, "a100")
    common = dict(example_inputs=inputs, partitioner="manual", manual={"left": 0, "": 1}, micro_batch_size=32)
    f32 = graphpipe.plan(model, devices, dtype="float32", **common)
    bf16 = graphpipe.plan(model, devices, dtype=torch.bfloat16, **common)
    assert (f32.compute_dtype, bf16.compute_dtype) == ("float32", "bfloat16")
    assert bf16.compute_flops_per_second == devices.bfloat16_flops_per_second == 156e12
    assert f32.compute_flops_per_second == devices.flops_per_second
    [edge32], [edge16] = f32.edges, bf16.edges  # left's output into the head's stage
    assert edge16.bytes == pytest.approx(edge32.bytes / 2)
    assert bf16.predicted_iteration_seconds < 0.8 * f32.predicted_iteration_seconds
    # the simulator runs the plan's own (bfloat16) stage times and transfers
    assert graphpipe.simulate(bf16, devices).iteration_seconds == pytest.approx(bf16.predicted_iteration_seconds)
    assert "precision bfloat16: activations and transfers 2 bytes/element, analytic compute at 156 TFLOP/s" in str(bf16)
    assert "precision float32: activations and transfers 4 bytes/element" in str(f32)


def test_plan_refuses_a_graph_traced_in_another_precision() -> None:
    model, inputs = _example()
    graph = graphpipe.trace(model, inputs)
    with pytest.raises(InputError, match=r"traced in float32.*torch\.autocast"):
        graphpipe.plan(graph, graphpipe.devices(2, "a100"), dtype="bfloat16")
    with pytest.raises(InputError, match="choose"):
        graphpipe.plan(graph, 2, dtype="int8")
    # the graph's own precision, given or not, plans
    assert graphpipe.plan(graph, 2, dtype="float32", replicate=False).compute_dtype == "float32"


def test_profile_measures_in_the_graphs_precision() -> None:
    model, inputs = _example()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graph = graphpipe.trace(model, inputs)
    # called without autocast, profile times the operators under the graph's own autocast
    graphpipe.profile(graph, model, inputs, batch_sizes=(4,), repeats=1, warmup=0)
    assert all(graph.node(i).profile for i in range(graph.num_nodes))
    assert graph.compute_dtype == "bfloat16"
