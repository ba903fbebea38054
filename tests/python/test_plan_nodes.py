"""A plan names the nodes its stages run on: ``plan()`` records the node of each device from the
device description, ``print(plan)`` shows each stage's devices and nodes, ``repr`` counts the
nodes, and the JSON form keeps them (a plan written before they were recorded still loads).
(C++: tests/cpp/test_plan_nodes.cpp.)"""

from __future__ import annotations

import json

import torch
from torch import nn

import graphpipe


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


# layers 0-3 on stage 0, layers 4-7 on stage 1.
_HALVES = [("", 0)] + [(f"layers.{i}", 1) for i in range(4, 8)]


def _stage_rows(table: str) -> list[list[str]]:
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("stage dev"))
    return [line.split() for line in lines[start + 1 :] if not line.strip().startswith("stage edges")]


def test_plan_records_and_prints_each_stages_nodes() -> None:
    graph = graphpipe.trace(_Chain(), (torch.randn(16, 64),))
    devices = graphpipe.devices(4, "v100", per_node=2)
    plan = graphpipe.plan(graph, devices, "manual", manual=_HALVES,
                          stage_devices={0: [0, 1], 1: [2, 3]})
    assert list(plan.device_nodes) == [0, 0, 1, 1]
    assert [plan.stage_nodes(s) for s in plan.stages] == [[0], [1]]
    assert plan.num_device_nodes == 2
    assert "4 devices (2 nodes)" in repr(plan)
    assert "devices [2,3]" in repr(plan.stages[1])
    text = str(plan)
    assert "on 4 devices on 2 nodes" in text.splitlines()[0]
    # stage, dev, node: the first three columns of each stage's row.
    assert [row[:3] for row in _stage_rows(text)] == [["0", "0,1", "0"], ["1", "2,3", "1"]]
    assert [row[:3] for row in _stage_rows(plan.to_string(graph))] == [["0", "0,1", "0"], ["1", "2,3", "1"]]

    doc = json.loads(plan.to_json(graph))
    assert doc["device_nodes"] == [0, 0, 1, 1]
    back = graphpipe.Plan.from_json(plan.to_json(graph), graph)
    assert list(back.device_nodes) == [0, 0, 1, 1] and str(back) == text

    del doc["device_nodes"]  # as written before plans recorded nodes
    old = graphpipe.Plan.from_json(json.dumps(doc), graph)
    assert list(old.device_nodes) == [] and old.num_device_nodes == 0
    assert [row[:3] for row in _stage_rows(str(old))] == [["0", "0,1", "?"], ["1", "2,3", "?"]]


def test_stage_spanning_nodes_lists_both() -> None:
    graph = graphpipe.trace(_Chain(), (torch.randn(16, 64),))
    devices = graphpipe.devices(4, "v100", per_node=2)
    plan = graphpipe.plan(graph, devices, "manual", manual=_HALVES,
                          stage_devices={0: [0], 1: [1, 2, 3]})
    assert [plan.stage_nodes(s) for s in plan.stages] == [[0], [0, 1]]
    assert [row[:3] for row in _stage_rows(str(plan))] == [["0", "0", "0"], ["1", "1-3", "0,1"]]
