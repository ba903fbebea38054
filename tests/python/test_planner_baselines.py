"""The default plan never simulates slower than its baselines on the same devices: the default
partitioner's default search weighs the plans of sequential+dp (PipeDream's planner), piper+dp (Piper's) and
plain data parallelism as candidates too (planner/default_search.h). Checked at 8 to 64
simulated V100s (8 per node) on the paper's models, torchvision's GoogLeNet and a CNN of wide
Inception blocks, where graphpipe's own search does lose to Piper's on 32 GPUs. (C++, on random
series-parallel graphs: tests/cpp/test_planner_default_search.cpp.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import graphpipe
from graphpipe._ext import _C
from graphpipe.models import build_model

_BUCKET = 25 * 2**20  # DDP's default bucket, as simulate_paper.py --replicas plans


class _InceptionBlock(nn.Module):
    """Four branches (1x1, 1x1-3x3, 1x1-5x5, pool-1x1), concatenated."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        q = channels // 4
        self.one = nn.Conv2d(channels, q, 1)
        self.three = nn.Sequential(nn.Conv2d(channels, q, 1), nn.ReLU(), nn.Conv2d(q, q, 3, padding=1))
        self.five = nn.Sequential(nn.Conv2d(channels, q, 1), nn.ReLU(), nn.Conv2d(q, q, 5, padding=2))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(channels, q, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([self.one(x), self.three(x), self.five(x), self.pool(x)], 1))


class _InceptionNet(nn.Module):
    def __init__(self, channels: int = 1024, blocks: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*[_InceptionBlock(channels) for _ in range(blocks)])
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(torch.relu(self.stem(x))).mean((2, 3)))


def _graph(name: str):
    if name == "inception_blocks":  # wide blocks on small images: parameters weigh against compute
        with torch.device("meta"):
            model = _InceptionNet()
        return graphpipe.trace(model, (torch.empty(64, 3, 16, 16, device="meta"),))
    if name == "googlenet":
        from corpus_models import torchvision_models

        with torch.device("meta"):
            model = torchvision_models().googlenet(num_classes=1000, aux_logits=False, init_weights=False)
        return graphpipe.trace(model, (torch.empty(256, 3, 224, 224, device="meta"),))
    model, inputs = build_model(f"{name}:size=paper,device=meta,batch=256")
    return graphpipe.trace(model, inputs)


def _baselines(graph, devices, count: int) -> dict[str, float]:
    steps = {}
    for partitioner in ("sequential", "piper"):
        steps[partitioner + "+dp"] = graphpipe.plan(graph, devices, partitioner, bucket_bytes=_BUCKET).predicted_iteration_seconds
    try:
        steps["data parallel"] = graphpipe.plan(graph, devices, "manual", manual={"": 0}, stage_devices={0: list(range(count))},
                                                bucket_bytes=_BUCKET).predicted_iteration_seconds
    except graphpipe.PlanningError:  # the whole model does not fit on one device
        pass
    return steps


@pytest.mark.parametrize("name, counts", [
    ("inception_blocks", (8, 16, 32, 64)),
    ("googlenet", (8, 64)),
    ("dlrm", (8, 16, 32, 64)),
    ("candle_uno", (8, 16, 32, 64)),
    ("mmt", (8, 64)),
])
def test_default_plan_never_slower_than_its_baselines(name: str, counts: tuple[int, ...]) -> None:
    graph = _graph(name)
    for count in counts:
        devices = graphpipe.devices(count, "v100", per_node=8)
        chosen = graphpipe.plan(graph, devices, bucket_bytes=_BUCKET)
        for baseline, step in _baselines(graph, devices, count).items():
            assert chosen.predicted_iteration_seconds <= step * (1 + 1e-12), (
                f"{name} on {count} V100s: the default plan ({chosen.partitioner}) simulates "
                f"{chosen.predicted_iteration_seconds * 1e3:.3f} ms, {baseline} {step * 1e3:.3f} ms")


def test_a_faster_baseline_is_the_plan() -> None:
    # Wide Inception blocks on 32 V100s: graphpipe's own search (the default's budgets, without
    # the baselines) simulates slower than Piper's plan, so the default returns Piper's.
    graph = _graph("inception_blocks")
    devices = graphpipe.devices(32, "v100", per_node=8)
    own = _C.plan_by_simulation(graph, devices, replicate=True, plain_budget_limit=16, plain_every_up_to=16,
                                grow_replicas=True, bucket_bytes=_BUCKET).plan
    piper = graphpipe.plan(graph, devices, "piper", bucket_bytes=_BUCKET)
    assert piper.predicted_iteration_seconds < own.predicted_iteration_seconds
    chosen = graphpipe.plan(graph, devices, bucket_bytes=_BUCKET)
    assert chosen.partitioner.startswith("piper")
    assert chosen.predicted_iteration_seconds == piper.predicted_iteration_seconds
    chosen.validate(graph)
    # A partitioner asked for by name is its own search alone: what comparing partitioners measures.
    for name in ("sequential", "metis"):
        assert graphpipe.plan(graph, devices, name, bucket_bytes=_BUCKET).partitioner.startswith(name)
