"""A 2 x 2 replicated plan, measured and simulated: does the gradient sum overlap the last
backward, and how close is the simulator's iteration to the measured one?

Four CPU ranks run a two-stage plan (the sequential partitioner's cut) whose stages each have two
replicas (``manual_plan(..., stage_devices={0: [0, 1], 1: [2, 3]})``). The graph is profiled and
the link and the runtime's dispatch cost are calibrated with four ranks at once (calibrate.py, as
compare.py does), then ``graphpipe.simulate`` predicts the iteration. The ranks then train
(``step(record=True)``): per step, the wall time (steps back to back after one barrier, as a
training loop runs them and compare.py times them: each from the previous step's return), and
from the recorded instructions when each replicated stage's all-reduce started and ended against its last
backward. Prints a table and writes results/replica_bench.json.

Four ranks on this 2-core machine share two cores, so real compute runs about twice as slowly as
the single-process profile says. By default the compute is therefore emulated, as in compare.py:
each stage's forward and backward wait the profiled time of a device ``--slowdown`` times slower
than a core (graphpipe.emulation); transfers and the all-reduce stay real (of the real
gradient sizes). The runtime's own costs per instruction and per step are measured with four
ranks at once (graphpipe.calibration.runtime_costs; between emulated waits when the compute is
emulated, as compare.py --emulate does) and go into the device description, which the simulator
reads, as compare.py's does (no per-plan correction). ``--no-emulate`` measures real compute.

    python benchmarks/replica_bench.py [--models dlrm candle_uno] [--steps 8] [--bucket-kib 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_SPECS, LR, Launch, calibrate, calibrated_description, git_commit  # noqa: E402

import graphpipe  # noqa: E402
from graphpipe.models import build_model, default_loss  # noqa: E402
from graphpipe.runtime import manual_plan, stage_assignment  # noqa: E402
from graphpipe.testing import run_ranks  # noqa: E402

WORLD = 4
PLACEMENT = {0: [0, 1], 1: [2, 3]}


def make_plan(spec: str, micro_batches: int, calibration: dict[str, float], slowdown: float) -> tuple[Any, Any, Any]:
    """The 2 x 2 plan of the profiled model, the devices of this machine's ``calibration``
    (compare.calibrate's: the link, the collective link and the runtime's measured costs) slowed
    ``slowdown`` times, and the plan's JSON text."""
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(4, 8, 16, 32, 64), repeats=3, warmup=1)
    # Throughput measured here; every other figure from the calibration (graphpipe.devices(...,
    # measure=True) would measure the runtime's costs again, without the emulated waits).
    devices = calibrated_description(graphpipe.Devices.cpu_rank(WORLD, measure=True), WORLD, slowdown, calibration)
    cut = graphpipe.plan(graph, 2, "sequential", micro_batches=micro_batches)
    assignment = stage_assignment(cut, graph)
    plan = manual_plan(graph, assignment, micro_batches, stage_devices=PLACEMENT, devices=devices)
    return plan, devices, plan.to_json(graph)


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int, bucket_bytes: float,
          emulate: float | None) -> dict[str, Any]:
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, example = build_model(spec)
    name = spec.split(":")[0]
    g = torch.Generator().manual_seed(1)
    inputs = example
    targets = model.example_targets(_batch_size(example), generator=g)
    with graphpipe.wrap(model, example, default_loss(name), plan=plan_json, timeout=120,
                        bucket_bytes=bucket_bytes) as pipe:
        if emulate is not None:
            from graphpipe.emulation import emulate_stage

            emulate_stage(pipe, scale=emulate)  # the plan's (slowed) times, or 0
        opt = torch.optim.SGD(list(pipe.parameters()), lr=LR)
        seconds, traces = [], []
        # No barrier between steps (compare.py's measure_rank says why): each step is timed from
        # the previous one's return, the reading of its recorded instructions left out.
        dist.barrier()
        last = time.perf_counter()
        for k in range(steps + 1):  # the first step warms up
            pipe.step(inputs, targets, optimizer=opt, record=True)
            if k:
                seconds.append(time.perf_counter() - last)
                traces.append(pipe.measured_tasks(gather=False))
            last = time.perf_counter()
        dist.barrier()  # no rank leaves while another still steps
        return {"seconds": seconds, "traces": traces, "stage": pipe.stage,
                "buckets": pipe.gradient_buckets.num_buckets if pipe.gradient_buckets is not None else 0}


def _batch_size(example: Any) -> int:
    from graphpipe.runtime import microbatch

    return microbatch.batch_size(example)


