"""Runtime benchmark (not a test): samples per second of the graphpipe plan and of the sequential
plan on CPU ranks over Gloo, for MMT, DLRM and CANDLE-Uno, their ratio, and the measured vs the
simulated iteration time.

    python benchmarks/runtime_bench.py [--world 2] [--models mmt,dlrm,candle_uno] [--steps 6]

Each (model, partitioner) runs in a fresh set of spawned ranks (torch.set_num_threads(1) each):
the plan is made once in this process (devices: measured CPU ranks), handed to every rank, and
``warmup`` + ``steps`` iterations are timed (a barrier before each; the median is reported). The
simulated time is graphpipe's simulator on the same plan and 1F1B schedule with the operators
profiled on this machine. The "check us" column is the cost of the per-step batch check that
every rank runs before anything is posted (graphpipe.runtime.batch_check: inputs against the
traced example, targets against the first step's), timed in this process over 2000 calls; "check
%" puts it beside the measured iteration. Results go to results/runtime_bench.json.

Old against new, side by side in one run:

    python benchmarks/runtime_bench.py --against OLD [--rounds 3] [--measure train,zero,dispatch]

OLD is another build of graphpipe: a directory holding one (e.g. made with ``pip install
--no-build-isolation --no-deps --target DIR <checkout>``), or a git ref (``HEAD~1``, a commit),
which is then built once into results/against/<commit> (a full compile: many minutes on a small
machine). Every measurement is taken by both builds, alternating (old, new; then new, old; ...)
over ``--rounds`` rounds, each in fresh ranks started by a subprocess whose PYTHONPATH puts OLD
first (old) or not (new), with the same plan JSON text and the same timing loop (only API both
builds share: ``wrap`` with ``plan=``, ``step``, the optimizer stepped after it; the emulation
imported from where each build has it). ``--measure`` picks what is timed:

- ``train``: the iteration of every (model, plan) on ``--world`` ranks, real compute;
- ``zero``: the same iteration with every stage emulated at zero seconds (graphpipe's
  emulate_stage): the runtime's own cost of the schedule (dispatch, transfers, the step's
  set-up and closing loss sum), what compare.py's zero-compute calibration measures;
- ``dispatch``: the runtime's cost per forward or backward instruction, measured as
  graphpipe.calibration.runtime_costs does: ``--world`` one-rank pipelines at once (CANDLE-Uno
  at batch 16, 8 micro-batches, zero compute), median step / (2 x 8).

The table gives each build's median and old / new (above 1: the new build is faster). Results go
to results/runtime_bench_against.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch
from against import old_build


def _batch_check_seconds(model: Any, inputs: tuple, targets: Any, calls: int = 2000) -> float:
    """Seconds one step's batch check takes (inputs and targets), median of 5 rounds."""
    import inspect

    from graphpipe.runtime.batch_check import BatchCheck

    names = list(inspect.signature(model.forward).parameters)
    values = {names[0]: tuple(inputs)} if len(names) == 1 else dict(zip(names, inputs))
    check = BatchCheck(type(model).__name__, values)
    check.check_targets(targets)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            check.check_inputs(values)
            check.check_targets(targets)
        rounds.append((time.perf_counter() - start) / calls)
    return statistics.median(rounds)


