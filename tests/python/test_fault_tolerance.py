"""A lost replica costs a step, not the job (graphpipe.fault_tolerance on torchft).

Two replicas of a 2-stage graph pipeline (MMT with two branches, 2 ranks each, Adam, float64),
one ``torchrun --max-restarts`` per replica and a torchft lighthouse in this process, run
examples/train_fault_tolerant.py for 10 steps, paced at 1.5 s per step, and on until two steps in
a row had every replica in (``--until-full``: a replacement takes its import, trace and plan to
start, 8-20 s on a loaded 2-core machine, which can outlast the 10 steps; at most MAX_STEPS).
At step 3 one rank of replica 1 is SIGKILLed,
hangs past the timeout, or raises in its forward (``GRAPHPIPE_FAULT``, first attempt only). Then:

- replica 0 never raises: one attempt, every step committed once, only step 3 redone;
- replica 1's replacement joins, healed from replica 0, and from then on
  every rank's parameters, buffers and optimizer state equal replica 0's bit for bit (a digest
  after every step, and the final states), and both replicas report the same losses;
- nothing wrote or read a checkpoint;
- the step of the failure is accounted for: replica 0's final parameters equal single-process
  training in which each step averages the full-batch gradients of the replicas that took part
  in it (replica 0 alone for the redone step and until the replacement joined).

And when the last replica is lost, its restart refuses to train from scratch
(``NoReplicaToHealFrom``, naming the checkpoint to resume from); and with three replicas, two
lost in the same step cost that step too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from test_example_torchrun import free_port

os.environ.setdefault("RUST_LOG", "warn")  # the in-process lighthouse logs every quorum at info
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="torchft is not installed")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_fault_tolerant.py"
SPEC = "mmt:branches=2,depth=1"
STEPS, FAULT_STEP, LR, TIMEOUT = 10, 3, 1e-3, 5.0
# The replicas train STEPS steps, and on until FULL_STEPS in a row had every replica in, at most
# MAX_STEPS: the step a replacement joins at is its torchrun's restart, import, trace, plan and
# quorum against steps paced at STEP_SECONDS, which a loaded machine stretches past STEPS.
FULL_STEPS, MAX_STEPS, STEP_SECONDS = 2, 40, 1.5


def _torchrun(replica: int, replicas: int, out: Path, env: dict[str, str], restarts: int = 2,
              extra: tuple[str, ...] = ()) -> subprocess.Popen:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
               "--max-restarts", str(restarts), "--monitor-interval", "0.2", "--nproc-per-node", "2",
               str(EXAMPLE), "--replica", str(replica), "--replicas", str(replicas), "--model", SPEC,
               "--steps", str(STEPS), "--lr", str(LR), "--timeout", str(TIMEOUT), "--float64",
               "--step-seconds", str(STEP_SECONDS), "--until-full", str(FULL_STEPS), "--max-steps", str(MAX_STEPS),
               "--record-dir", str(out), "--digest", *extra]
    with open(out / f"replica{replica}.log", "w", encoding="utf-8") as log:  # the child keeps its own copy
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out)


def _environment(lighthouse: str, fault: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRAPHPIPE_FAULT"}
    env["TORCHFT_LIGHTHOUSE"] = lighthouse
    if fault:
        env["GRAPHPIPE_FAULT"] = fault
    return env


def _records(out: Path, replica: int) -> dict[int, list[dict[str, Any]]]:
    return {rank: [json.loads(line) for line in (out / f"replica{replica}_rank{rank}.jsonl").read_text().splitlines()]
            for rank in (0, 1)}


def _cause(log: str, limit: int = 6000) -> str:
    """What a failed replica's log says of its cause: from its first traceback on (torchrun's
    footer, which a log's tail holds, names none), else its tail; at most ``limit`` characters."""
    first = log.find("Traceback (most recent call last)")
    return log[first:first + limit] if first >= 0 else log[-limit:]


