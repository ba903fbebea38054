"""Models people already have train unchanged under ``graphpipe.wrap``: torchvision's ResNet-18,
GoogLeNet and SqueezeNet, and hand-written patterns (in-place writes after a cut and on inputs,
buffers read directly, tied weights across stages, no_grad blocks, an input with a default).

Gold rule: N SGD steps on k CPU ranks give the same losses, parameters and buffers (BatchNorm
running statistics included) as single-process training that accumulates the gradients of the
same micro-batches (``corpus_models.reference``). The corpus runs in float64; see
``corpus_models`` for why (float32 rounding, amplified by BatchNorm over two samples, moves
ResNet-18's reference gradients by 0.68 between one and two threads).

Matrix: every corpus model x partitioners {graphpipe, metis, sequential} x schedules
{1f1b, fill_drain} x {2, 3, 4} ranks = 162 cases with GRAPHPIPE_FULL_MATRIX=1. By default a
rotating subset of 9 runs: each model once, its (world, partitioner, schedule) advancing with
the day, so successive CI runs cover the matrix (the chosen cases are in the test ids).
"""

from __future__ import annotations

import datetime
import itertools
import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import corpus_models as cm  # noqa: E402

from graphpipe.runtime.testing import run_cases, run_ranks  # noqa: E402

# torchvision is a test dependency (scripts/install_deps.sh installs it): without it the corpus
# fails here, at import, naming the missing package, rather than being skipped.
cm.torchvision_models()

PARTITIONERS = ["graphpipe", "metis", "sequential"]
SCHEDULES = ["1f1b", "fill_drain"]
WORLDS = [2, 3, 4]
STEPS = 2
LR = 0.05
# float64 gold tolerance: rounding in float64 (measured up to 7e-6 absolute on ResNet-18's
# running variances of magnitude ~10, 2e-9 on its losses) stays far inside it; any wrong
# gradient, missed update or stale buffer is orders of magnitude larger.
TOLERANCE = {"rtol": 1e-6, "atol": 1e-7}


def _matrix() -> list[tuple[str, str, str, int]]:
    full = list(itertools.product(PARTITIONERS, SCHEDULES, WORLDS))
    if os.environ.get("GRAPHPIPE_FULL_MATRIX") == "1":
        return [(name, p, s, w) for name in cm.NAMES for (p, s, w) in full]
    day = datetime.date.today().toordinal()
    return [(name, *full[(day + 7 * i) % len(full)]) for i, name in enumerate(cm.NAMES)]


CASES = _matrix()


def train(
    name: str, partitioner: str, schedule: str, assignment: tuple[tuple[str, int], ...] | None = None
) -> dict[str, Any]:
    """On every rank: wrap the corpus model (on a manual plan from ``assignment``, operator ->
    stage pairs, if given), train STEPS SGD steps; what the test compares."""
    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace

    case = cm.build(name, STEPS)
    plan = None
    if assignment is not None:
        plan = manual_plan(trace(case.model, case.example), dict(assignment), cm.MICRO_BATCHES)
    # A given plan comes without planning options (wrap refuses both at once).
    planning = {"plan": plan} if plan is not None else {"partitioner": partitioner}
    pipe = graphpipe.wrap(
        case.model, case.example, case.loss_fn, schedule=schedule, micro_batches=cm.MICRO_BATCHES, timeout=120,
        **planning,
    )
    params = list(pipe.parameters())
    opt = torch.optim.SGD(params, lr=LR) if params else None
    losses = []
    for inputs, targets in case.batches:
        if opt:
            opt.zero_grad(set_to_none=True)
        losses.append(pipe.step(inputs, targets))
        if opt:
            opt.step()
    return {
        "losses": torch.stack(losses),
        "state": pipe.full_state_dict(),
        "shard": pipe.state_dict(),
        "grads": {k: (None if p.grad is None else p.grad.clone()) for k, p in pipe.named_parameters()},
        "stages": pipe.plan.num_stages,
    }


