"""What fault tolerance costs and what it saves: 2 replicas of a 2-stage graph pipeline on 4 CPU
ranks, with and without graphpipe.fault_tolerant (torchft), and a rank's death survived against
a restart from a checkpoint. Everything runs in one invocation, side by side; real compute, real
Gloo, real process deaths (nothing emulated; the simulator only predicts, beside them).

Four jobs, each under ``torchrun`` (and a torchft lighthouse in this process for the
fault-tolerant ones), all on the same model and samples per step:

1. **plain**: one 4-rank job, the sequential cut's 2 stages each replicated on 2 ranks
   (graphpipe's own replicated stages: the gradient all-reduce over a fixed group), Adam;
   steps per second, no faults.
2. **ft**: 2 replicas x 2 ranks of the same cut through ``graphpipe.fault_tolerant``
   (examples/train_fault_tolerant.py: each replica its own torchrun, gradients averaged across
   replicas by torchft, a quorum and a commit vote per step); steps per second, no faults.
3. **ft, killed**: the same, rank 1 of replica 1 SIGKILLed at step ``--kill-at``; the time from
   the failed step's start (the kill fires at its first forward) to the survivors' next committed
   step, and to the replacement's first (healed) committed step.
4. **checkpoint restart**: the plain job under ``torchrun --max-restarts 1``, a DCP checkpoint
   every ``--checkpoint-every`` steps, rank 3 SIGKILLed at step ``--kill-at``: every rank
   restarts and resumes from the last checkpoint; the time from the failed step's start to the
   first step after the resume, and the steps computed again (the failed one included). Its steps per second include the
   checkpoints.

Beside them, the unfaulted fault-tolerant run's step, phase by phase (``StepResult.seconds``:
quorum, pipeline step, cross-replica average, agreement, optimizer), against graphpipe.simulate of
the replica's plan with ``CrossReplica(replicas=2)``, the coordination set to the measured quorum
and agreement: how far the simulator, and so the planner, is from the fault-tolerant step.

The fault-tolerant runs with a kill are paced (``--paced-step-seconds`` of sleep per step) so that
the survivor is still training when the replacement comes back; the recovery times subtract
nothing for it (the sleep after the failed step counts). Prints a table and writes
results/fault_tolerance_bench.json.

    python benchmarks/fault_tolerance_bench.py [--steps 40] [--kill-at 12] [--depth 2] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("RUST_LOG", "warn")  # the in-process lighthouse logs every quorum at info

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def replica_spec(depth: int, batch: int) -> str:
    """One replica's model (MMT, two branches) and batch."""
    return f"mmt:branches=2,depth={depth},batch={batch}"


def job_spec(depth: int, batch: int) -> str:
    """The 4-rank job's model: the same, with both replicas' rows in its batch."""
    return replica_spec(depth, 2 * batch)
MICRO_BATCHES, LR, TIMEOUT = 2, 1e-3, 10.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(args: list[str], nproc: int, log: Path, env: dict[str, str], restarts: int = 0) -> subprocess.Popen:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
               "--max-restarts", str(restarts), "--monitor-interval", "0.2", "--nproc-per-node", str(nproc), *args]
    with open(log, "w", encoding="utf-8") as f:  # the child keeps its own copy
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=log.parent)


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GRAPHPIPE_FAULT"}
    env.update(extra)
    return env


def _wait(jobs: list[subprocess.Popen], logs: list[Path]) -> None:
    try:
        codes = [job.wait(timeout=600) for job in jobs]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    if any(codes):
        tails = "\n".join(f"--- {log}\n{log.read_text()[-3000:]}" for log in logs)
        raise RuntimeError(f"a job failed (exit codes {codes}):\n{tails}")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _steps_per_second(records: list[dict[str, Any]], skip: int = 3) -> float:
    """Steps per second over the committed steps after the first ``skip`` (warm-up), from the
    records' end times."""
    ends = [r["t"] for r in records if r["committed"]][skip:]
    return (len(ends) - 1) / (ends[-1] - ends[0])