def _timed_steps(spec: str, plan_json: str, steps: int, warmup: int, schedule: str,
                 record_last: bool) -> tuple[Any, int, list[float]]:
    """This rank's pipeline of ``spec`` on ``plan_json`` and the seconds of each measured step
    (a barrier before each; SGD stepped after ``step``). Uses only API that every build has
    (``wrap`` with ``plan=``, ``step``), so --against can run it on an older build; ``record=``
    is passed only to record the last step."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    torch.manual_seed(0)
    model, inputs = build_model(spec)
    batch = inputs[0].shape[0]
    targets = model.example_targets(batch)
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, schedule=schedule)
    params = list(pipe.parameters())
    opt = torch.optim.SGD(params, lr=0.01) if params else None
    times = []
    for k in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        if opt:
            opt.zero_grad()
        if record_last and k == warmup + steps - 1:
            pipe.step(inputs, targets, record=True)
        else:
            pipe.step(inputs, targets)
        if opt:
            opt.step()
        times.append(time.perf_counter() - start)
    return pipe, batch, times[warmup:]


def _worker(rank: int, world: int, spec: str, plan_json: str, steps: int, warmup: int, schedule: str) -> dict[str, Any]:
    pipe, batch, times = _timed_steps(spec, plan_json, steps, warmup, schedule, record_last=True)
    return {"seconds": statistics.median(times), "batch": batch, "tasks": pipe.measured_tasks()}


def _emulate_zero(pipe: Any) -> None:
    """Every stage of ``pipe`` emulated at zero seconds, from wherever this build keeps the
    emulation (graphpipe.emulation; graphpipe.runtime.emulate before)."""
    try:
        from graphpipe.emulation import emulate_stage
    except ImportError:
        from graphpipe.runtime.emulate import emulate_stage
    emulate_stage(pipe, 0.0, 0.0)


def _run_ranks() -> Any:
    try:
        from graphpipe.testing import run_ranks
    except ImportError:
        from graphpipe.runtime.testing import run_ranks
    return run_ranks


def _timing_worker(rank: int, world: int, spec: str, plan_json: str, steps: int, warmup: int,
                   schedule: str, zero: bool = False) -> list[float]:
    """The timing loop of --against (``zero``: stages emulated at zero seconds)."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    if not zero:
        return _timed_steps(spec, plan_json, steps, warmup, schedule, record_last=False)[2]
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0])
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, schedule=schedule)
    _emulate_zero(pipe)
    times = []
    for _ in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        pipe.step(inputs, targets)
        times.append(time.perf_counter() - start)
    return times[warmup:]


#: The calibration's dispatch measure (graphpipe.calibration): this model, micro-batches, one-rank
#: sequential pipelines.
DISPATCH_SPEC, DISPATCH_MICRO_BATCHES = "candle_uno:batch=16", 8


def _dispatch_worker(rank: int, world: int, steps: int, warmup: int) -> list[float]:
    """Seconds per forward or backward instruction of each step of a one-rank pipeline (a group
    of its own), zero compute, while the other ranks run theirs (graphpipe.calibration.runtime_costs)."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    groups = [dist.new_group([r]) for r in range(world)]
    torch.manual_seed(0)
    model, inputs = build_model(DISPATCH_SPEC)
    pipe = graphpipe.wrap(model, inputs, default_loss(DISPATCH_SPEC), group=groups[rank],
                          micro_batches=DISPATCH_MICRO_BATCHES, partitioner="sequential")
    _emulate_zero(pipe)
    targets = model.example_targets(inputs[0].shape[0])
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        pipe.step(inputs, targets)
        times.append((time.perf_counter() - start) / (2 * DISPATCH_MICRO_BATCHES))
    return times[warmup:]


def _time_one(job_path: str) -> None:
    """--time-one: runs one job (JSON file) in fresh ranks of whatever graphpipe this process
    imports, and prints per-step seconds as JSON: the slowest rank's (a pipeline), or the median
    rank's (``dispatch``: independent one-rank pipelines)."""
    run_ranks = _run_ranks()
    with open(job_path) as f:
        job = json.load(f)
    torch.set_num_threads(1)
    if job["measure"] == "dispatch":
        res = run_ranks(_dispatch_worker, job["world"], job["steps"], job["warmup"], timeout=600)
    else:
        res = run_ranks(_timing_worker, job["world"], job["spec"], job["plan"], job["steps"], job["warmup"],
                        job["schedule"], job["measure"] == "zero", timeout=600)
    bad = [r for r in res if not r.ok]
    if bad:
        raise SystemExit(f"rank {bad[0].rank}: {bad[0].message}\n{bad[0].traceback}")
    pick = statistics.median if job["measure"] == "dispatch" else max
    print(json.dumps([pick(r.value[i] for r in res) for i in range(job["steps"])]))


