"""Pricing the sync methods of replicated stages from Python: parameter shapes in the trace, the
stage parameters in the runtime's order and its gradient buckets, the payload of each method
(expectations computed here from the shapes), and ``plan(sync=...)`` / ``simulate(sync=...)``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import graphpipe
from graphpipe._ext import _C
from graphpipe.runtime.stages import build_stages
from graphpipe.testing import run_ranks
from graphpipe.trace import trace_module


class Interleaved(nn.Module):
    """Modules registered in one order and called in another, a parameter read directly, a
    frozen one: the stage module's parameter order is not the registration order."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 4)
        self.enc = nn.ModuleDict({"a": nn.Linear(16, 16), "b": nn.Linear(16, 16)})
        self.dec = nn.Linear(16, 16)
        self.pos = nn.Parameter(torch.zeros(16))
        self.norm = nn.LayerNorm(16)
        self.norm.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.enc["a"](x + self.pos))
        h = torch.relu(self.dec(h))
        h = self.enc["b"](h)
        return self.head(self.norm(h))


def _traced():
    model = Interleaved()
    return model, trace_module(model, torch.randn(8, 16))


def test_trace_records_each_parameters_shape_dtype_and_training() -> None:
    _, traced = _traced()
    graph = traced.graph
    shapes = {p.name: p for n in graph.nodes for p in n.param_shapes}
    assert list(shapes["enc.a.weight"].shape) == [16, 16]
    assert shapes["enc.a.weight"].dtype == "float32" and shapes["enc.a.weight"].element_size == 4
    assert list(shapes["pos"].shape) == [16]
    assert not shapes["norm.weight"].requires_grad and shapes["norm.bias"].requires_grad
    for n in graph.nodes:
        assert [p.name for p in n.param_shapes] == list(n.params)
        assert sum(p.bytes for p in n.param_shapes) == n.param_bytes
    back = _C.OpGraph.from_json(graph.to_json())
    assert [list(p.shape) for n in back.nodes for p in n.param_shapes] == [
        list(p.shape) for n in graph.nodes for p in n.param_shapes]


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_stage_parameters_are_the_stage_modules_in_order(devices: int) -> None:
    _, traced = _traced()
    plan = graphpipe.plan(traced.graph, devices, "sequential")
    stages = build_stages(traced.module, plan, traced.graph)
    for stage, module in zip(plan.stages, (st.module for st in stages.stages)):
        expected = [(name, list(p.shape), p.requires_grad) for name, p in module.named_parameters()]
        assert [(p.name, list(p.shape), p.requires_grad) for p in stage.parameters] == expected
    if devices == 1:  # the interleaving shows: pos first, enc before dec, head last
        names = [p.name for p in plan.stages[0].parameters]
        assert names[0] == "pos" and names.index("enc.b.weight") < names.index("dec.weight")
        assert names[-1] == "head.bias"


def _runtime_buckets(rank: int, world: int, cap: float) -> list[tuple[int, float]]:
    import torch.distributed as dist

    model, traced = _traced()
    plan = graphpipe.plan(traced.graph, 1, "sequential")
    module = build_stages(traced.module, plan, traced.graph).stages[0].module
    trained = [p for p in module.parameters() if p.requires_grad]
    buckets = _C.GradientBuckets(trained, dist.group.WORLD, 30.0, cap)
    layout = _C.gradient_buckets(plan.stages[0].parameters, cap)
    return [(buckets.num_buckets, buckets.bytes), (len(layout), sum(b.bytes for b in layout))]


@pytest.mark.parametrize("cap", [600.0, 2000.0])
def test_the_cost_models_buckets_are_the_runtimes(cap: float) -> None:
    (result,) = run_ranks(_runtime_buckets, 1, cap, timeout=120.0)
    assert result.ok, result.traceback
    runtime, model = result.value
    assert runtime == model
    assert runtime[0] > 1  # several buckets: the layout rule matters


def _linear_layer() -> list:
    # nn.Linear(1000, 100) as the stage module lists it: weight (100 x 1000), bias (100).
    return [_C.ParamShape("fc.weight", [100, 1000]), _C.ParamShape("fc.bias", [100])]


