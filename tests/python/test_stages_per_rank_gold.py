"""Gold test of several stages per rank: plans placed by hand (``manual`` with ``stage_devices``)
that put two or three stages on one rank, looping (interleaved) or folded into a V, train equal
to plain single-process training over the same batches, under 1F1B and the zero-bubble
schedule (split backwards).

The cases cover a chain (the Transformer) on 2, 3 and 4 ranks, the multi-modal Transformer's
branches (a stage DAG), a parameter tied between two stages of one rank (its one tensor gets
both uses' gradients there) and between a rank with two stages and another rank, and a
replicated stage beside a rank with three stages. Each world size is one spawn of ranks that
runs all of its cases in a row; the losses of 3 SGD steps and every parameter afterwards are
compared at float32's default tolerance (``torch.testing.assert_close``).

Faults on ranks that hold two stages, timeout 5 s: on the V placement under zb_graph, rank 1
(the V's middle stages) or rank 0 (its first and last) is killed, hangs (rank 1) or raises in the second
step's forwards; every other rank raises PeerError (kill, raise: before the timeout) or
PipelineTimeout (hang: within the timeout + 5 s) naming it, the hung rank wakes to an error
naming itself as stuck, the raising one raises its own error, and no pipeline steps on. On a
plan the default search folded by itself (DLRM onto 2 CPU ranks, in a V), a killed rank is
named the same way.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from graphpipe.testing import reference_state, reported_results, run_cases, run_ranks

STEPS = 3
MICRO_BATCHES = 4
LR = 0.05


def _chain(depth: int) -> dict[str, int]:
    """The Transformer's blocks one stage each; the rest (embedding, head) with the last."""
    return {f"blocks.{k}": k for k in range(depth)} | {"": depth - 1}


# name -> (model spec or corpus name, operator -> stage, stage -> devices)
PLACEMENTS: dict[str, tuple[str, dict[str, int], dict[int, list[int]]]] = {
    "chain_v_2_ranks": ("transformer:depth=4,batch=8", _chain(4), {0: [0], 1: [1], 2: [1], 3: [0]}),
    "chain_looping_2_ranks": ("transformer:depth=4,batch=8", _chain(4), {0: [0], 1: [1], 2: [0], 3: [1]}),
    "chain_3_per_rank": ("transformer:depth=6,batch=8", _chain(6),
                         {0: [0], 1: [1], 2: [1], 3: [0], 4: [0], 5: [1]}),
    "mmt_branches": ("mmt:branches=2,depth=2,batch=8",
                     {"": 3, "_inputs": 0, "getitem": 0, "branches.0.0": 0, "branches.0.1": 1, "mean": 1,
                      "getitem_1": 2, "branches.1": 2, "mean_1": 2},
                     {0: [0], 1: [1], 2: [1], 3: [0]}),
    "tied_on_one_rank": ("tied_embedding", {"embed": 0, "mean": 0, "body": 1, "": 2}, {0: [0], 1: [1], 2: [0]}),
    "tied_across_ranks": ("tied_embedding", {"embed": 0, "mean": 0, "body.0": 1, "": 2},
                          {0: [0], 1: [0], 2: [1]}),
    "chain_v_3_ranks": ("transformer:depth=6,batch=8", _chain(6),
                        {0: [0], 1: [1], 2: [2], 3: [2], 4: [1], 5: [0]}),
    "replicated_beside_3_per_rank": ("transformer:depth=4,batch=8", _chain(4),
                                     {0: [0], 1: [1, 2], 2: [0], 3: [0]}),
    "chain_v_4_ranks": ("transformer:depth=8,batch=8", _chain(8),
                        {k: [k if k < 4 else 7 - k] for k in range(8)}),
}

CASES: list[tuple[str, str, int]] = [
    ("chain_v_2_ranks", "1f1b", 2),
    ("chain_v_2_ranks", "zb_graph", 2),
    ("chain_looping_2_ranks", "1f1b", 2),
    ("chain_3_per_rank", "zb_graph", 2),
    ("mmt_branches", "1f1b", 2),
    ("mmt_branches", "zb_graph", 2),
    ("tied_on_one_rank", "zb_graph", 2),
    ("tied_across_ranks", "1f1b", 2),
    ("chain_v_3_ranks", "zb_graph", 3),
    ("replicated_beside_3_per_rank", "1f1b", 3),
    ("chain_v_4_ranks", "zb_graph", 4),
]