def _against_jobs(args: Any, graphs: dict[str, Any], devices: Any) -> list[tuple[str, dict[str, Any]]]:
    """(label, job) for every measurement --measure asks for."""
    from graphpipe._ext import _C

    measures = args.measure.split(",")
    unknown = set(measures) - {"train", "zero", "dispatch"}
    if unknown:
        raise SystemExit(f"--measure: unknown {sorted(unknown)} (train, zero, dispatch)")
    jobs = []
    if "dispatch" in measures:
        jobs.append((f"dispatch per F/B instruction, {args.world} one-rank pipelines",
                     {"measure": "dispatch", "world": args.world, "steps": max(args.steps, 20), "warmup": args.warmup}))
    for name, (spec, graph) in graphs.items():
        for partitioner in ("graphpipe", "sequential"):
            plan = _C.partition(graph, devices, partitioner=partitioner, num_micro_batches=args.micro_batches)
            for measure in [m for m in ("train", "zero") if m in measures]:
                what = "zero-compute step" if measure == "zero" else "step"
                # zero-compute steps take milliseconds: more of them for a steady median
                steps = max(args.steps, 20) if measure == "zero" else args.steps
                jobs.append((f"{name} / {plan.partitioner} ({len(plan.stages)} stages): {what}",
                             {"measure": measure, "world": args.world, "spec": spec, "plan": plan.to_json(graph),
                              "steps": steps, "warmup": args.warmup, "schedule": args.schedule}))
    return jobs


def _against(args: Any, graphs: dict[str, Any], devices: Any) -> None:
    import subprocess
    import sys
    import tempfile

    import graphpipe

    old_dir = old_build(args.against)
    base = os.environ.get("PYTHONPATH", "")
    envs = {"old": dict(os.environ, PYTHONPATH=old_dir + (os.pathsep + base if base else "")),
            "new": dict(os.environ)}
    # Both run outside the repository, so that no source folder in the current directory shadows
    # either build.
    neutral = tempfile.gettempdir()
    which = {k: subprocess.run([sys.executable, "-c", "import graphpipe; print(graphpipe.__file__)"], env=e,
                               cwd=neutral, capture_output=True, text=True, check=True).stdout.strip()
             for k, e in envs.items()}
    if which["old"] == which["new"]:
        raise SystemExit(f"--against: both builds import {which['new']}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, job in _against_jobs(args, graphs, devices):
            path = os.path.join(tmp, "job.json")
            with open(path, "w") as f:
                json.dump(job, f)
            seconds: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(args.rounds):
                for build in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--time-one", path],
                                         env=envs[build], cwd=neutral, capture_output=True, text=True, timeout=900)
                    if run.returncode != 0:
                        raise SystemExit(f"{label} ({build} build): {run.stderr[-3000:]}")
                    seconds[build] += json.loads(run.stdout.strip().splitlines()[-1])
            old_s, new_s = statistics.median(seconds["old"]), statistics.median(seconds["new"])
            unit, scale = ("us", 1e6) if job["measure"] == "dispatch" else ("ms", 1e3)
            rows.append({"what": label, "measure": job["measure"], "unit": unit, "old_s": old_s, "new_s": new_s,
                         "old_over_new": old_s / new_s, "samples": seconds})
            print(f"{label}: old {scale * old_s:.2f} {unit}, new {scale * new_s:.2f} {unit}", flush=True)
    print(f"\nold: {which['old']}\nnew: {which['new']}  (graphpipe {graphpipe.__version__})")
    print("\n| measured | old | new | old / new |\n| --- | --- | --- | --- |")
    for r in rows:
        scale = 1e6 if r["unit"] == "us" else 1e3
        print(f"| {r['what']} | {scale * r['old_s']:.2f} {r['unit']} | {scale * r['new_s']:.2f} {r['unit']} | "
              f"{r['old_over_new']:.3f} |")
    out = os.path.join(os.path.dirname(args.out) or ".", "runtime_bench_against.json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump({"world": args.world, "rounds": args.rounds, "old": which["old"], "new": which["new"],
                   "rows": rows}, f, indent=2)
    print(f"\nwrote {out}")