def _simulated(out: Path, spec: str, records: list[dict[str, Any]], skip: int = 3) -> dict[str, Any]:
    """Replica 0's step against the simulator: the medians of each phase of rank 0's committed
    steps (``StepResult.seconds``) beside graphpipe.simulate of the replica's plan, plain (the
    pipeline phase) and with ``CrossReplica(replicas=2, coordination_seconds=`` the measured
    quorum and agreement ``)`` (the whole step); on the devices the replica planned with
    (``graphpipe.devices``, uncalibrated) and on the same calibrated with 4 ranks at once, as
    the job ran (graphpipe.calibration: the runtime's costs and Gloo's collective link)."""
    import statistics

    import graphpipe
    from graphpipe.calibration import apply_runtime_costs
    from graphpipe.models import build_model

    steps = [r for r in records if r["committed"]][skip:]
    measured = {phase: statistics.median(r["seconds"][phase] for r in steps)
                for phase in ("quorum", "pipeline", "average", "agreement", "optimizer")}
    measured["step"] = statistics.median(r["t"] - r["t0"] for r in steps)
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.Plan.from_json((out / "replica0_plan.json").read_text(), graph)
    replicas = graphpipe.CrossReplica(replicas=2, coordination_seconds=measured["quorum"] + measured["agreement"])
    result: dict[str, Any] = {"measured": measured}
    for name, devices in (("planned", graphpipe.devices(plan.num_devices)),
                          ("calibrated", apply_runtime_costs(graphpipe.devices(plan.num_devices), concurrency=4))):
        simulated = graphpipe.simulate(plan, devices, cross_replica=replicas)
        average = next(t for t in simulated.tasks if t.kind == "cross_replica" and t.rank == 0)
        step = simulated.iteration_seconds
        result[name] = {"pipeline": average.start,  # the pipeline step ends where the averages start
                        "average": average.end - average.start,
                        "optimizer": sum(t.end - t.start for t in simulated.tasks
                                         if t.kind == "optimizer" and t.rank == 0),
                        "step": step, "step_error": step / measured["step"] - 1.0}
    return result


# ---- the 4-rank job (plain and checkpoint restart), run by torchrun ------------------------------
def _job_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss
    from graphpipe.runtime import faults, manual_plan, stage_assignment

    sys.path.insert(0, str(EXAMPLES))
    from train_fault_tolerant import replica_batch
    from train_torchrun import latest_checkpoint, mark_latest

    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0:
        os.environ.pop(faults.ENV, None)
    rank = graphpipe.init_distributed("gloo", timeout=120.0)
    torch.manual_seed(0)
    spec = job_spec(args.depth, args.batch)
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    cut = graphpipe.plan(graph, 2, "sequential", micro_batches=MICRO_BATCHES, replicate=False)
    assignment = stage_assignment(cut, graph)
    plan = manual_plan(graph, assignment, MICRO_BATCHES, stage_devices={0: [0, 1], 1: [2, 3]})
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan.to_json(graph), timeout=TIMEOUT)
    optimizer = torch.optim.Adam(pipe.parameters(), lr=LR)
    batch, start = inputs[0].shape[0], 0
    folder = args.checkpoint_dir
    resumed = latest_checkpoint(folder) if folder else None
    if resumed is not None:
        start = int(pipe.load(resumed, optimizer=optimizer)["step"])
    dist.barrier()
    with open(Path(args.record_dir) / f"job_rank{rank}.jsonl", "a", encoding="utf-8") as out:
        for step in range(start, args.steps):
            begin = time.time()
            pipe.step(*replica_batch(model, batch, step, 0), optimizer=optimizer)
            if folder and (step + 1) % args.checkpoint_every == 0:
                pipe.save(os.path.join(folder, f"step_{step + 1}"), optimizer=optimizer, extra={"step": step + 1})
                if rank == 0:
                    mark_latest(folder, f"step_{step + 1}")
            out.write(json.dumps({"attempt": attempt, "step": step, "committed": True, "t0": begin,
                                  "t": time.time()}) + "\n")
            out.flush()
    pipe.close()
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver ----------------------------------------------------------------------------------
def _plain(work: Path, steps: int, size: list[str]) -> float:
    out = work / "plain"
    out.mkdir()
    log = out / "torchrun.log"
    _wait([_torchrun([__file__, "--worker", "--steps", str(steps), "--record-dir", str(out), *size], 4, log,
                     _environment())], [log])
    return _steps_per_second(_records(out / "job_rank0.jsonl"))


def _fault_tolerant(work: Path, name: str, spec: str, steps: int, fault: str | None, paced: float) -> dict[str, Any]:
    from torchft._torchft import LighthouseServer

    out = work / name
    out.mkdir()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=10000, heartbeat_timeout_ms=1000)
    logs = [out / f"replica{r}.log" for r in (0, 1)]
    try:
        jobs = [_torchrun([str(EXAMPLES / "train_fault_tolerant.py"), "--replica", str(r), "--replicas", "2",
                           "--model", spec, "--steps", str(steps), "--micro-batches", str(MICRO_BATCHES),
                           "--lr", str(LR), "--timeout", str(TIMEOUT), "--step-seconds", str(paced),
                           "--record-dir", str(out)], 2, logs[r],
                          _environment(TORCHFT_LIGHTHOUSE=lighthouse.address(),
                                       **({"GRAPHPIPE_FAULT": fault} if fault and r == 1 else {})), restarts=2)
                for r in (0, 1)]
        _wait(jobs, logs)
    finally:
        lighthouse.shutdown()
    survivor, replaced = _records(out / "replica0_rank0.jsonl"), _records(out / "replica1_rank0.jsonl")
    result: dict[str, Any] = {"steps_per_second": _steps_per_second(survivor)}
    if not fault:
        result["against_simulator"] = _simulated(out, spec, survivor)
    if fault:
        failed = next(r for r in survivor if not r["committed"])
        redone = next(r for r in survivor if r["committed"] and r["step"] == failed["step"])
        healed = next(r for r in replaced if r["attempt"] > 0)
        result.update(kill_to_survivors_step=redone["t"] - failed["t0"], kill_to_healed_step=healed["t"] - failed["t0"],
                      healed_at_step=healed["step"], failed_step=failed["step"],
                      steps_computed_again=sum(1 for r in survivor if not r["committed"]))
    return result