def test_payload_bytes_of_each_method() -> None:
    params = _linear_layer()
    numel = 100 * 1000 + 100  # one bucket: the bias opens it, the weight joins it
    payload = lambda method, **kw: _C.sync_payload_bytes(method, params, **kw)  # noqa: E731
    assert payload(_C.SyncMethod()) == numel * 4
    assert payload(_C.SyncMethod(kind="top_k", ratio=0.01)) == math.ceil(0.01 * numel) * (4 + 4)  # values + int32 positions
    # PowerSGD rank 2: the 100 x 1000 weight is compressed ((100 + 1000) * 2 * 2 < 100000) into
    # P (100 x 2) and Q (1000 x 2); the bias is all-reduced as it is.
    assert payload(_C.SyncMethod(kind="power_sgd", rank=2)) == (100 + 100 * 2 + 1000 * 2) * 4
    local = _C.SyncMethod(kind="local_sgd", period=4.0)
    assert payload(local) == numel * 4 / 4
    assert payload(local, sync_step=True) == numel * 4
    assert payload(_C.SyncMethod(), replicas=1) == 0.0


def test_sync_method_is_checked_and_readable() -> None:
    method = _C.SyncMethod(kind="top_k", ratio=0.05, hierarchical=True)
    assert repr(method) == "SyncMethod(kind='top_k', ratio=0.05, hierarchical=True)"
    assert (method.kind, method.ratio, method.hierarchical) == ("top_k", 0.05, True)
    assert _C.SyncMethod.from_json(method.to_json()) == method
    with pytest.raises(graphpipe.PlanningError, match="ratio"):
        _C.SyncMethod(kind="top_k", ratio=1.5)
    with pytest.raises(graphpipe.PlanningError, match="period"):
        _C.SyncMethod(kind="local_sgd", period=0.0)
    with pytest.raises(graphpipe.PlanningError, match="power_sgd"):
        _C.SyncMethod(kind="qsgd")


class _LocalSGD:
    """Stands for graphpipe.sync's methods: anything with cost_method() plugs in."""

    def __init__(self, period: int) -> None:
        self.period = period

    def cost_method(self):
        return _C.SyncMethod(kind="local_sgd", period=float(self.period))


class _Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_plan_and_simulate_price_the_sync_method() -> None:
    graph = graphpipe.trace(_Wide(), torch.randn(512, 256))
    # CPU ranks behind 10 MB/s links: summing 1 MiB of gradients every step costs more than a
    # replica's compute saves; PowerSGD's factors and local SGD's rare averaging do not.
    devices = _C.Devices.cpu_rank(4, False)
    devices.set_node_links(4, 1e7, 1e-5, 1e7, 1e-5)
    plain = graphpipe.plan(graph, devices, replicate=True)
    assert plain.sync == _C.SyncMethod()
    replicas = lambda p: max(len(s.devices) for s in p.stages)  # noqa: E731
    for sync in (_C.SyncMethod(kind="power_sgd", rank=1), _LocalSGD(64)):
        plan = graphpipe.plan(graph, devices, replicate=True, sync=sync)
        assert plan.sync == graphpipe.planner.sync_method(sync)
        assert plan.predicted_iteration_seconds < plain.predicted_iteration_seconds, (sync, str(plan))
        assert replicas(plan) > replicas(plain), str(plan)
        back = _C.Plan.from_json(plan.to_json(graph), graph)
        assert back.sync == plan.sync
    # The simulator prices the plan's method unless told another.
    plan = graphpipe.plan(graph, devices, replicate=True, sync=_LocalSGD(64))
    local = graphpipe.simulate(plan, devices)
    assert local.sync == plan.sync
    summed = graphpipe.simulate(plan, devices, sync="allreduce")
    assert local.amortized_iteration_seconds < summed.iteration_seconds
    averaging = [t for t in local.tasks if t.kind == "average"]
    assert averaging and local.iteration_seconds > graphpipe.simulate(plan, devices, sync_step=False).iteration_seconds
    with pytest.raises(graphpipe.InputError, match="sync must be"):
        graphpipe.plan(graph, devices, replicate=True, sync=4)