def main() -> None:
    import graphpipe
    from graphpipe._ext import _C
    from graphpipe.models import build_model
    from graphpipe.runtime.measure import stage_report
    from graphpipe.trace import trace_module

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--models", default="mmt,dlrm,candle_uno")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--spec", help="--against: one model spec instead of --models (e.g. compare.py's BENCH_SPECS)")
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--out", default="results/runtime_bench.json")
    ap.add_argument("--against", metavar="OLD",
                    help="time another graphpipe build side by side: a directory holding it, or a git ref to build")
    ap.add_argument("--measure", default="train",
                    help="--against: what to time, any of train,zero,dispatch (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="--against: alternating rounds per build")
    ap.add_argument("--time-one", metavar="JOB", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.time_one:
        _time_one(args.time_one)
        return

    torch.set_num_threads(1)
    devices = _C.Devices.cpu_rank(args.world)
    if args.against:
        graphs = {}
        for name in args.models.split(","):
            spec = args.spec if args.spec else f"{name}:batch={args.batch}"
            name = spec.split(":")[0]
            model, inputs = build_model(spec)
            traced = trace_module(model, inputs)
            graphpipe.profile(traced.graph, model, inputs, batch_sizes=(args.batch // args.micro_batches,),
                              repeats=3)
            graphs[name] = (spec, traced.graph)
        _against(args, graphs, devices)
        return
    rows = []
    for name in args.models.split(","):
        spec = f"{name}:batch={args.batch}"
        model, inputs = build_model(spec)
        check_s = _batch_check_seconds(model, inputs, model.example_targets(args.batch))
        traced = trace_module(model, inputs)
        graphpipe.profile(traced.graph, model, inputs, batch_sizes=(args.batch // args.micro_batches,), repeats=3)
        per_plan = {}
        for partitioner in ("graphpipe", "sequential"):
            plan = _C.partition(traced.graph, devices, partitioner=partitioner, num_micro_batches=args.micro_batches)
            schedule = _C.Schedule.generate(plan, args.schedule)
            sim = _C.simulate(plan, schedule, devices)
            res = _run_ranks()(_worker, args.world, spec, plan.to_json(traced.graph), args.steps, args.warmup,
                            args.schedule, timeout=600)
            bad = [r for r in res if not r.ok]
            if bad:
                raise SystemExit(f"{name}/{partitioner}: rank {bad[0].rank}: {bad[0].message}\n{bad[0].traceback}")
            seconds = max(r.value["seconds"] for r in res)
            row = {
                "model": name, "partitioner": plan.partitioner, "stages": len(plan.stages), "depth": plan.depth,
                "micro_batches": plan.num_micro_batches, "batch": args.batch,
                "measured_iteration_s": seconds, "samples_per_s": args.batch / seconds,
                "simulated_iteration_s": sim.iteration_seconds,
                "batch_check_s": check_s,
            }
            per_plan[partitioner] = row
            rows.append(row)
            print(f"\n{name} / {plan.partitioner}: {len(plan.stages)} stages, depth {plan.depth}")
            print(stage_report(res[0].value["tasks"], sim))
        ratio = per_plan["graphpipe"]["samples_per_s"] / per_plan["sequential"]["samples_per_s"]
        per_plan["graphpipe"]["speedup_vs_sequential"] = ratio

    print(f"\n{'model':<11} {'plan':<26} {'stages':>6} {'depth':>5} {'samples/s':>10} {'meas s':>8} {'sim s':>8} "
          f"{'ratio':>6} {'check us':>9} {'check %':>8}")
    for r in rows:
        ratio = f"{r['speedup_vs_sequential']:.2f}" if "speedup_vs_sequential" in r else ""
        share = 100 * r["batch_check_s"] / r["measured_iteration_s"]
        print(f"{r['model']:<11} {r['partitioner']:<26} {r['stages']:>6} {r['depth']:>5} {r['samples_per_s']:>10.1f} "
              f"{r['measured_iteration_s']:>8.4f} {r['simulated_iteration_s']:>8.4f} {ratio:>6} "
              f"{1e6 * r['batch_check_s']:>9.1f} {share:>7.3f}%")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"world": args.world, "rows": rows}, f, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
