"""Single-process checks of the runtime's Python pieces: micro-batching, stage splitting (the
stage modules, run one after another, compute the model), plans and schedules."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError, PlanningError
from graphpipe.runtime import build_stages, manual_plan, merge, split
from graphpipe.runtime.stages import flatten_values, meta_copy, propagate_layouts, unflatten_values
from graphpipe.trace import trace_module
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan


def test_split_and_merge_nested() -> None:
    batch = {"a": torch.arange(12).reshape(6, 2), "b": (torch.ones(6), 3), "c": torch.tensor(1.0)}
    parts = split(batch, 3)
    assert [p["a"].shape[0] for p in parts] == [2, 2, 2]
    assert parts[1]["b"][1] == 3 and parts[2]["c"].item() == 1.0
    back = merge(parts)
    assert torch.equal(back["a"], batch["a"]) and torch.equal(back["b"][0], batch["b"][0])


def test_split_errors_are_clear() -> None:
    with pytest.raises(InputError, match="does not divide into 4 micro-batches"):
        split(torch.ones(6, 2), 4)
    with pytest.raises(InputError, match="different leading"):
        split((torch.ones(6), torch.ones(4)), 2)


def _run_stages_in_order(graph, values):  # noqa: ANN001 - test helper
    env = {}
    out = None
    for st in graph.stages:
        args = [values[name] for name in st.placeholders]
        for e in sorted(st.in_values):
            args.extend(env[name] for name in st.in_values[e])
        res = st.module(*args)
        pos = 0
        for e in sorted(st.out_values):
            for name in st.out_values[e]:
                env[name] = res[pos]
                pos += 1
        if st.is_output:
            out = res[-1]
    return out


@pytest.mark.parametrize("name,world", [("mmt", 3), ("dlrm", 4), ("candle_uno", 2), ("transformer", 4)])
def test_stage_modules_compose_to_the_model(name: str, world: int) -> None:
    model, example, batches = make_model(name)
    traced = trace_module(model, example)
    plan = hand_plan(model, example, world)
    graph = build_stages(traced.module, plan)
    assert len(graph.stages) == world
    # original parameter names, each parameter in exactly one stage
    names = [k for st in graph.stages for k, _ in st.module.named_parameters()]
    assert sorted(names) == sorted(k for k, _ in model.named_parameters())
    inputs = batches[0][0]
    values = dict(zip(graph.placeholders, [tuple(inputs)] if name in ("mmt", "candle_uno") else list(inputs)))
    torch.testing.assert_close(_run_stages_in_order(graph, values), model(*inputs))
    # the wire layout round-trips every crossing value
    layouts, out = propagate_layouts(meta_copy(traced.module), graph, values)
    assert out.shape[0] == inputs[0].shape[0]
    for e, layout in enumerate(layouts):
        assert len(layout.trees) == sum(len(st.out_values.get(e, ())) for st in graph.stages)
        fake = [torch.zeros(s.shape, dtype=s.dtype) for s in layout.specs]
        assert len(flatten_values(unflatten_values(layout, fake))) == len(fake)


def test_plan_must_cover_every_operator() -> None:
    model, example, _ = make_model("candle_uno")
    traced = trace_module(model, example)
    plan = hand_plan(model, example, 2)
    plan["stages"][0]["nodes"] = plan["stages"][0]["nodes"][:-1]
    with pytest.raises(PlanningError, match="in no stage"):
        build_stages(traced.module, plan)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_parameters_shared_across_stages_are_rejected() -> None:
    model = _Tied()
    traced = trace_module(model, (torch.ones(2, 4),))
    plan = manual_plan(traced.graph, {"a": 0, "relu": 0, "b": 1}, 2)
    with pytest.raises(PlanningError, match="shared across stages"):
        build_stages(traced.module, plan)


def test_runtime_schedule_is_checked_json() -> None:
    text = _C.runtime_schedule([[0], [1], [2]], [(0, 1), (0, 2), (1, 2)], 4, 2, "1f1b")
    doc = json.loads(text)
    assert doc["kind"] == "1f1b" and doc["stage_ranks"] == [0, 1, 2]
    assert doc["ranks"][0][0] == "0F0" and doc["ranks"][2][-1] == "2OPT"
    with pytest.raises(_C.PlanningError):
        _C.runtime_schedule([[0], [1]], [(0, 1)], 2, 1, "zigzag")


def test_error_classes() -> None:
    import graphpipe

    assert issubclass(graphpipe.PipelineTimeout, graphpipe.PeerError)
    assert issubclass(graphpipe.PeerError, graphpipe.GraphpipeError)
    assert issubclass(graphpipe.TransferMismatch, graphpipe.GraphpipeError)


def test_wrap_needs_a_process_group() -> None:
    import graphpipe

    model, example, _ = make_model("candle_uno")
    with pytest.raises(InputError, match="init_process_group"):
        graphpipe.wrap(model, example, nn.MSELoss())