def overlap_figures(tasks: list[dict[str, Any]]) -> dict[str, float] | None:
    """From one rank's recorded step: its last backward and its all-reduce (None without one)."""
    sums = [t for t in tasks if t["kind"] == "all_reduce"]
    backwards = [t for t in tasks if t["kind"] == "backward"]
    if not sums or not backwards:
        return None
    last = max(backwards, key=lambda t: t["end"])
    ar = sums[0]
    return {"backward_start": last["start"], "backward_end": last["end"], "all_reduce_start": ar["start"],
            "all_reduce_end": ar["end"], "started_inside": float(ar["start"] < last["end"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["dlrm", "candle_uno"])
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--bucket-kib", type=float, default=256.0)
    parser.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--slowdown", type=float, default=4.0, help="emulated device, this many times slower than a core")
    parser.add_argument("--out", default="results/replica_bench.json")
    args = parser.parse_args()
    # The runs emulate compute by waits (unless --no-emulate): the runtime's costs are measured
    # between such waits, as compare.py --emulate measures them.
    calibration = calibrate([WORLD], Launch.spawned(), emulated=args.emulate)[WORLD]
    bucket_bytes = args.bucket_kib * 1024
    rows = []
    for name in args.models:
        spec = BENCH_SPECS.get(name, name)
        slowdown = args.slowdown if args.emulate else 1.0
        plan, devices, plan_json = make_plan(spec, args.micro_batches, calibration, slowdown)
        sim = graphpipe.simulate(plan, devices, bucket_bytes=bucket_bytes)

        def measure(scale: float | None) -> tuple[float, list[Any], list[float]]:
            results = run_ranks(_rank, WORLD, spec, plan_json, args.steps, bucket_bytes, scale, timeout=600)  # noqa: B023 (runs within this iteration)
            bad = [r for r in results if not r.ok]
            if bad:
                raise SystemExit(f"{name}: rank {bad[0].rank}: {bad[0].message}\n{bad[0].traceback}")  # noqa: B023 (runs within this iteration)
            # A step ends when its slowest rank does: per step, the longest rank's wall time.
            steps = [max(r.value["seconds"][k] for r in results) for k in range(args.steps)]
            return statistics.median(steps), results, steps

        measured, results, per_step = measure(1.0 if args.emulate else None)
        inside = [f for r in results for trace in r.value["traces"] if (f := overlap_figures(trace))]
        sim_sums = [t for t in sim.tasks if t.kind == "all_reduce"]
        sim_inside = all(any(b.kind == "backward" and b.stage == s.stage and b.micro_batch == args.micro_batches - 1
                             and s.start < b.end for b in sim.tasks) for s in sim_sums)
        row = {
            "model": name, "spec": spec, "placement": PLACEMENT, "micro_batches": plan.num_micro_batches,
            "micro_batch_size": plan.micro_batch_size, "buckets": [r.value["buckets"] for r in results],
            "measured_median_seconds": measured, "measured_steps": per_step,
            "mode": f"emulated, {slowdown:g}x slower than a core" if args.emulate else "measured",
            "simulated_seconds": sim.iteration_seconds, "simulator_error": sim.iteration_seconds / measured - 1.0,
            "measured_all_reduce_inside_last_backward": sum(f["started_inside"] for f in inside) / max(len(inside), 1),
            "simulated_all_reduce_inside_last_backward": sim_inside,
            "simulated_all_reduce_seconds": [s.end - s.start for s in sim_sums],
            "measured_all_reduce_seconds": statistics.median(f["all_reduce_end"] - f["all_reduce_start"] for f in inside)
            if inside else None,
        }
        rows.append(row)
    print(f"{'model':<11} {'mode':<28} {'M x b':>7} {'measured':>10} {'simulated':>10} {'error':>7}  "
          "all-reduce inside last backward (measured share of rank-steps; simulated)")
    for r in rows:
        print(f"{r['model']:<11} {r['mode']:<28} {r['micro_batches']:>3} x {r['micro_batch_size']:<3} "
              f"{1e3 * r['measured_median_seconds']:8.1f}ms {1e3 * r['simulated_seconds']:8.1f}ms "
              f"{100 * r['simulator_error']:+6.1f}%  "
              f"{100 * r['measured_all_reduce_inside_last_backward']:.0f}%; {r['simulated_all_reduce_inside_last_backward']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"commit": git_commit(), "world": WORLD, "calibration": calibration,
                               "bucket_bytes": bucket_bytes, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
