"""Ranks bound to a core each against ranks the scheduler places: compare.py's V row on 2 real CPU
ranks, the same ranks taking turns, every other pair of steps bound.

    python benchmarks/cpu_binding_bench.py [--models transformer mmt] [--steps 36]
        [--out results/cpu_binding_bench.json]

For each model (compare.py's BENCH_SPECS), the "graphpipe/V zb" plan as sim_gap_bench.py makes it
(profiled and calibrated here, the calibration's ranks unbound), run on 2 spawned ranks (Gloo,
one torch thread each, SGD): steps alternate in pairs between every thread of rank r bound to
CPU r (graphpipe.local_ranks.bind_to_cpus, which run_ranks(bind_cpus=True) does before the
process group starts) and every thread free on all CPUs, after 4 warm-up steps, so that the
machine's drift hits both alike. Prints the median step of each, their ratio, and the simulated
step beside them; writes JSON. Nothing is emulated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare  # noqa: E402  this folder's compare.py: the calibration
import sim_gap_bench  # noqa: E402  the V row's plan, as sim_gap_bench.py makes it

WARMUP = 4
WORLD = 2


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int) -> dict[str, list[float]]:
    """One rank: ``steps`` timed steps after WARMUP, in pairs bound to this rank's CPU and free."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.local_ranks import bind_to_cpus, rank_cpus
    from graphpipe.models import build_model, default_loss

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0])
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, skip_nonfinite=False)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=compare.LR)
    mine = {rank_cpus(world)[rank]}
    every = set(os.sched_getaffinity(0))
    seconds: dict[str, list[float]] = {"bound": [], "free": []}
    for i in range(WARMUP + steps):
        mode = ("bound", "free")[(i // 2) % 2]
        bind_to_cpus(mine if mode == "bound" else every)
        dist.barrier()
        start = time.perf_counter()
        pipe.step(inputs, targets, optimizer=optimizer)
        if i >= WARMUP:
            seconds[mode].append(time.perf_counter() - start)
    pipe.close()
    return seconds


def measure(name: str, steps: int, calibration: dict[str, float]) -> dict[str, Any]:
    """The model's V plan, simulated, and its steps bound and free, with their medians."""
    import graphpipe
    from graphpipe.local_ranks import expect_ok, run_ranks

    row = sim_gap_bench.v_row(name, WORLD, calibration)
    if row.reason:
        return {"model": name, "unavailable": row.reason}
    simulated = graphpipe.simulate(row.plan, row.devices, "zb_graph", optimizer=compare.RUN_OPTIMIZER).iteration_seconds
    ranks = expect_ok(run_ranks(_rank, WORLD, row.spec, row.plan_json, steps, timeout=1800))
    seconds = ranks[0].value  # rank 0's steps: every step ends with the ranks' closing loss sum
    bound, free = statistics.median(seconds["bound"]), statistics.median(seconds["free"])
    return {"model": name, "spec": row.spec, "micro_batches": row.plan.num_micro_batches,
            "simulated_seconds": simulated, "bound_seconds": bound, "free_seconds": free,
            "free_over_bound": free / bound, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(compare.BENCH_SPECS))
    parser.add_argument("--steps", type=int, default=36, help="timed steps, half of them bound (after 4 warm-up)")
    parser.add_argument("--out", default="results/cpu_binding_bench.json")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4: two pairs, one bound and one free")
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < WORLD:
        parser.error(f"needs os.sched_setaffinity and {WORLD} CPUs")
    torch.set_num_threads(1)
    calibration = compare.calibrate([WORLD], compare.Launch.spawned())[WORLD]
    rows = []
    print("| model | micro-batches | bound ms | free ms | free / bound | simulated ms | simulator vs bound | vs free |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models:
        row = measure(name, args.steps, calibration)
        rows.append(row)
        if "unavailable" in row:
            print(f"| {name} | not run: {row['unavailable']} |")
            continue
        sim, bound, free = row["simulated_seconds"], row["bound_seconds"], row["free_seconds"]
        print(f"| {name} | {row['micro_batches']} | {bound * 1e3:.1f} | {free * 1e3:.1f} | {free / bound:.3f} | "
              f"{sim * 1e3:.1f} | {(sim / bound - 1) * 100:+.1f}% | {(sim / free - 1) * 100:+.1f}% |", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "cpu_binding", "commit": compare.git_commit(), "world": WORLD,
                               "steps": args.steps, "calibration": calibration, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
