"""The simulated step of one model planned in float32 and in bfloat16 autocast, against the run.

For each precision, side by side in one run: the model is traced and profiled computing in it
(bfloat16: under ``torch.autocast("cpu", dtype=torch.bfloat16)``, so the graph records bfloat16
activations and the profile bfloat16 operator times), planned with ``graphpipe.plan(...,
dtype=)`` on the calibrated CPU ranks (compare.py's description: measured links, runtime costs
and collective link) by ``--partitioner`` with ``--micro-batches`` fixed and one rank a stage,
and simulated; then the real pipeline runs that plan on spawned Gloo ranks
under the same autocast (``with torch.autocast(...): pipe.step(...)``), back to back, in
``--rounds`` interleaved rounds. By default every stage's compute is emulated (a wait of its
profiled time on devices ``--slowdown`` times slower than a core, graphpipe/emulation.py), so the
comparison measures what the precision changes beyond the profile: the bytes every stage edge
carries and the runtime's work around them. ``--no-emulate`` computes for real.

Prints a table (per precision: stages, stage-edge bytes per micro-batch, simulated and measured
step, the simulator's error) and writes results/precision_bench.json.

    python benchmarks/precision_bench.py [--model mmt:branches=2,...] [--world 2] [--no-emulate]
"""

from __future__ import annotations

import argparse
import contextlib
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

import compare  # noqa: E402  (this folder's compare.py: calibration, the rank loop, the description)

import graphpipe  # noqa: E402
from graphpipe.models import build_model  # noqa: E402
from graphpipe.testing import run_ranks  # noqa: E402
from graphpipe.trace import autocast_for  # noqa: E402

#: The 2-branch multi-modal Transformer of compare.py's benchmark size.
DEFAULT_SPEC = "mmt:branches=2,depth=2,seq=32,hidden=128,heads=4,ffn=256,batch=32"


def planned(spec: str, world: int, dtype: str, calibration: dict, slowdown: float, partitioner: str,
            micro_batches: int) -> tuple[Any, Any, Any]:
    """(graph, plan, devices) of ``spec`` computing in ``dtype``: traced and profiled in it, planned
    by ``partitioner`` with ``micro_batches`` (one rank a stage) on the calibrated description."""
    torch.manual_seed(0)  # the model every rank builds (compare.measure_rank's seed)
    model, inputs = build_model(spec)
    with autocast_for(model, dtype):
        graph = graphpipe.trace(model, inputs)
    batch = inputs[0].shape[0]
    graphpipe.profile(graph, model, inputs, batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= batch),
                      repeats=3, warmup=1)
    devices = compare.calibrated_description(graphpipe._C.Devices.cpu_rank(world, measure=True), world, slowdown,
                                             calibration)
    plan = graphpipe.plan(graph, devices, partitioner, micro_batches=micro_batches, replicate=False, dtype=dtype)
    return graph, plan, devices


def measure_in(rank: int, world: int, spec: str, variant: Any, steps: int, emulate: float | None,
               dtype: str) -> dict:
    """compare.measure_rank with every step under ``torch.autocast("cpu", dtype)`` for a 16-bit
    ``dtype`` (wrap then traces, and every step runs, in it)."""
    context = (torch.autocast("cpu", dtype=getattr(torch, dtype)) if dtype in ("bfloat16", "float16")
               else contextlib.nullcontext())
    with context:
        return compare.measure_rank(rank, world, spec, variant, steps, emulate)


def run(spec: str, world: int, variant: Any, dtype: str, steps: int, emulate: float | None) -> list[float]:
    """One round: every rank's step times (seconds, back to back), averaged over the ranks."""
    results = run_ranks(measure_in, world, spec, variant, steps, emulate, dtype, timeout=600)
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"rank {failed[0].rank}: {failed[0].error_type}: {failed[0].message}")
    working = [r for r in results if not r.value.get("idle")] or results
    return [statistics.fmean(r.value["seconds"][i] for r in working) for i in range(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_SPEC, help="a graphpipe.models spec")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--partitioner", default="graphpipe")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--steps", type=int, default=16, help="measured iterations per precision, over all rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3, help="warm-up iterations per round")
    parser.add_argument("--no-emulate", dest="emulate", action="store_false", help="compute for real")
    parser.add_argument("--slowdown", type=float, default=4.0,
                        help="emulated devices are this many times slower than a core (compare.py's default)")
    parser.add_argument("--out", default="results/precision_bench.json")
    args = parser.parse_args()
    started = time.perf_counter()
    slowdown = args.slowdown if args.emulate else 1.0
    calibration = compare.calibrate([args.world], compare.Launch.spawned("cpu"), emulated=args.emulate)[args.world]
    cases = {}
    for dtype in args.dtype:
        graph, plan, devices = planned(args.model, args.world, dtype, calibration, slowdown, args.partitioner,
                                       args.micro_batches)
        sim = graphpipe.simulate(plan, devices)
        cases[dtype] = {"plan": plan, "simulated": sim.iteration_seconds, "seconds": [], "variant": compare.Variant(
            name=dtype, runtime="graphpipe", run=compare.GraphpipeRun(
                plan.to_json(graph), plan.schedule, "graphpipe", compare.optimizer_seconds(sim, plan.num_stages)))}
        print(plan, file=sys.stderr)
    per_round = compare.split_steps(args.steps, args.rounds)
    for index, steps in enumerate(per_round):
        order = args.dtype[index % len(args.dtype):] + args.dtype[:index % len(args.dtype)]  # rotated each round
        for dtype in order:
            seconds = run(args.model, args.world, cases[dtype]["variant"], dtype, args.warmup + steps,
                          1.0 if args.emulate else None)
            cases[dtype]["seconds"].extend(seconds[args.warmup:])
    mode = "emulated" if args.emulate else "measured"
    print(f"\n{args.model} on {args.world} CPU ranks, {mode}; simulated vs run, median of {args.steps} steps")
    print(f"| dtype | stages | micro-batches | stage-edge bytes per micro-batch | simulated ms | {mode} ms | error |")
    print("|" + "---|" * 7)
    rows = []
    for dtype, case in cases.items():
        plan, measured = case["plan"], statistics.median(case["seconds"])
        error = (case["simulated"] - measured) / measured
        edge_bytes = sum(e.bytes for e in plan.edges)
        rows.append({"dtype": dtype, "stages": plan.num_stages, "micro_batches": plan.num_micro_batches,
                     "micro_batch_size": plan.micro_batch_size, "stage_edge_bytes": edge_bytes,
                     "simulated_seconds": case["simulated"], "measured_seconds": measured, "error": error,
                     "seconds": case["seconds"], "plan": json.loads(case["variant"].run.plan_json)})
        print(f"| {dtype} | {plan.num_stages} | {plan.num_micro_batches} x {plan.micro_batch_size} | "
              f"{edge_bytes / 1024:.1f} KiB | {case['simulated'] * 1e3:.2f} | {measured * 1e3:.2f} | {error:+.1%} |")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "precision_bench", "model": args.model, "world": args.world, "mode": mode,
                   "slowdown": slowdown, "calibration": calibration, "commit": compare.git_commit(),
                   "seconds": time.perf_counter() - started, "rows": rows}, f, indent=1)
    print(f"wrote {args.out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
