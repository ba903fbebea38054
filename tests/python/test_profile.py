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
from graphpipe.runtime import manual_plan

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


class _Recording(nn.Module):
    """A linear layer that records the batch size of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.rows: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(x.shape[0])
        return self.linear(x)


def test_profile_takes_the_batch_sizes_in_turn() -> None:
    """The whole-graph runs go round the sizes (2, 4, 8, 2, 4, 8, ...), so that a machine that
    slows down during the profile slows every size alike; the operator-alone backwards come
    after them."""
    model = nn.Sequential(_Recording(), nn.ReLU())
    inputs = (torch.randn(8, 8),)
    graph = graphpipe.trace(model, inputs, leaf_modules=[_Recording])
    model[0].rows.clear()
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4, 8), repeats=3, warmup=1, leaf_modules=[_Recording])
    first = model[0].rows.index(2)  # the profile traces the model again at 8 rows before it times
    whole_graph_runs = (1 + 3) * 3
    assert model[0].rows[first : first + whole_graph_runs] == [2, 4, 8] * 4
    assert len(model[0].rows) > first + whole_graph_runs  # then each size's backward timed alone


def test_profile_scales_operator_backwards_to_the_whole_graph_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward split comes from each operator timed alone, the total from the whole-graph
    run: here the whole-graph run is replaced by one that reports known figures."""
    model, inputs = build_model("candle_uno:branches=2")
    graph = graphpipe.trace(model, inputs)
    real = profile_module._whole_graph_runs
    reported: dict[int, dict[str, float]] = {}

    def known(gm: Any, values: Any, sync: Any, warmup: int, repeats: int) -> Any:
        out = []
        for inputs, (forward, _, env) in zip(values, real(gm, values, sync, warmup, repeats)):
            batch = inputs[0].shape[0]
            reported[batch] = {name: 1e-3 * (i + 1) for i, name in enumerate(forward)}
            out.append((reported[batch], 0.25 * batch, env))
        return out

    monkeypatch.setattr(profile_module, "_whole_graph_runs", known)
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4), repeats=1, warmup=0)
    for i, batch in enumerate((2, 4)):
        assert sum(n.profile[i].backward_seconds for n in graph.nodes) == pytest.approx(0.25 * batch)
        assert all(n.profile[i].backward_seconds > 0 for n in graph.nodes if n.target == "Linear")
        for n in graph.nodes:
            assert n.profile[i].forward_seconds == pytest.approx(reported[batch].get(n.name, 0.0))


def test_scale_factor() -> None:
    assert profile_module._scale_factor([1.0, 3.0], 8.0) == 2.0
    assert profile_module._scale_factor([0.0, 0.0], 8.0) == 1.0  # nothing to share out
    assert profile_module._scale_factor([1.0, 3.0], 0.0) == 1.0  # nothing measured