def _world_worker(rank: int, world: int, cases: list[tuple]) -> dict[tuple, Any]:
    return run_cases(train, cases)


_RESULTS: dict[int, list[Any]] = {}
_REFERENCES: dict[str, dict[str, Any]] = {}


def _reference(name: str) -> dict[str, Any]:
    if name not in _REFERENCES:
        _REFERENCES[name] = cm.reference(name, STEPS, LR)
    return _REFERENCES[name]


def _run(world: int, cases: list[tuple]) -> list[Any]:
    results = run_ranks(_world_worker, world, cases, timeout=180 + 90 * len(cases))
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return results


def _matrix_results(world: int) -> list[Any]:
    if world not in _RESULTS:
        _RESULTS[world] = _run(world, [(m, p, s) for (m, p, s, w) in CASES if w == world])
    return _RESULTS[world]


def _check_against_reference(name: str, results: list[Any], key: tuple) -> dict[str, Any]:
    ref = _reference(name)
    for r in results:
        got = r.value[key]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        torch.testing.assert_close(got["losses"], ref["losses"], **TOLERANCE)
    state = results[0].value[key]["state"]
    assert list(state) == list(ref["state"]), "full_state_dict must have the plain model's keys, in order"
    for k, v in state.items():
        torch.testing.assert_close(v, ref["state"][k], **TOLERANCE, msg=lambda m, k=k: f"{k}: {m}")
    # The gathered checkpoint loads into the plain model as it is.
    plain = cm.build(name, STEPS).model
    plain.load_state_dict(state, strict=True)
    return ref


