"""Piper's planner (the ``piper`` partitioner) makes plans that train like one process.

The gold test: a plan from ``graphpipe.plan(..., "piper", replicate=True)`` for the example
models on 2, 3 and 4 CPU ranks (a chain of stages cut between down-sets of the layer graph, some
stages replicated, skip tensors relayed along the chain), 3 SGD steps: the losses and every
rank's parameters equal plain single-process training on the same batches. The devices are
described so that Piper pipelines and replicates these small models: compute-bound (slow
flops, no per-operator overhead), free links, and a memory limit that no single device meets.
Also: the partitioner's error for a graph too wide for its down-set DP names the limit.
(C++: tests/cpp/test_partition_piper.cpp, the DP against brute force.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_runtime_gold import LR, make_model, reference
from torch import nn

import graphpipe
from graphpipe.testing import expect_ok, run_cases, run_ranks, train_pipeline

#: (ranks, model): the plans these give are checked below to pipeline and, at 3 and 4 ranks, to
#: replicate a stage.
CASES = [(4, "mmt"), (4, "dlrm"), (3, "candle_uno"), (2, "dlrm")]


def piper_plan(model: nn.Module, example: tuple, world: int) -> Any:
    """Piper's plan of the model on ``world`` compute-bound devices with free links and 70% of
    the model's static memory (weights, gradients, 2 x Adam state) each."""
    from graphpipe.trace import trace_module

    graph = trace_module(model, example).graph
    devices = graphpipe.devices(world, "cpu")
    devices.set_node_links(world, 1e15, 0.0, 1e15, 0.0)
    devices.op_overhead_seconds = 0.0
    devices.flops_per_second = 1e6
    static = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    return graphpipe.plan(graph, devices, "piper", replicate=True, micro_batches=2, memory_limit=0.7 * static)


def _train(name: str, world: int) -> dict[str, Any]:
    from graphpipe.models import default_loss

    model, example, batches = make_model(name)
    plan = piper_plan(model, example, world)
    with graphpipe.wrap(model, example, default_loss(name), plan=plan, timeout=60) as pipe:
        return train_pipeline(pipe, batches, LR) | {
            "partitioner": pipe.plan.partitioner,
            "chain": pipe.plan.chain,
            "devices": [list(s.devices) for s in pipe.plan.stages],
        }


def _worker(rank: int, world: int, names: list[str]) -> dict[tuple, Any]:
    return run_cases(_train, [(name, world) for name in names])


_RESULTS: dict[int, list[Any]] = {}


def _results(world: int) -> list[Any]:
    if world not in _RESULTS:
        names = [name for w, name in CASES if w == world]
        _RESULTS[world] = expect_ok(run_ranks(_worker, world, names, timeout=120 + 90 * len(names)))
    return _RESULTS[world]


@pytest.mark.parametrize("world,name", CASES, ids=[f"{n}-{w}ranks" for w, n in CASES])
def test_piper_plan_matches_single_process(world: int, name: str) -> None:
    results = _results(world)
    ref = reference(name)
    seen: set[str] = set()
    for r in results:
        got = r.value[(name, world)]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        assert got["partitioner"] == "piper" and got["chain"]
        torch.testing.assert_close(got["losses"], ref["losses"])
        for k, v in got["params"].items():
            torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")
            seen.add(k)
    assert seen == set(ref["params"]), "the ranks together must hold every parameter"
    devices = results[0].value[(name, world)]["devices"]
    print(f"\n{name} piper on {world} ranks: stages on {devices}")
    assert len(devices) >= 2, f"piper did not pipeline {name}: {devices}"
    if world > 2:
        assert any(len(d) > 1 for d in devices), f"piper replicated no stage of {name}: {devices}"


class _Wide(nn.Module):
    """40 independent one-layer branches between one input and one sum, each its own top-level
    module (a ModuleList would group them into one layer): more than 2^16
    down-sets however the operators are grouped (by module, or as 16 or more chunks of a
    topological order, each then holding independent branches)."""

    def __init__(self) -> None:
        super().__init__()
        for k in range(40):
            setattr(self, f"b{k}", nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([getattr(self, f"b{k}")(x) for k in range(40)]).sum(0)


def test_too_wide_a_graph_names_the_limit() -> None:
    graph = graphpipe.trace(_Wide(), (torch.randn(4, 8),))
    with pytest.raises(graphpipe.PlanningError, match=r"too wide for Piper's down-set DP.*2048 down-sets"):
        graphpipe.plan(graph, 4, "piper", replicate=True)
