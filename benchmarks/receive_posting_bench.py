"""Every receive of a step posted at its start against each posted one ahead: compare.py's V row
on 2 real CPU ranks, the same ranks taking turns, every other pair of steps posting the whole
step's receives at once.

    python benchmarks/receive_posting_bench.py [--models transformer mmt] [--steps 36]
        [--out results/receive_posting_bench.json]

Gloo's send is a rendezvous: where the receive's notice has not yet reached the sender when the
send is posted, the data leaves only once the sender's communication thread reads that notice,
and on a rank that computes that thread may wait milliseconds for its CPU
(runtime/executor.h, ReceivePosting). For each model (compare.py's BENCH_SPECS), the "graphpipe/V
zb" plan as sim_gap_bench.py makes it (profiled and calibrated here), run on 2 spawned ranks
(Gloo, one torch thread each, SGD, each rank bound to a CPU where the machine has 2:
compare.Launch), steps alternating in pairs between ReceivePosting.one_ahead and whole_step (the
default for CPU stages over Gloo) after 4 warm-up steps, so that the machine's drift hits both
alike. Prints each mode's median step, their ratio, the simulated step, and, from the executors'
flight recorders (the last 16 steps), how many of the waits for another rank's output landed
over 1 ms later than the simulated transfer allows (sim_gap_bench.py's analysis); writes JSON.
Nothing is emulated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  this folder's compare.py: the calibration
import sim_gap_bench  # noqa: E402  the V row's plan and the analysis of flight records

WARMUP = 4
WORLD = 2
MODES = ("one_ahead", "whole_step")
ANALYSED = 16  # the last steps whose flight records are analysed
LATE = 1e-3


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int) -> dict[str, Any]:
    """One rank: ``steps`` timed steps after WARMUP, in pairs posting one ahead and the whole
    step; each step's mode, time and span on the recorder's clock, and the flight records."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe._ext import _C
    from graphpipe.models import build_model, default_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.environ["GRAPHPIPE_FLIGHT_RECORDER_SIZE"] = str(sim_gap_bench.RECORDER_SIZE)
    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0])
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, skip_nonfinite=False)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=compare.LR)
    modes, seconds, spans = [], [], []
    for i in range(WARMUP + steps):
        mode = MODES[(i // 2) % 2]
        pipe.executor.set_receive_posting(getattr(_C.ReceivePosting, mode))
        dist.barrier()
        start, wall = time.perf_counter(), time.time()
        pipe.step(inputs, targets, optimizer=optimizer)
        modes.append(mode)
        seconds.append(time.perf_counter() - start)
        spans.append((wall, time.time()))
    records = pipe.executor.flight_recorder.records()
    pipe.close()
    # One executor run per step, numbered in order: the last run is the last step.
    last = max(Counter(r["run"] for r in records))
    run_of = {i: last - (len(modes) - 1 - i) for i in range(len(modes))}
    analysed = range(len(modes) - ANALYSED, len(modes))
    return {"modes": modes[WARMUP:], "seconds": seconds[WARMUP:],
            "runs": {run_of[i]: modes[i] for i in analysed},
            "steps": {run_of[i]: spans[i] for i in analysed},
            "records": [{k: r[k] for k in ("run", "kind", "stage", "micro_batch", "start", "end")}
                        for r in records if r["run"] in {run_of[i] for i in analysed}]}


def late_waits(plan: Any, sim: Any, ranks: list[dict[str, Any]],
               short_gap: float = sim_gap_bench.SHORT_GAP) -> dict[str, dict[str, float]]:
    """Per mode, over its analysed steps: the waits for another rank's output, those landing over
    LATE later than the simulated transfer allows, and their lateness per step (``short_gap``:
    sim_gap_bench.analyse's)."""
    edges = [(e.src, e.dst) for e in plan.edges]
    rank_of = {s.id: int(s.devices[0]) for s in plan.stages}
    simulated = sim_gap_bench._simulated(sim, edges)
    out = {mode: {"steps": 0, "waits": 0, "late": 0, "late_seconds_per_step": 0.0} for mode in MODES}
    for run, mode in ranks[0]["runs"].items():
        step = sim_gap_bench._one_step(run, ranks, edges, rank_of, simulated["transfers"], simulated["transfer"],
                                       short_gap)
        late = [w["late_seconds"] for w in step["waits"] if w["late_seconds"] > LATE]
        out[mode]["steps"] += 1
        out[mode]["waits"] += len(step["waits"])
        out[mode]["late"] += len(late)
        out[mode]["late_seconds_per_step"] += sum(late)
    for figures in out.values():
        figures["late_seconds_per_step"] /= max(1, figures["steps"])
    return out


def measure(name: str, steps: int, calibration: dict[str, float], launch: compare.Launch) -> dict[str, Any]:
    """The model's V plan, simulated, and its steps in each mode, with their medians."""
    import graphpipe
    from graphpipe.local_ranks import expect_ok, run_ranks

    row = sim_gap_bench.v_row(name, WORLD, calibration)
    if row.reason:
        return {"model": name, "unavailable": row.reason}
    sim = graphpipe.simulate(row.plan, row.devices, "zb_graph", optimizer=compare.RUN_OPTIMIZER)
    ranks = expect_ok(run_ranks(_rank, WORLD, row.spec, row.plan_json, steps, timeout=1800,
                                bind_cpus=launch.binds(WORLD)))
    values = [r.value for r in ranks]
    # Rank 0's steps: every step ends with the ranks' closing loss sum.
    median = {mode: statistics.median(s for m, s in zip(values[0]["modes"], values[0]["seconds"]) if m == mode)
              for mode in MODES}
    return {"model": name, "spec": row.spec, "micro_batches": row.plan.num_micro_batches,
            "simulated_seconds": sim.iteration_seconds, "median_seconds": median,
            "one_ahead_over_whole_step": median["one_ahead"] / median["whole_step"],
            "late_waits": late_waits(row.plan, sim, values),
            "seconds": {"modes": values[0]["modes"], "seconds": values[0]["seconds"]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(compare.BENCH_SPECS))
    parser.add_argument("--steps", type=int, default=36, help=f"timed steps, half in each mode (after {WARMUP} warm-up)")
    parser.add_argument("--out", default="results/receive_posting_bench.json")
    args = parser.parse_args()
    if args.steps < ANALYSED:
        parser.error(f"--steps must be at least {ANALYSED}: the steps whose flight records are analysed")
    torch.set_num_threads(1)
    launch = compare.Launch.spawned(bind_cpus=True)
    calibration = compare.calibrate([WORLD], launch)[WORLD]
    rows = []
    print("| model | micro-batches | one ahead ms | whole step ms | one ahead / whole step | simulated ms | "
          "late waits, one ahead | late waits, whole step |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        row = measure(name, args.steps, calibration, launch)
        rows.append(row)
        if "unavailable" in row:
            print(f"| {name} | not run: {row['unavailable']} |")
            continue
        med, late = row["median_seconds"], row["late_waits"]
        cells = [f"{late[m]['late']} of {late[m]['waits']} ({late[m]['late_seconds_per_step'] * 1e3:.1f} ms a step)"
                 for m in MODES]
        print(f"| {name} | {row['micro_batches']} | {med['one_ahead'] * 1e3:.1f} | {med['whole_step'] * 1e3:.1f} | "
              f"{row['one_ahead_over_whole_step']:.3f} | {row['simulated_seconds'] * 1e3:.1f} | {cells[0]} | "
              f"{cells[1]} |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "receive_posting", "commit": compare.git_commit(), "world": WORLD,
                               "steps": args.steps, "bind_cpus": launch.binds(WORLD), "calibration": calibration,
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
