"""Injected faults (GRAPHPIPE_FAULT=rank:step:phase:kind) over a matrix rank x phase x kind on a
3-stage chain, timeout=3: every surviving rank raises PeerError or PipelineTimeout within the
timeout + 5 s naming the faulty rank, the faulty rank (unless killed) names itself, nothing
hangs, and afterwards every rank's pipeline refuses to step with InputError naming the failure.
In the save and load phases a ``raise`` is a rank-local error with every rank alive: every rank
raises the same CheckpointError (save) or InputError (load) naming the faulty rank, the
checkpoint on disk is the one saved before, and the pipeline goes on training.

CI runs a rotation of the matrix: CASES_PER_RUN cases chosen by the day of the year, so that
every case runs over time; GRAPHPIPE_FAULT_MATRIX=full runs all of it, GRAPHPIPE_FAULT_MATRIX=
"1:forward:hang" (rank:phase:kind, commas between) the cases named. The allreduce phase needs a
replicated stage: its three kinds run on every run, on a plan whose first stage has two ranks."""

from __future__ import annotations

import datetime
import os
import random
import time
from typing import Any

import pytest
from test_runtime_gold import make_model

from graphpipe.testing import reported_results, run_ranks

TIMEOUT = 3.0
STEP = 1  # the faulty step: step 0 is a good one
RANKS = (0, 1, 2)
PHASES = ("forward", "backward", "send", "receive", "optimizer", "save", "load")
KINDS = ("raise", "hang", "kill")
CASES_PER_RUN = 4


def _matrix() -> list[tuple[int, str, str]]:
    # The last stage sends nothing forward and the first receives nothing: no such phase there.
    every = [(r, p, k) for r in RANKS for p in PHASES for k in KINDS]
    chosen = os.environ.get("GRAPHPIPE_FAULT_MATRIX", "")
    if chosen == "full":
        return every
    if chosen:
        return [(int(c.split(":")[0]), *c.split(":")[1:]) for c in chosen.split(",")]  # type: ignore[misc]
    random.Random(0).shuffle(every)  # a fixed order mixing ranks, phases and kinds
    day = datetime.date.today().timetuple().tm_yday
    start = (day * CASES_PER_RUN) % len(every)
    return [every[(start + k) % len(every)] for k in range(CASES_PER_RUN)]


def _fault_worker(rank: int, world: int, fault: str, folder: str, replicated: bool = False) -> dict[str, Any]:
    """Saves a checkpoint, then trains, saving and loading it after every step, with ``fault``
    armed; what failed, when, what the checkpoint and the pipeline hold afterwards."""
    import torch

    import graphpipe
    from graphpipe.models import default_loss

    os.environ["GRAPHPIPE_FAULT"] = fault
    model, example, batches = make_model("candle_uno")
    if replicated:  # stage 0 on ranks 0 and 1 (their gradients summed: the allreduce phase), stage 1 on rank 2
        from test_replicated_stages import replicated_plan

        where: dict[str, Any] = {"plan": replicated_plan(model, example, [[0, 1], [2]], "sequential", 4)}
    else:
        where = {"partitioner": "sequential", "replicate": False, "micro_batches": 4}
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"), timeout=TIMEOUT, flight_recorder_dir="",
                          **where)
    optimizer = torch.optim.SGD(pipe.parameters(), lr=0.01)
    path = os.path.join(folder, "ckpt")
    pipe.save(path, optimizer=optimizer)  # step_count 0: before any fault is due
    out: dict[str, Any] = {"error": None, "steps": 0}
    for inputs, targets in batches:
        start = time.monotonic()
        before = {k: v.clone() for k, v in pipe.state_dict().items()}
        on_disk = graphpipe.model_state_dict(path)
        try:
            pipe.step(inputs, targets, optimizer=optimizer)
            out["steps"] += 1
            start = time.monotonic()
            before = {k: v.clone() for k, v in pipe.state_dict().items()}
            pipe.save(path, optimizer=optimizer)
            on_disk = graphpipe.model_state_dict(path)
            pipe.load(path, optimizer=optimizer)
        except Exception as exc:
            out.update(error=type(exc).__name__, message=str(exc), seconds=time.monotonic() - start)
            out["disk_kept"] = _same(on_disk, graphpipe.model_state_dict(path))
            out["state_kept"] = _same(before, pipe.state_dict())
            break
    try:
        pipe.step(*batches[0], optimizer=optimizer)
        out["after"] = None
    except Exception as exc:
        out["after"] = (type(exc).__name__, str(exc))
    pipe.close()
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _check_local_error(r: Any, victim: int, phase: str) -> None:
    """A raise in save or load: every rank alive raises the same named error, the checkpoint and
    the state are as before, and the pipeline trains on."""
    got = r.value
    expected = "CheckpointError" if phase == "save" else "InputError"
    assert got["error"] == expected, (r.rank, got)
    assert f"on rank {victim}" in got["message"] and "injected fault" in got["message"], got["message"]
    assert got["seconds"] < TIMEOUT + 5.0, got
    assert got["disk_kept"] and got["state_kept"], got
    assert got["after"] is None, got["after"]  # still usable