def _build(source: str) -> tuple[torch.nn.Module, tuple, list[tuple[Any, Any]], Any]:
    """(seeded model, example inputs, STEPS batches, loss function), the same in every process."""
    if ":" not in source:  # a corpus pattern
        import corpus_models as cm

        case = cm.build(source, STEPS, torch.float32)
        return case.model, case.example, case.batches, case.loss_fn
    from graphpipe.models import build_model, default_loss

    torch.manual_seed(1234)
    model, example = build_model(source)
    batch = example[0].shape[0]
    batches = []
    for k in range(STEPS):
        g = torch.Generator().manual_seed(100 + k)
        batches.append((model.example_inputs(batch, generator=g), model.example_targets(batch, generator=g)))
    return model, example, batches, default_loss(source.split(":")[0])


def _reference(source: str) -> dict[str, Any]:
    """Plain single-process SGD: each step's loss over the whole batch, and the parameters."""
    model, _, batches, loss_fn = _build(source)
    return reference_state(model, batches, loss_fn, LR)


def _train(name: str, schedule: str) -> dict[str, Any]:
    """On every rank: wrap on the placement's plan and train STEPS SGD steps."""
    import graphpipe

    source, stages, devices = PLACEMENTS[name]
    model, example, batches, loss_fn = _build(source)
    with graphpipe.wrap(model, example, loss_fn, partitioner="manual", manual=stages, stage_devices=devices,
                        schedule=schedule, micro_batches=MICRO_BATCHES, timeout=120) as pipe:
        params = list(pipe.parameters())
        opt = torch.optim.SGD(params, lr=LR)
        losses = []
        for inputs, targets in batches:
            opt.zero_grad()
            losses.append(pipe.step(inputs, targets).detach())
            opt.step()
        return {"losses": torch.stack(losses), "stages": pipe.stages,
                "params": {k: v.detach().clone() for k, v in pipe.named_parameters()}}


def _world_worker(rank: int, world: int, cases: list[tuple[str, str]]) -> dict[tuple, Any]:
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])  # corpus_models, beside this file
    return run_cases(_train, cases)


_RESULTS: dict[int, list[Any]] = {}


def _results(world: int) -> list[Any]:
    if world not in _RESULTS:
        cases = [(n, s) for (n, s, w) in CASES if w == world]
        _RESULTS[world] = run_ranks(_world_worker, world, cases, timeout=120 + 60 * len(cases))
    return _RESULTS[world]


@pytest.mark.parametrize("name,schedule,world", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_several_stages_per_rank_train_like_one_process(name: str, schedule: str, world: int) -> None:
    results = _results(world)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    source, _, devices = PLACEMENTS[name]
    ref = _reference(source)
    seen: set[str] = set()
    for r in results:
        got = r.value.get((name, schedule))
        assert got is not None, f"rank {r.rank}: not run, an earlier case on these ranks failed first"
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        # The placement is the one asked for: this rank runs every stage placed on it.
        assert got["stages"] == sorted(s for s, d in devices.items() if r.rank in d), (r.rank, got["stages"])
        torch.testing.assert_close(got["losses"], ref["losses"])
        for k, v in got["params"].items():
            if k in ref["params"]:
                torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k, rank=r.rank: f"rank {rank}, {k}: {m}")
                seen.add(k)
    assert seen == set(ref["params"]), f"parameters held by no rank: {sorted(set(ref['params']) - seen)}"


