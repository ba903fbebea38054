"""Models people already have train unchanged under ``graphpipe.wrap``: torchvision's ResNet-18,
GoogLeNet and SqueezeNet, and hand-written patterns (in-place writes after a cut and on inputs,
buffers read directly, tied weights across stages, no_grad blocks, an input with a default).

Gold rule: N SGD steps on k CPU ranks give the same losses, parameters and buffers (BatchNorm
running statistics included) as single-process training that accumulates the gradients of the
same micro-batches (``corpus_models.reference``). The corpus runs in float64; see
``corpus_models`` for why (float32 rounding, amplified by BatchNorm over two samples, moves
ResNet-18's reference gradients by 0.68 between one and two threads).

Matrix: every corpus model x partitioners {graphpipe, metis, sequential} x schedules
{1f1b, fill_drain, zb_graph} x {2, 3, 4} ranks = 243 cases with GRAPHPIPE_FULL_MATRIX=1. By
default a rotating subset runs: each model once, its (world, partitioner, schedule) advancing
with the day, so successive CI runs cover the matrix (the chosen cases are in the test ids),
plus every hand-written pattern under zb_graph on 4 ranks with sequential cuts, where stages
without trainable parameters appear (the split backward once refused them, issue #18).

Memory: a world's cases run in one set of rank processes and every case returns a whole model's
state, so only rank 0 returns it (every rank gathers the same full_state_dict), gradients and
shards only for the focused tests, and each world's results are checked and dropped as soon as
they arrive (``_matrix_verdicts``). Holding every rank's state of every case had the full matrix
reach 19 GB in the pytest process.
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
import corpus_models as cm

from graphpipe.testing import expect_ok, run_cases, run_ranks

# torchvision is a test dependency (scripts/install_deps.sh installs it): without it the corpus
# fails here, at import, naming the missing package, rather than being skipped.
cm.torchvision_models()

PARTITIONERS = ["graphpipe", "metis", "sequential"]
SCHEDULES = ["1f1b", "fill_drain", "zb_graph"]
WORLDS = [2, 3, 4]
STEPS = 2
LR = 0.05
# float64 gold tolerance: rounding in float64 (measured up to 7e-6 absolute on ResNet-18's
# running variances of magnitude ~10, 2e-9 on its losses) stays far inside it; any wrong
# gradient, missed update or stale buffer is orders of magnitude larger.
TOLERANCE = {"rtol": 1e-6, "atol": 1e-7}


# Always run (not rotated): the split backward on 4 ranks of sequential cuts, which give the
# hand-written patterns stages without trainable parameters (a buffer read, an activation, a
# frozen or no_grad block alone on a stage) and put in-place writes and tied weights across cuts.
ZERO_BUBBLE_FIXED = [(name, "sequential", "zb_graph", 4) for name in cm.PATTERNS]


def _matrix() -> list[tuple[str, str, str, int]]:
    full = list(itertools.product(PARTITIONERS, SCHEDULES, WORLDS))
    if os.environ.get("GRAPHPIPE_FULL_MATRIX") == "1":
        return [(name, p, s, w) for name in cm.NAMES for (p, s, w) in full]
    day = datetime.date.today().toordinal()
    rotating = [(name, *full[(day + 7 * i) % len(full)]) for i, name in enumerate(cm.NAMES)]
    return rotating + [case for case in ZERO_BUBBLE_FIXED if case not in rotating]


CASES = _matrix()


def train(
    name: str, partitioner: str, schedule: str, assignment: tuple[tuple[str, int], ...] | None = None,
    details: bool = False,
) -> dict[str, Any]:
    """On every rank: wrap the corpus model (on a manual plan from ``assignment``, operator ->
    stage pairs, if given), train STEPS SGD steps; what the test compares: the losses, the
    gathered state on rank 0 and, with ``details`` (the focused tests), this rank's shard and
    gradients."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace

    case = cm.build(name, STEPS)
    plan = None
    if assignment is not None:
        plan = manual_plan(trace(case.model, case.example), dict(assignment), cm.MICRO_BATCHES)
    # A given plan comes without planning options (wrap refuses both at once).
    planning = {"plan": plan} if plan is not None else {"partitioner": partitioner}
    # Closed after each case: a world's cases run one after another in the same processes.
    with graphpipe.wrap(
        case.model, case.example, case.loss_fn, schedule=schedule, micro_batches=cm.MICRO_BATCHES, timeout=120,
        **planning,
    ) as pipe:
        params = list(pipe.parameters())
        opt = torch.optim.SGD(params, lr=LR) if params else None
        losses = []
        for inputs, targets in case.batches:
            if opt:
                opt.zero_grad(set_to_none=True)
            losses.append(pipe.step(inputs, targets))
            if opt:
                opt.step()
        state = pipe.full_state_dict()  # a collective: every rank calls it, rank 0 returns it
        out: dict[str, Any] = {"losses": torch.stack(losses), "stages": pipe.plan.num_stages}
        if dist.get_rank() == 0:
            out["state"] = state
        if details:
            out["shard"] = pipe.state_dict()
            out["grads"] = {k: (None if p.grad is None else p.grad.clone()) for k, p in pipe.named_parameters()}
        return out