@pytest.mark.parametrize("victim,phase,kind", _matrix() + [(1, "allreduce", k) for k in KINDS])
def test_injected_fault_is_seen_everywhere(victim: int, phase: str, kind: str, tmp_path: Any) -> None:
    """Every case of the rotation, and a fault in the gradient all-reduce of a replicated stage
    (each kind, on a plan whose stage 0 runs on ranks 0 and 1)."""
    started = time.monotonic()
    results = run_ranks(_fault_worker, 3, f"{victim}:{STEP}:{phase}:{kind}", str(tmp_path), phase == "allreduce",
                        timeout=90)
    assert time.monotonic() - started < 90
    if kind == "raise" and phase in ("save", "load"):
        for r in results:
            assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
            _check_local_error(r, victim, phase)
        return
    named = f"rank {victim}: PipelineTimeout: rank {victim} is stuck" if kind == "hang" else f"rank {victim}"
    for r in reported_results(results, victim, kind):
        got = r.value
        assert got["steps"] >= STEP, got  # the steps before the faulty one went through
        assert got["error"] is not None, f"rank {r.rank} raised nothing"
        if r.rank == victim and kind == "raise":
            # one error type for an injected fault, fired in the C++ executor or from Python
            assert got["error"] == "InjectedFault", got
            assert "injected fault GRAPHPIPE_FAULT=" in got["message"], got
        else:
            assert got["error"] in ("PeerError", "PipelineTimeout"), (r.rank, got)
            assert f"the pipeline failed on {named}" in got["message"], (r.rank, got["message"])
            if kind == "raise":
                assert "injected fault" in got["message"], got["message"]
            if kind == "hang":
                assert got["error"] == "PipelineTimeout", got
        if r.rank != victim:
            assert got["seconds"] < TIMEOUT + 5.0, (r.rank, got)
        # no rank goes on as if nothing happened
        assert got["after"] is not None and got["after"][0] == "InputError", got["after"]
        assert "stopped after a failure" in got["after"][1] and f"rank {victim}" in got["after"][1], got["after"]
    print(f"\n{victim}:{STEP}:{phase}:{kind}: " + "; ".join(
        f"rank {r.rank} {r.value['error']} after {r.value['seconds']:.2f} s" for r in results if r.ok))


# ---- the switch itself, in one process -------------------------------------------------------


def test_a_malformed_fault_is_an_input_error_naming_it() -> None:
    from graphpipe.errors import InputError
    from graphpipe.runtime.faults import Fault, parse

    assert parse("1:0:forward:hang, 2:3:optimizer:kill") == [Fault(1, 0, "forward", "hang"),
                                                            Fault(2, 3, "optimizer", "kill")]
    assert parse("") == []
    for bad, why in [("1:0:forward", "has 3 fields"), ("x:0:forward:hang", "non-negative integers"),
                     ("1:0:sideways:hang", "unknown phase 'sideways'"), ("1:0:forward:explode", "unknown kind")]:
        with pytest.raises(InputError, match="GRAPHPIPE_FAULT=") as err:
            parse(bad)
        assert why in str(err.value) and repr(bad) in str(err.value), str(err.value)


def test_the_chain_of_waits_leads_to_the_rank_that_waits_on_nobody() -> None:
    from graphpipe.runtime.flight import find_culprit

    def waits(*peers: int) -> dict[str, Any]:
        return {"state": "waiting", "peers": list(peers)}

    running = {"state": "running", "peers": []}
    assert find_culprit({0: waits(1), 1: waits(2), 2: running}, 0) == 2
    assert find_culprit({0: waits(1), 1: running, 2: waits(1)}, 2) == 1
    assert find_culprit({0: waits(1, 2), 1: waits(0, 2), 2: {"state": "idle", "peers": []}}, 0) == 2
    assert find_culprit({0: waits(1), 1: None}, 0) == 1  # published nothing: dead or holding the GIL
    assert find_culprit({0: waits(1), 1: waits(0)}, 0) is None  # a cycle names nobody