def _checkpoint_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    """Trains a step on the V placement, saves, trains another; loads the save into a pipeline
    with one stage per rank and into a second V pipeline, and trains the same second step."""
    import os

    import graphpipe

    source, stages, devices = PLACEMENTS["chain_v_2_ranks"]
    path = os.path.join(root, "ckpt")
    out: dict[str, Any] = {}
    for label, placement in (("v", devices), ("one_per_rank", None)):
        model, example, batches, loss_fn = _build(source)
        where = {"stage_devices": placement} if placement else {}
        chain = {f"blocks.{k}": k // 2 for k in range(4)} | {"": 1} if placement is None else stages
        with graphpipe.wrap(model, example, loss_fn, partitioner="manual", manual=chain, micro_batches=MICRO_BATCHES,
                            timeout=120, **where) as pipe:
            opt = torch.optim.Adam(pipe.parameters(), lr=1e-3)
            if label == "v":
                pipe.step(*batches[0], optimizer=opt)
                pipe.save(path, optimizer=opt)
                out["full_after_save"] = pipe.full_state_dict()
            else:
                pipe.load(path, optimizer=opt)
                out["full_after_load"] = pipe.full_state_dict()
            out[f"loss_{label}"] = pipe.step(*batches[1], optimizer=opt).detach()
    return out


def test_a_v_placement_checkpoints_and_resumes_on_another_plan(tmp_path: Any) -> None:
    results = run_ranks(_checkpoint_worker, 2, str(tmp_path), timeout=300)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    saved, loaded = results[0].value["full_after_save"], results[0].value["full_after_load"]
    model, _, _, _ = _build(PLACEMENTS["chain_v_2_ranks"][0])
    assert list(saved) == list(model.state_dict()), "full_state_dict must have the plain model's keys, in order"
    model.load_state_dict(saved, strict=True)
    for k, v in saved.items():
        torch.testing.assert_close(loaded[k], v, rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")
    # The same second step after resuming on the other plan (Adam's state travelled too).
    for r in results:
        torch.testing.assert_close(r.value["loss_one_per_rank"], r.value["loss_v"])


# ---- faults on ranks that hold several stages ----------------------------------------------
FAULT_TIMEOUT = 5.0
STALL = 2.5 * FAULT_TIMEOUT  # a hang: past the timeout, and the survivors gone, before the rank wakes
FAULT_STEPS = 3  # the fault fires in the second (index 1); the third must never run
# A hang costs 17 s a case: rank 1 alone (rank 0's side of the V is the kill and raise cases').
FAULTS = [("kill", 1), ("kill", 0), ("hang", 1), ("raise", 1), ("raise", 0)]


def _arm(pipe: Any, rank: int, victim: int, kind: str) -> None:
    """Arms ``kind`` on ``victim`` in its second step's forwards: ``kill`` (SIGKILL) and ``hang``
    (asleep for STALL) by ``fail_in_second_step``'s forward hook, ``raise`` (it has no such
    mode) by ``GRAPHPIPE_FAULT`` (read by ``wrap``: the caller sets it before wrapping)."""
    from graphpipe.testing import fail_in_second_step

    if rank == victim and kind in ("kill", "hang"):
        fail_in_second_step(pipe, "kill" if kind == "kill" else "stuck", stall_seconds=STALL)


def _steps_until_failure(pipe: Any, batches: list) -> dict[str, Any]:
    """Steps ``pipe`` over ``batches``: the steps that went through, the error that stopped it
    (any exception) and how long its step took, then what one more step says."""
    import time

    out: dict[str, Any] = {"steps": 0, "error": None}
    for inputs, targets in batches:
        start = time.monotonic()
        try:
            pipe.step(inputs, targets)
        except Exception as exc:
            out.update(error=type(exc).__name__, message=str(exc), seconds=time.monotonic() - start)
            break
        out["steps"] += 1
    try:
        pipe.step(*batches[0])
        out["after"] = None
    except Exception as exc:
        out["after"] = (type(exc).__name__, str(exc))
    return out


def _faulty_v_worker(rank: int, world: int, kind: str, victim: int) -> dict[str, Any]:
    """The V placement under zb_graph (rank 0: stages 0 and 3, rank 1: stages 1 and 2), timeout
    FAULT_TIMEOUT; ``victim`` is killed, hangs or raises in the second step's forwards."""
    import os

    import graphpipe

    os.environ["GRAPHPIPE_FAULT"] = f"{victim}:1:forward:raise" if kind == "raise" else ""
    source, stages, devices = PLACEMENTS["chain_v_2_ranks"]
    model, example, batches, loss_fn = _build(source)
    batches = (batches * FAULT_STEPS)[:FAULT_STEPS]
    pipe = graphpipe.wrap(model, example, loss_fn, partitioner="manual", manual=stages, stage_devices=devices,
                          schedule="zb_graph", micro_batches=MICRO_BATCHES, timeout=FAULT_TIMEOUT,
                          flight_recorder_dir="")
    _arm(pipe, rank, victim, kind)
    out = {"stages": pipe.stages} | _steps_until_failure(pipe, batches)
    pipe.close()
    return out


def _check_fault(results: list[Any], kind: str, victim: int, stages: dict[int, list[int]] | None = None) -> None:
    """Every rank failed in the second step with an error naming ``victim`` (a survivor within
    the timeout, or the timeout and 5 s for a hang; the victim, unless killed, itself), and no
    pipeline steps on afterwards."""
    named = f"the pipeline failed on rank {victim}"
    for r in reported_results(results, victim, kind):
        got = r.value
        if stages is not None:  # this rank ran both of its stages
            assert got["stages"] == stages[r.rank], (r.rank, got["stages"])
        assert got["steps"] == 1, (r.rank, got)  # the first step went through, the fault stopped the second
        assert got["error"] is not None, f"rank {r.rank} raised nothing"
        message = got["message"]
        if r.rank == victim:
            if kind == "raise":  # its own error, as the executor raised it
                assert got["error"] == "InjectedFault", got  # the one type of an injected fault
                assert f"injected fault GRAPHPIPE_FAULT={victim}:1:forward:raise on rank {victim}" in message, message
                assert got["seconds"] < FAULT_TIMEOUT, got
            else:  # hang: it wakes to find itself named as the stuck rank, and does not wait on
                assert got["error"] == "PipelineTimeout", got
                assert f"{named}: PipelineTimeout: rank {victim} is stuck" in message, message
                assert STALL <= got["seconds"] < STALL + FAULT_TIMEOUT + 5.0, got
        else:
            if kind == "hang":
                assert got["error"] == "PipelineTimeout", (r.rank, got)
                assert f"rank {r.rank}: {named}: PipelineTimeout: rank {victim} is stuck" in message, message
                assert FAULT_TIMEOUT <= got["seconds"] < FAULT_TIMEOUT + 5.0, (r.rank, got)
            else:  # a peer that died or raised: at once, before the timeout
                assert got["error"] == "PeerError", (r.rank, got)
                assert f"rank {r.rank}: {named}: " in message, message
                if kind == "raise":
                    assert f"InjectedFault: injected fault GRAPHPIPE_FAULT={victim}:1:forward:raise" in message, message
                else:
                    assert f"rank {victim} left without a word" in message, message
                assert got["seconds"] < FAULT_TIMEOUT, (r.rank, got)
        # no rank goes on as if nothing happened
        assert got["after"] is not None and got["after"][0] == "InputError", (r.rank, got["after"])
        assert "stopped after a failure" in got["after"][1] and f"rank {victim}" in got["after"][1], got["after"]


@pytest.mark.parametrize("kind,victim", FAULTS, ids=[f"{k}-rank{v}" for k, v in FAULTS])
def test_a_fault_on_a_rank_with_two_stages_fails_every_rank_naming_it(kind: str, victim: int) -> None:
    """Rank 1 (the V's middle stages) or rank 0 (its first and last) killed, hung for STALL or
    raising in the second step's forwards."""
    results = run_ranks(_faulty_v_worker, 2, kind, victim, timeout=120)
    devices = PLACEMENTS["chain_v_2_ranks"][2]
    _check_fault(results, kind, victim, {r: sorted(s for s, d in devices.items() if r in d) for r in (0, 1)})
    print(f"\n{kind} rank {victim}: " + "; ".join(
        f"rank {r.rank} {r.value['error']} after {r.value['seconds']:.2f} s: {r.value['message']}" for r in results if r.ok))


# ---- a plan the planner folded -----------------------------------------------------------------
FOLDED_SOURCE = "dlrm:batch=8"
FOLDED_VICTIM = 1


def _folded_worker(rank: int, world: int, victim: int) -> dict[str, Any]:
    """``wrap`` with the default search (no partitioner, no stages_per_rank, the default devices:
    a CPU rank per rank), micro_batches=MICRO_BATCHES, zb_graph; ``victim`` is killed in the
    second step's forwards."""
    import os

    import graphpipe
    from graphpipe.models import default_loss

    os.environ["GRAPHPIPE_FAULT"] = ""
    model, example, batches, _ = _build(FOLDED_SOURCE)
    batches = (batches * FAULT_STEPS)[:FAULT_STEPS]
    pipe = graphpipe.wrap(model, example, default_loss(FOLDED_SOURCE.split(":")[0]), schedule="zb_graph",
                          micro_batches=MICRO_BATCHES, timeout=FAULT_TIMEOUT, flight_recorder_dir="")
    plan = {"partitioner": pipe.plan.partitioner, "devices": [sorted(s.devices) for s in pipe.plan.stages],
            "stages": pipe.stages}
    _arm(pipe, rank, victim, "kill")
    out = plan | _steps_until_failure(pipe, batches)
    pipe.close()
    return out


def test_a_rank_killed_on_a_plan_the_planner_folded_fails_its_peer_naming_it() -> None:
    """The default search folds DLRM onto 2 CPU ranks (two stages on a rank); rank 1 is
    SIGKILLed in the second step and rank 0 raises PeerError naming it before the timeout."""
    results = run_ranks(_folded_worker, 2, FOLDED_VICTIM, timeout=120)
    survivor = results[1 - FOLDED_VICTIM]
    assert survivor.ok, f"rank {survivor.rank}: {survivor.error_type}: {survivor.message}\n{survivor.traceback}"
    devices = survivor.value["devices"]
    # The planner folded: some rank holds two of the plan's stages (and says so), and each rank
    # runs every stage placed on it.
    per_rank = {r: [s for s, d in enumerate(devices) if r in d] for r in (0, 1)}
    assert any(len(held) >= 2 for held in per_rank.values()), devices
    assert "stages per device" in survivor.value["partitioner"], survivor.value["partitioner"]
    assert survivor.value["stages"] == per_rank[survivor.rank], (survivor.value["stages"], devices)
    _check_fault(results, "kill", FOLDED_VICTIM)
    print(f"\nplan {survivor.value['partitioner']}: stages on {devices}; rank {survivor.rank} "
          f"{survivor.value['error']} after {survivor.value['seconds']:.2f} s")