class _Mixed(nn.Module):
    """Weights in a module, none in a ReLU, and a weight read as an attribute by a function."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.w = nn.Parameter(torch.randn(8, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.relu(self.fc(x)), self.w)


def test_profile_splits_each_backward_as_the_runtime_does() -> None:
    """I (input gradients) and W (weight gradients) of every operator: both measured where it
    has weights, W exactly 0 where it has none; the first layer, whose input is the model's data,
    still gets the I a stage would run on that input received from another stage."""
    model, inputs = _Mixed(), (torch.randn(4, 16),)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 8), repeats=3, warmup=1)
    by_target = {n.target: n for n in graph.nodes}
    assert set(by_target) >= {"Linear", "ReLU", "torch.nn.functional.linear"}
    for target in ("Linear", "torch.nn.functional.linear"):
        for p in by_target[target].profile:
            assert p.backward_input_seconds > 0 and p.backward_weight_seconds > 0, (target, p)
    for p in by_target["ReLU"].profile:
        assert p.backward_input_seconds > 0
        assert p.backward_weight_seconds == 0.0
    for n in graph.nodes:
        if n.op == "input":
            assert all(p.backward_input_seconds == 0.0 == p.backward_weight_seconds for p in n.profile)
    # Profiling leaves no gradient behind, the attribute-read weight's included.
    assert all(p.grad is None for p in model.parameters())
    # The planner prices each stage's halves from them: the stage holding fc receives nothing
    # that needs a gradient (it reads the model input), so its I is 0 and its W covers fc.
    # The stage after it receives fc's output (or relu's): its I runs from there.
    plan = manual_plan(graph, {"fc": 0, "relu": 1, "linear": 1}, 2)
    stage_of = {graph.node(v).name: s for s, st in enumerate(plan.stages) for v in st.nodes}
    assert stage_of["fc"] == 0 and stage_of["linear"] == 1
    first, last = plan.stages
    assert first.backward_input_seconds == 0.0 < first.backward_weight_seconds
    assert last.backward_input_seconds > 0.0 and last.backward_weight_seconds > 0.0


def test_profile_scales_the_halves_by_their_operators_backward_factor(monkeypatch: pytest.MonkeyPatch) -> None:
    """I and W are scaled by the factor that makes the operators' backwards add up to the whole
    graph's: known per-operator figures in, those figures times one factor out."""
    model, inputs = _Mixed(), (torch.randn(4, 16),)
    graph = graphpipe.trace(model, inputs)
    real = profile_module._whole_graph_runs
    alone = {"fc": (4.0, 1.0, 2.0), "relu": (1.0, 1.0, 0.0), "linear": (3.0, 2.0, 1.5)}

    def whole(gm: Any, values: Any, sync: Any, warmup: int, repeats: int) -> Any:
        return [(forward, 16.0, env) for forward, _, env in real(gm, values, sync, warmup, repeats)]  # twice 8.0

    monkeypatch.setattr(profile_module, "_whole_graph_runs", whole)
    monkeypatch.setattr(profile_module, "_operator_backward", lambda gm, node, *rest: alone[node.name])
    graphpipe.profile(graph, model, inputs, batch_sizes=(4,), repeats=1, warmup=0)
    for n in graph.nodes:
        if n.name in alone:
            b, i, w = alone[n.name]
            p = n.profile[0]
            assert (p.backward_seconds, p.backward_input_seconds, p.backward_weight_seconds) == (2 * b, 2 * i, 2 * w)


def test_profile_times_an_operator_that_writes_in_place() -> None:
    """An operator that writes into its input (nn.ReLU(inplace=True), as torchvision's ResNets
    and GoogLeNet have) is timed alone on copies of its input leaves: autograd refuses an
    in-place write into a leaf that needs a gradient, and the profile raised that before."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 4))
    inputs = (torch.randn(4, 8),)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4), repeats=2, warmup=1)
    relu = next(n for n in graph.nodes if n.target == "ReLU")
    for p in relu.profile:
        assert p.backward_seconds > 0 and p.backward_input_seconds > 0, p
        assert p.backward_weight_seconds == 0.0


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


def test_median_samples_takes_each_figure_median_over_the_ranks() -> None:
    # Three ranks, one node, two batch sizes: the median (not the mean) of every field.
    per_rank = [{7: [(2, 1.0, 10.0, 4.0, 6.0), (4, 2.0, 20.0, 8.0, 12.0)]},
                {7: [(2, 3.0, 30.0, 5.0, 7.0), (4, 4.0, 40.0, 9.0, 13.0)]},
                {7: [(2, 9.0, 11.0, 100.0, 0.0), (4, 90.0, 21.0, 1.0, 14.0)]}]
    merged = profile_module.median_samples(per_rank)
    got = [(s.batch_size, s.forward_seconds, s.backward_seconds, s.backward_input_seconds, s.backward_weight_seconds)
           for s in merged[7]]
    assert got == [(2, 3.0, 11.0, 5.0, 6.0), (4, 4.0, 21.0, 8.0, 13.0)]


GROUP_SPEC = "mmt:branches=2,depth=1,seq=4,hidden=16,heads=2,ffn=16,batch=4"


def _profile_in_group(rank: int, world: int, sizes_of_rank: dict[int, tuple[int, ...]], fake: bool) -> list:
    """Profiles GROUP_SPEC with every rank of the group; ``fake``: each operator's measured
    figures are this rank's number (1, 2, 10 for ranks 0, 1, 2) instead of timings."""
    import torch.distributed as dist

    model, inputs = build_model(GROUP_SPEC)
    graph = graphpipe.trace(model, inputs)
    if fake:
        value = (1.0, 2.0, 10.0)[rank]

        def measured(traced: Any, sizes: list, *_: Any) -> list:
            return [[(i, graphpipe._C.ProfileSample(b, value, 2 * value, value, value))
                     for i in range(graph.num_nodes)] for b in sizes]

        profile_module._profile_batches = measured
    graphpipe.profile(graph, model, inputs, batch_sizes=sizes_of_rank.get(rank, (1, 2)), repeats=1, warmup=0,
                      group=dist.group.WORLD)
    return [[(s.batch_size, s.forward_seconds, s.backward_seconds) for s in n.profile] for n in graph.nodes]