@pytest.mark.parametrize("name,partitioner,schedule,world", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_corpus_trains_like_one_process(name: str, partitioner: str, schedule: str, world: int) -> None:
    results = _matrix_results(world)
    _check_against_reference(name, results, (name, partitioner, schedule))


# ---- cuts forced where in-place writes meet received tensors ---------------------------------

FORCED = {
    # stage 1 starts with ReLU(inplace=True) on the received fc1 output
    "before_inplace_relu": {"x": 0, "fc1": 0, "skip": 0, "act": 1, "fc2": 1, "add_": 1, "relu": 1, "head": 1},
    # stage 1 starts with `y.add_(...)` on the received fc2 output
    "before_inplace_add": {"x": 0, "fc1": 0, "act": 0, "fc2": 0, "skip": 0, "add_": 1, "relu": 1, "head": 1},
}


@pytest.mark.parametrize("cut", sorted(FORCED))
def test_inplace_op_right_after_a_cut(cut: str) -> None:
    key = ("inplace_after_cut", "manual", "1f1b", tuple(FORCED[cut].items()))
    results = _run(2, [key])
    ref = _check_against_reference("inplace_after_cut", results, key)
    grads = {k: g for r in results for k, g in r.value[key]["grads"].items()}
    assert set(grads) == set(ref["grads"])
    for k, g in grads.items():
        torch.testing.assert_close(g, ref["grads"][k], **TOLERANCE, msg=lambda m, k=k: f"grad {k}: {m}")


def test_resnet_cut_between_add_and_inplace_relu() -> None:
    """ResNet-18 cut between a residual block's `out += identity` and its ReLU(inplace=True):
    the receiving stage's first operator writes into the received tensor."""
    import operator

    from graphpipe.trace import trace_module

    case = cm.build("resnet18")
    nodes = [n for n in trace_module(case.model, case.example).module.graph.nodes if n.op != "output"]
    cut = next(
        i for i, n in enumerate(nodes)
        if n.meta.get("inplace") and n.args[0].target is operator.add and n.name.startswith("layer3")
    )
    assignment = tuple((n.name, int(i >= cut)) for i, n in enumerate(nodes) if n.op != "get_attr")
    key = ("resnet18", "manual", "1f1b", assignment)
    _check_against_reference("resnet18", _run(2, [key]), key)


# ---- tied weights, no_grad ---------------------------------------------------------------------


def test_tied_embedding_split_across_stages() -> None:
    """The embedding and the output projection that reuses its matrix on different stages: each
    stage holds a copy, their gradients are summed over the two ranks, training is exact."""
    assignment = {"tokens": 0, "embed": 0, "mean": 0, "body_0": 0, "body_1": 1, "body_2": 1, "out": 1}
    key = ("tied_embedding", "manual", "1f1b", tuple(assignment.items()))
    results = _run(2, [key])
    ref = _check_against_reference("tied_embedding", results, key)
    shards = [r.value[key]["shard"] for r in results]
    assert "embed.weight" in shards[0] and "out.weight" in shards[1]
    torch.testing.assert_close(shards[0]["embed.weight"], shards[1]["out.weight"], rtol=0, atol=0)
    summed = results[0].value[key]["grads"]["embed.weight"]
    torch.testing.assert_close(summed, ref["grads"]["embed.weight"], **TOLERANCE)


@pytest.mark.parametrize("assignment", [
    None,  # one stage per rank as the partitioner likes
    # (operators not named go to the stage of their first consumer: here stage 1)
    {"frozen": 0, "relu": 0, "probe": 0, "head": 1},  # the gradient-free blocks alone on stage 0
    {"frozen": 0, "probe": 0, "relu": 1, "head": 1},  # a cut inside the no_grad block
], ids=["partitioned", "frozen-stage", "cut-inside-no-grad"])
def test_no_grad_block_leaves_grad_none(assignment: dict[str, int] | None) -> None:
    key = ("no_grad_block", "manual" if assignment else "sequential", "1f1b",
           tuple(assignment.items()) if assignment else None)
    results = _run(2, [key])
    ref = _check_against_reference("no_grad_block", results, key)
    grads = {k: g for r in results for k, g in r.value[key]["grads"].items()}
    gradient_free = ["frozen.weight", "frozen.bias", "probe.weight", "probe.bias", "aux.weight", "aux.bias", "head.bias"]
    for name in gradient_free:
        assert ref["grads"][name] is None, name
        assert grads[name] is None, f"{name} got a gradient under wrap; it has none in one process"
    for name in ("fc.weight", "head.weight"):
        assert grads[name] is not None
        torch.testing.assert_close(grads[name], ref["grads"][name], **TOLERANCE)


# ---- refusals ----------------------------------------------------------------------------------


def test_batchnorm_called_from_two_stages_is_refused() -> None:
    from graphpipe.errors import PlanningError
    from graphpipe.runtime import manual_plan
    from graphpipe.runtime.stages import build_stages
    from graphpipe.trace import trace_module

    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.fc(self.bn(x)))

    traced = trace_module(Twice(), (torch.randn(4, 4),))
    plan = manual_plan(traced.graph, {"x": 0, "bn": 0, "fc": 1, "bn_1": 1}, 2)
    with pytest.raises(PlanningError, match=r"module 'bn' \(BatchNorm1d\) on stages \[0, 1\]|users of module 'bn'"):
        build_stages(traced.module, plan, traced.graph)


def _step_with_another_context(rank: int, world: int) -> str:
    import graphpipe

    case = cm.build("default_input")
    x, ctx = case.example
    pipe = graphpipe.wrap(case.model, (x,), case.loss_fn, partitioner="sequential", micro_batches=2, timeout=60)
    inputs, targets = case.batches[0]
    try:
        pipe.step(inputs, targets)  # (x, context): traced with context omitted (None)
    except graphpipe.InputError as exc:
        return str(exc)
    return "no error"


def test_argument_fixed_at_trace_time_refuses_another_value() -> None:
    for r in run_ranks(_step_with_another_context, 2, timeout=120):
        assert r.ok, r.message
        assert "traced with context=None" in r.value and "context=a tensor of shape" in r.value, r.value