def _checkpoint_restart(work: Path, steps: int, kill_at: int, every: int, size: list[str]) -> dict[str, Any]:
    out = work / "checkpoint"
    out.mkdir()
    log = out / "torchrun.log"
    _wait([_torchrun([__file__, "--worker", "--steps", str(steps), "--record-dir", str(out), "--checkpoint-dir",
                      str(out / "checkpoints"), "--checkpoint-every", str(every), *size], 4, log,
                     _environment(GRAPHPIPE_FAULT=f"3:{kill_at}:forward:kill"), restarts=1)], [log])
    records = _records(out / "job_rank0.jsonl")
    first = [r for r in records if r["attempt"] == 0]
    failed_start = first[-1]["t"]  # the killed step starts when rank 0's previous one ends
    resumed = next(r for r in records if r["attempt"] > 0)
    return {"steps_per_second": _steps_per_second(first), "kill_to_resumed_step": resumed["t"] - failed_start,
            "resumed_at_step": resumed["step"], "failed_step": kill_at,
            "steps_computed_again": kill_at - resumed["step"] + 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--kill-at", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--paced-step-seconds", type=float, default=0.2)
    parser.add_argument("--depth", type=int, default=2, help="MMT's depth (the step's compute)")
    parser.add_argument("--batch", type=int, default=32, help="one replica's batch")
    parser.add_argument("--out", default="results/fault_tolerance_bench.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--record-dir", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _job_worker(args)
        return
    import tempfile

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="graphpipe-ft-bench-") as tmp:
        work = Path(tmp)
        size = ["--depth", str(args.depth), "--batch", str(args.batch)]
        spec = replica_spec(args.depth, args.batch)
        plain = _plain(work, args.steps, size)
        ft = _fault_tolerant(work, "ft", spec, args.steps, None, 0.0)
        killed = _fault_tolerant(work, "ft_killed", spec, args.steps, f"1:{args.kill_at}:forward:kill",
                                 args.paced_step_seconds)
        restart = _checkpoint_restart(work, args.steps, args.kill_at, args.checkpoint_every, size)
    rows = [
        ("plain (replicated stages, no FT)", f"{plain:.1f}", "-", "-", "-"),
        ("graphpipe.fault_tolerant", f"{ft['steps_per_second']:.1f} ({ft['steps_per_second'] / plain:.2f}x, "
         f"{1e3 / ft['steps_per_second'] - 1e3 / plain:+.1f} ms/step)",
         f"{killed['kill_to_survivors_step']:.2f} s", f"{killed['kill_to_healed_step']:.2f} s (step "
         f"{killed['healed_at_step']})", str(killed["steps_computed_again"])),
        (f"checkpoint restart (every {args.checkpoint_every})",
         f"{restart['steps_per_second']:.1f} ({restart['steps_per_second'] / plain:.2f}x)",
         f"{restart['kill_to_resumed_step']:.2f} s", f"{restart['kill_to_resumed_step']:.2f} s",
         str(restart["steps_computed_again"])),
    ]
    head = ("job", "steps/s, no faults", "kill -> next step", "kill -> replaced rank trains", "steps computed again")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print(f"(model {spec} per replica, Adam, {MICRO_BATCHES} micro-batches, 2 x 2 CPU ranks; "
          f"kill at step {args.kill_at}; {time.monotonic() - started:.0f} s)")
    against = ft["against_simulator"]
    print("\nfault-tolerant step of replica 0, rank 0 (medians, ms) against graphpipe.simulate (coordination: "
          "the measured quorum + agreement), on the devices as planned and calibrated:")
    for phase in ("quorum", "pipeline", "average", "agreement", "optimizer", "step"):
        guesses = [against[name].get(phase) for name in ("planned", "calibrated")]
        print(f"  {phase:<10} measured {1e3 * against['measured'][phase]:8.2f}   simulated "
              + "  ".join(f"{1e3 * g:8.2f}" if g is not None else "       -" for g in guesses))
    print(f"  simulated step {100 * against['planned']['step_error']:+.1f}% (as planned), "
          f"{100 * against['calibrated']['step_error']:+.1f}% (calibrated) off the measured one")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"plain_steps_per_second": plain, "fault_tolerant": ft, "killed": killed,
                                          "checkpoint_restart": restart, "steps": args.steps,
                                          "kill_at": args.kill_at, "model": spec}, indent=2))


if __name__ == "__main__":
    main()