def test_profile_in_a_group_stores_the_ranks_median_on_every_rank() -> None:
    from graphpipe.testing import expect_ok, run_ranks

    faked = expect_ok(run_ranks(_profile_in_group, 3, {}, True, timeout=120, start_method="forkserver"))
    for r in faked:
        assert r.value and all(samples == [(1, 2.0, 4.0), (2, 2.0, 4.0)] for samples in r.value)
    timed = expect_ok(run_ranks(_profile_in_group, 2, {}, False, timeout=120, start_method="forkserver"))
    assert timed[0].value == timed[1].value  # real timings, merged: the same figures on both ranks
    assert any(f > 0 for samples in timed[0].value for _, f, _ in samples)


def test_profile_in_a_group_without_torch_distributed_is_a_clear_error() -> None:
    import torch.distributed as dist

    assert not dist.is_initialized()
    model, inputs = build_model(GROUP_SPEC)
    graph = graphpipe.trace(model, inputs)
    with pytest.raises(graphpipe.InputError, match="torch.distributed is not initialized"):
        graphpipe.profile(graph, model, inputs, batch_sizes=(1, 2), repeats=1, warmup=0, group=object())
    assert all(not node.profile for node in graph.nodes)  # nothing measured, nothing stored


def _profile_with_a_dying_peer(rank: int, world: int) -> tuple[str, str, bool]:
    """Rank 1 dies (SIGKILL) once it has timed its operators, before the ranks gather their
    figures; rank 0 returns what it raised and whether anything was stored."""
    import os
    import signal

    import torch.distributed as dist

    model, inputs = build_model(GROUP_SPEC)
    graph = graphpipe.trace(model, inputs)
    measure = profile_module._profile_batches

    def measured(*args: Any) -> list:
        result = measure(*args)
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    profile_module._profile_batches = measured
    try:
        graphpipe.profile(graph, model, inputs, batch_sizes=(1, 2), repeats=1, warmup=0, group=dist.group.WORLD)
    except Exception as exc:  # the test reads it
        return type(exc).__name__, str(exc), any(node.profile for node in graph.nodes)
    return "", "", any(node.profile for node in graph.nodes)


def test_profile_in_a_group_names_a_peer_that_died_as_a_peer_error() -> None:
    from graphpipe.testing import run_ranks

    results = run_ranks(_profile_with_a_dying_peer, 2, timeout=120, start_method="forkserver")
    assert not results[1].ok  # killed
    assert results[0].ok, (results[0].error_type, results[0].message)
    kind, message, stored = results[0].value
    assert kind == "PeerError", (kind, message)
    assert "a peer left in profile(group=), gathering the ranks' timings with the group's ranks [1]" in message
    assert not stored  # nothing half-merged was kept


def test_profile_in_a_group_refuses_a_rank_with_other_batch_sizes() -> None:
    from graphpipe.testing import run_ranks

    results = run_ranks(_profile_in_group, 2, {1: (1, 4)}, True, timeout=120, start_method="forkserver")
    for r in results:
        assert not r.ok and r.error_type == "InputError", (r.error_type, r.message)
        assert "rank 1 profiles with another batch sizes than rank 0 ([1, 4] against [1, 2])" in r.message