def _run_job(out: Path, faults: dict[int, str], replicas: int = 2,
             extra: tuple[str, ...] = ()) -> tuple[list[dict[int, Any]], float]:
    """Runs the replicas, ``faults[r]`` on replica r; each replica's per-step records (by rank)
    and the wall time."""
    from torchft._torchft import LighthouseServer

    out.mkdir(parents=True, exist_ok=True)
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=10000, heartbeat_timeout_ms=1000)
    start = time.monotonic()
    jobs: list[subprocess.Popen] = []
    try:
        jobs = [_torchrun(r, replicas, out, _environment(lighthouse.address(), faults.get(r)), extra=extra)
                for r in range(replicas)]
        codes = [job.wait(timeout=300) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
        lighthouse.shutdown()
    seconds = time.monotonic() - start
    if codes != [0] * replicas:  # in full: pytest shortens an assertion's message
        for r in range(replicas):
            print(f"--- replica {r}, exit {codes[r]}:\n{_cause((out / f'replica{r}.log').read_text())}")
    assert codes == [0] * replicas
    return [_records(out, r) for r in range(replicas)], seconds


def _check_replaced(survivor: list[dict[str, Any]], replaced: list[dict[str, Any]]) -> int:
    """A replica that lost a rank at FAULT_STEP: its replacement healed at its first step, and
    from then on holds the survivor's state after every step and reports its loss, to the
    survivor's last step. Returns the step it joined at."""
    before = [r for r in replaced if r["attempt"] == 0]
    after = [r for r in replaced if r["attempt"] > 0]
    assert [r["step"] for r in before if r["committed"]] == list(range(FAULT_STEP)), before
    assert after and after[0]["healed"], after[:2]
    joined = after[0]["step"]
    assert FAULT_STEP < joined < MAX_STEPS, joined
    by_step = {r["step"]: r for r in survivor if r["committed"]}
    for r in after:
        assert r["committed"], r
        assert r["digest"] == by_step[r["step"]]["digest"], r["step"]
        assert r["loss"] == by_step[r["step"]]["loss"], r["step"]
    assert [r["step"] for r in after] == list(range(joined, max(by_step) + 1)), [r["step"] for r in after]
    return joined


def _check_survivor(survivor: list[dict[str, Any]]) -> None:
    """A replica that never failed: one attempt (it never raised), every step committed once
    (STEPS, or more while a replacement was starting), only the step of the failure redone."""
    assert {r["attempt"] for r in survivor} == {0}
    committed = [r["step"] for r in survivor if r["committed"]]
    assert committed == list(range(max(STEPS, len(committed)))), committed
    assert [r["step"] for r in survivor if not r["committed"]] == [FAULT_STEP]
    for r in survivor:  # StepResult.seconds: phases of the step, within its wall-clock time
        phases = r["seconds"]
        assert min(phases.values()) >= 0.0 and phases["pipeline"] > 0.0, phases
        assert sum(phases.values()) <= r["t"] - r["t0"] + 1e-3, (phases, r["t"] - r["t0"])


def _check_equal_states(out: Path, replicas: int) -> None:
    """Every replica's final parameters, buffers and optimizer state equal replica 0's, bit for bit."""
    for rank in (0, 1):
        a = torch.load(out / f"replica0_rank{rank}.pt", weights_only=True)
        for replica in range(1, replicas):
            b = torch.load(out / f"replica{replica}_rank{rank}.pt", weights_only=True)
            for key, value in a["module"].items():
                assert torch.equal(value, b["module"][key]), (replica, rank, key)
            for index, entry in a["optimizer"]["state"].items():
                for name, value in entry.items():
                    assert torch.equal(value, b["optimizer"]["state"][index][name]), (replica, rank, index, name)
    assert not list(out.rglob("*.distcp")) and not list(out.rglob(".metadata"))  # no checkpoint anywhere


def _reference(participants: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Single-process Adam in float64: at each committed step, the mean over the replicas that
    took part of their full-batch losses (replica 0 alone, or 0 and 1)."""
    sys.path.insert(0, str(EXAMPLE.parent))
    from train_fault_tolerant import replica_batch

    from graphpipe.models import build_model, default_loss

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model, inputs = build_model(SPEC)
        loss_fn = default_loss(SPEC)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        batch = inputs[0].shape[0]
        for step, count in participants:
            optimizer.zero_grad()
            losses = [loss_fn(model(*x), y) for x, y in (replica_batch(model, batch, step, r) for r in range(count))]
            (torch.stack(losses).sum() / count).backward()
            optimizer.step()
        return {k: v.detach().clone() for k, v in model.state_dict().items()}
    finally:
        torch.set_default_dtype(dtype)


@pytest.mark.parametrize("kind", ["kill", "hang", "raise"])
def test_a_lost_replica_costs_a_step_not_the_job(tmp_path: Path, kind: str) -> None:
    out = tmp_path / kind
    (first, second), seconds = _run_job(out, {1: f"1:{FAULT_STEP}:forward:{kind}"})
    for rank in (0, 1):
        _check_survivor(first[rank])
        joined = _check_replaced(first[rank], second[rank])
        assert all(r["participants"] == 2 for r in second[rank] if r["attempt"] > 0)
    _check_equal_states(out, 2)
    # The failed step trained on the survivor's samples only, as did the steps until the join.
    participants = [(r["step"], r["participants"]) for r in first[0] if r["committed"]]
    assert [p for _, p in participants] == [2] * FAULT_STEP + [1] * (joined - FAULT_STEP) + [2] * (len(participants) - joined)
    got = torch.load(out / "replica0_model.pt", weights_only=True)
    for key, value in _reference(participants).items():
        torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-11, msg=key)
    failed = next(r for r in first[0] if not r["committed"])
    redone = next(r for r in first[0] if r["step"] == FAULT_STEP and r["committed"])
    print(f"\n{kind}: failed step's start -> survivors' redo committed {redone['t'] - failed['t0']:.2f} s; "
          f"replacement healed at step {joined}; whole job {seconds:.1f} s")


def test_two_replicas_lost_at_once(tmp_path: Path) -> None:
    """Three replicas; a rank of replicas 1 and 2 killed in the same step: replica 0 goes on
    alone, both replacements heal from it, and all three end equal."""
    fault = f"1:{FAULT_STEP}:forward:kill"
    (first, *others), _ = _run_job(tmp_path, {1: fault, 2: fault}, replicas=3)
    for rank in (0, 1):
        _check_survivor(first[rank])
        for replaced in others:
            _check_replaced(first[rank], replaced[rank])
        counts = [r["participants"] for r in first[rank] if r["committed"]]
        assert counts[:FAULT_STEP] == [3] * FAULT_STEP and counts[FAULT_STEP] == 1 and counts[-1] == 3, counts
    _check_equal_states(tmp_path, 3)


def test_a_nan_in_one_replica_skips_the_step_on_every_replica(tmp_path: Path) -> None:
    """A NaN sample in replica 1's batch of step 3: the averaged gradients are NaN on every
    replica, so every rank of both skips its optimizer step (and the forward's buffer updates);
    the states stay as after step 2 and equal, and training goes on."""
    (first, second), _ = _run_job(tmp_path, {}, extra=("--nan-at", str(FAULT_STEP), "--step-seconds", "0"))
    for rank in (0, 1):
        for records in (first[rank], second[rank]):
            assert [r["step"] for r in records if r["committed"]] == list(range(STEPS))
            assert [r["step"] for r in records if r["skipped"]] == [FAULT_STEP]
            digests = {r["step"]: r["digest"] for r in records}
            assert digests[FAULT_STEP] == digests[FAULT_STEP - 1] != digests[FAULT_STEP + 1]
        assert [r["digest"] for r in first[rank]] == [r["digest"] for r in second[rank]]
    _check_equal_states(tmp_path, 2)


def test_the_last_replica_lost_refuses_to_start_over(tmp_path: Path) -> None:
    """One replica whose rank is killed: its restart finds no live replica to heal from and
    raises instead of training from the initial parameters."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=1000)
    try:
        job = _torchrun(0, 1, tmp_path, _environment(lighthouse.address(), f"1:{FAULT_STEP}:forward:kill"), restarts=1)
        code = job.wait(timeout=300)
    finally:
        lighthouse.shutdown()
    log = (tmp_path / "replica0.log").read_text()
    assert code != 0
    assert "NoReplicaToHealFrom" in log and "every replica was lost" in log, log[-4000:]
    assert "resume from the last checkpoint" in log


def _refused_sync(rank: int, world: int) -> str:
    from graphpipe import sync, wrap
    from graphpipe.fault_tolerance import FaultTolerantPipeline
    from graphpipe.models import build_model, default_loss

    model, inputs = build_model(SPEC)
    with wrap(model, inputs, default_loss(SPEC), sync=sync.LocalSGD(period=2), partitioner="sequential") as pipe:
        try:
            FaultTolerantPipeline(pipe, None, 0, "http://127.0.0.1:1")
        except Exception as exc:  # the test asserts its type and message
            return f"{type(exc).__name__}: {exc}"
    return "accepted"


def test_bad_input_is_refused_with_a_named_cause() -> None:
    from graphpipe import InputError
    from graphpipe.fault_tolerance import fault_tolerant
    from graphpipe.models import build_model, default_loss
    from graphpipe.testing import run_ranks

    env = os.environ.pop("TORCHFT_LIGHTHOUSE", None)
    try:
        model, inputs = build_model(SPEC)
        with pytest.raises(InputError, match="no lighthouse address"):
            fault_tolerant(model, inputs, default_loss(SPEC), None, replica=0)
    finally:
        if env is not None:
            os.environ["TORCHFT_LIGHTHOUSE"] = env
    [result] = run_ranks(_refused_sync, 1)
    assert result.ok, result.traceback
    assert result.value.startswith("InputError") and "local SGD H=2" in result.value, result.value
    assert "sync='allreduce'" in result.value


class _Work:
    def wait(self) -> bool:
        return True


class _TwoReplicaManager:
    """Stands in for torchft's Manager in ``_average``: its all-reduce averages each tensor with
    the other replica's tensor of the same call (``peer``), or, without a peer, records it."""

    def __init__(self, peer: list[torch.Tensor] | None = None) -> None:
        self.peer, self.seen = peer, []

    def allreduce(self, tensor: torch.Tensor) -> _Work:
        self.seen.append(tensor.clone())
        if self.peer is not None:
            tensor.add_(self.peer[len(self.seen) - 1]).div_(2)
        return _Work()


def _replica_with_batchnorm(seed: int) -> tuple[Any, torch.nn.Module, torch.Tensor]:
    """What ``_average`` reads of a FaultTolerantPipeline, on a model with BatchNorm after one
    forward and backward on this replica's batch (its own gradients and running statistics)."""
    from graphpipe.fault_tolerance import FaultTolerantPipeline

    torch.manual_seed(0)  # the replicas' parameters are equal; their batches are not
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 1))
    generator = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(8, 4, generator=generator)).pow(2).mean()
    loss.backward()
    ft = object.__new__(FaultTolerantPipeline)
    ft._params = list(model.parameters())
    ft._buffers = [b for b in model.buffers() if b.is_floating_point()]
    return ft, model, loss