def _world_worker(rank: int, world: int, cases: list[tuple]) -> dict[tuple, Any]:
    return run_cases(train, cases)


_VERDICTS: dict[int, dict[tuple, str | None]] = {}
_REFERENCES: dict[str, dict[str, Any]] = {}


def _reference(name: str) -> dict[str, Any]:
    if name not in _REFERENCES:
        _REFERENCES[name] = cm.reference(name, STEPS, LR)
    return _REFERENCES[name]


def _run(world: int, cases: list[tuple]) -> list[Any]:
    return expect_ok(run_ranks(_world_worker, world, cases, timeout=180 + 90 * len(cases)))


def _matrix_verdicts(world: int, selected: list[tuple]) -> dict[tuple, str | None]:
    """The ``selected`` matrix cases of ``world``, run in one set of rank processes and checked
    against their references at once: case -> None (exact) or why not. Only the verdicts are
    kept, not the results (each holds a whole model's state)."""
    if world not in _VERDICTS:
        cases = [(m, p, s) for (m, p, s, w) in selected if w == world]
        try:
            results = _run(world, cases)
        except AssertionError as exc:  # a rank died: every case of the world reports it, once run
            _VERDICTS[world] = {key: str(exc) for key in cases}
            return _VERDICTS[world]
        verdicts: dict[tuple, str | None] = {}
        for key in cases:
            try:
                _check_against_reference(key[0], results, key)
                verdicts[key] = None
            except AssertionError as exc:
                verdicts[key] = str(exc)
        _VERDICTS[world] = verdicts
    return _VERDICTS[world]


def _check_against_reference(name: str, results: list[Any], key: tuple) -> dict[str, Any]:
    ref = _reference(name)
    for r in results:
        got = r.value.get(key)
        assert got is not None, f"rank {r.rank}: not run, an earlier case on these ranks failed first"
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
def test_corpus_trains_like_one_process(
    name: str, partitioner: str, schedule: str, world: int, request: pytest.FixtureRequest
) -> None:
    # The world's ranks train only the cases pytest selected (-k), not the whole matrix.
    selected = [
        tuple(item.callspec.params[k] for k in ("name", "partitioner", "schedule", "world"))
        for item in request.session.items
        if getattr(item, "function", None) is test_corpus_trains_like_one_process
    ]
    verdict = _matrix_verdicts(world, selected)[(name, partitioner, schedule)]
    assert verdict is None, verdict


# ---- focused cases, each under the plain and the split backward --------------------------------

# A focused case runs under 1f1b and under zb_graph (whose W computes the weight gradients apart
# from the input gradients), both in the same rank processes.
FOCUSED_SCHEDULES = ("1f1b", "zb_graph")


def _focused(name: str, partitioner: str, assignment: dict[str, int] | None) -> list[tuple]:
    pairs = tuple(assignment.items()) if assignment is not None else None
    return [(name, partitioner, schedule, pairs, True) for schedule in FOCUSED_SCHEDULES]


def _all_grads(results: list[Any], key: tuple) -> dict[str, Any]:
    return {k: g for r in results for k, g in r.value[key]["grads"].items()}


def _check_grads(results: list[Any], key: tuple, ref: dict[str, Any]) -> None:
    grads = _all_grads(results, key)
    assert set(grads) == set(ref["grads"])
    for k, g in grads.items():
        assert (g is None) == (ref["grads"][k] is None), f"{key[2]}: grad {k}: {g is None=} in the pipeline"
        if g is not None:
            torch.testing.assert_close(g, ref["grads"][k], **TOLERANCE, msg=lambda m, k=k: f"{key[2]}: grad {k}: {m}")


# ---- cuts forced where in-place writes meet received tensors ---------------------------------

FORCED = {
    # stage 1 starts with ReLU(inplace=True) on the received fc1 output
    "before_inplace_relu": {"x": 0, "fc1": 0, "skip": 0, "act": 1, "fc2": 1, "add_": 1, "relu": 1, "head": 1},
    # stage 1 starts with `y.add_(...)` on the received fc2 output
    "before_inplace_add": {"x": 0, "fc1": 0, "act": 0, "fc2": 0, "skip": 0, "add_": 1, "relu": 1, "head": 1},
}