def test_gradients_buffers_and_loss_are_averaged_across_replicas() -> None:
    """The bookkeeping around torchft's all-reduce (flatten, average, copy back) on a model with
    BatchNorm: after ``_average`` every gradient, running statistic and the loss is the two
    replicas' mean; the integer batch counter is left alone."""
    first, first_model, first_loss = _replica_with_batchnorm(1)
    second, second_model, second_loss = _replica_with_batchnorm(2)
    expected_grads = [(a.grad + b.grad) / 2 for a, b in zip(first_model.parameters(), second_model.parameters())]
    expected_buffers = {name: (a + b) / 2 for (name, a), (_, b) in
                        zip(first_model.named_buffers(), second_model.named_buffers()) if a.is_floating_point()}
    assert any(not torch.equal(a, b) for a, b in zip(first_model.buffers(), second_model.buffers()))
    second.manager = _TwoReplicaManager()
    second._average(second_loss)  # records what the second replica hands over
    first.manager = _TwoReplicaManager(peer=second.manager.seen)
    ok, loss = first._average(first_loss)
    assert ok
    assert loss == pytest.approx((first_loss.item() + second_loss.item()) / 2, rel=1e-6)
    for p, g in zip(first_model.parameters(), expected_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-6, atol=1e-7)
    for name, value in first_model.named_buffers():
        if name in expected_buffers:
            torch.testing.assert_close(value, expected_buffers[name], rtol=1e-6, atol=1e-7, msg=name)
    assert first_model[1].num_batches_tracked.item() == 1