@pytest.mark.parametrize("cut", sorted(FORCED))
def test_inplace_op_right_after_a_cut(cut: str) -> None:
    keys = _focused("inplace_after_cut", "manual", FORCED[cut])
    results = _run(2, keys)
    for key in keys:
        ref = _check_against_reference("inplace_after_cut", results, key)
        _check_grads(results, key, ref)


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
    assignment = {n.name: int(i >= cut) for i, n in enumerate(nodes) if n.op != "get_attr"}
    keys = _focused("resnet18", "manual", assignment)
    results = _run(2, keys)
    for key in keys:
        _check_against_reference("resnet18", results, key)


# ---- tied weights, no_grad ---------------------------------------------------------------------


def test_tied_embedding_split_across_stages() -> None:
    """The embedding and the output projection that reuses its matrix on different stages: each
    stage holds a copy, their gradients are summed over the two ranks, training is exact."""
    assignment = {"tokens": 0, "embed": 0, "mean": 0, "body_0": 0, "body_1": 1, "body_2": 1, "out": 1}
    keys = _focused("tied_embedding", "manual", assignment)
    results = _run(2, keys)
    for key in keys:
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
    keys = _focused("no_grad_block", "manual" if assignment else "sequential", assignment)
    results = _run(2, keys)
    for key in keys:
        ref = _check_against_reference("no_grad_block", results, key)
        grads = _all_grads(results, key)
        gradient_free = ["frozen.weight", "frozen.bias", "probe.weight", "probe.bias", "aux.weight", "aux.bias",
                         "head.bias"]
        for name in gradient_free:
            assert ref["grads"][name] is None, name
            assert grads[name] is None, f"{key[2]}: {name} got a gradient under wrap; it has none in one process"
        for name in ("fc.weight", "head.weight"):
            assert grads[name] is not None
            torch.testing.assert_close(grads[name], ref["grads"][name], **TOLERANCE)


# ---- stages without trainable parameters, and what a split backward keeps ----------------------

# direct_buffer on 3 ranks with its middle stage (tanh, a buffer read, a product) holding no
# parameter: under zb_graph its I is the whole backward and its W has nothing to compute (issue
# #18: this was refused as if the stage had never been given its parameters).
PARAMETER_FREE_MIDDLE = {"x": 0, "center": 0, "clone": 0, "sub": 0, "fc1": 0, "tanh": 1, "scale": 1, "mul": 1, "fc2": 2}


def test_stage_without_parameters_trains_like_one_process() -> None:
    keys = _focused("direct_buffer", "manual", PARAMETER_FREE_MIDDLE)
    results = _run(3, keys)
    for key in keys:
        assert [r.value[key]["grads"] == {} for r in results] == [False, True, False], "stage 1 holds no parameter"
        ref = _check_against_reference("direct_buffer", results, key)
        _check_grads(results, key, ref)


def _graphs_left_after_steps(rank: int, world: int, cases: list[tuple[str, dict[str, int]]]) -> dict[str, Any]:
    """zb_graph steps on manual plans; afterwards, how many of the tensors that the stage's
    Linear layers read (each saved by autograd for its weight gradient, so alive as long as any
    graph of theirs is) are still alive, and what the executor still holds."""
    import gc
    import weakref

    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace

    out = {}
    for name, assignment in cases:
        case = cm.build(name, 3)
        plan = manual_plan(trace(case.model, case.example), assignment, cm.MICRO_BATCHES)
        seen: list[weakref.ref] = []
        with graphpipe.wrap(case.model, case.example, case.loss_fn, plan=plan, schedule="zb_graph",
                            micro_batches=cm.MICRO_BATCHES, timeout=120) as pipe:
            for module in pipe.module.modules():
                if isinstance(module, torch.nn.Linear):
                    module.register_forward_pre_hook(lambda m, args: seen.extend(weakref.ref(a) for a in args))  # noqa: B023 (runs within this iteration)
            for inputs, targets in case.batches:
                pipe.step(inputs, targets)
            gc.collect()
            out[name] = {"read": len(seen), "alive": sum(r() is not None for r in seen),
                         "held": pipe.executor.held_micro_batches}
    return out


def test_zero_bubble_keeps_no_graph_after_a_step() -> None:
    """Between an I and its W the executor keeps the micro-batch's graph; after the step none
    may be left (a W never run, or kept roots never dropped, would grow memory step by step)."""
    cases = [("direct_buffer", PARAMETER_FREE_MIDDLE),
             # stage 1 writes into the received fc2 output (add_), stage 2 into the received sum
             ("inplace_after_cut", {"x": 0, "fc1": 0, "act": 0, "fc2": 0, "skip": 1, "add_": 1, "relu": 2, "head": 2})]
    for r in run_ranks(_graphs_left_after_steps, 3, cases, timeout=180):
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        for name, got in r.value.items():
            assert got["held"] == 0, (r.rank, name, got)
            if r.rank != 1 or name != "direct_buffer":  # that stage has no Linear
                assert got["read"] > 0, (r.rank, name, got)
            assert got["alive"] == 0, f"rank {r.rank}, {name}: {got['alive']} of {got['read']} saved tensors alive"


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
