"""Times the schedule generators, the deadlock checker and the simulator on chains of S stages x M
micro-batches; prints a table and writes results/sim_bench.json.

    GRAPHPIPE_EXT_DIR=build/h4 python3 benchmarks/sim_bench.py [--repeats 7] [--out results/sim_bench.json]

The target: simulating 32 stages x 256 micro-batches takes under 100 ms.

A second table times zb_graph's generator on chains whose backward splits evenly (I = W = B / 2)
and on chains whose every split is dear (I + W = 1.3 B, as a profile of small operators can
say), where the generator searches which stages run whole backwards (docs/design.md §5.1), with
the simulated iteration of the schedule it makes over 1F1B's (zb/1F1B).
``--against OLD`` times the same cases with an older build (a folder holding a graphpipe package,
or a git ref built once into results/against/<commit>; benchmarks/against.py) in a subprocess of
the same run, and prints the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from graphpipe._ext import _C

SIZES = [(4, 16), (8, 64), (16, 128), (32, 256), (64, 512)]
TARGET = (32, 256, 0.100)  # stages, micro-batches, seconds


def chain(stages: int, micro_batches: int, forward: float = 1e-3, backward: float = 2e-3, edge_bytes: float = 1e6):
    """A chain plan of equal stages (by default 1 ms forward, 2 ms backward, 1 MB per edge) and
    V100-like links (10 us, 10 GB/s)."""
    plan = _C.Plan()
    plan_stages = []
    for s in range(stages):
        st = _C.Stage()
        st.id, st.devices = s, [s]
        st.forward_seconds, st.backward_seconds = forward, backward
        st.activation_bytes, st.param_bytes = 1e6, 1e6
        plan_stages.append(st)
    edges = []
    for s in range(stages - 1):
        e = _C.StageEdge()
        e.src, e.dst, e.bytes = s, s + 1, edge_bytes
        edges.append(e)
    plan.stages, plan.edges = plan_stages, edges
    plan.num_micro_batches, plan.micro_batch_size = micro_batches, 1
    plan.batch_size, plan.num_devices = micro_batches, stages
    devices = _C.Devices()
    devices.name, devices.count = "bench", stages
    devices.memory_bandwidth = 900e9
    devices.link_bandwidth = [[10e9] * stages for _ in range(stages)]
    devices.link_latency = [[10e-6] * stages for _ in range(stages)]
    return plan, devices


ZB_SIZES = [(8, 64), (16, 64), (64, 64), (32, 256)]


def zb_times(repeats: int) -> list[dict]:
    """zb_graph generation time on each chain of ZB_SIZES, its backward split even or dear."""
    rows = []
    for stages, mbs in ZB_SIZES:
        for split in ("even", "dear"):
            plan, devices = chain(stages, mbs)
            halves = (1e-3, 1e-3) if split == "even" else (1.3e-3, 1.3e-3)
            plan_stages = list(plan.stages)
            for st in plan_stages:
                st.backward_input_seconds, st.backward_weight_seconds = halves
            plan.stages = plan_stages
            _, median, schedule = best_and_median(lambda: _C.Schedule.generate(plan, "zb_graph"), repeats)  # noqa: B023 (runs within this iteration)
            whole = sum(1 for r in range(stages)
                        if any(i.kind == _C.OpKind.backward for i in schedule.instructions(r)))
            iteration = _C.simulate(plan, schedule, devices).iteration_seconds
            ofob = _C.simulate(plan, _C.Schedule.generate(plan, "1f1b"), devices).iteration_seconds
            rows.append({"stages": stages, "micro_batches": mbs, "split": split, "generate_seconds": median,
                         "whole_backward_stages": whole, "iteration_seconds": iteration,
                         "one_f_one_b_iteration_seconds": ofob})
    return rows


def zb_table(repeats: int, against: str | None) -> list[dict]:
    """Prints zb_graph's generation times; with `against` (a folder holding another build's
    graphpipe package), that build's times beside, taken in a subprocess right after."""
    rows = zb_times(repeats)
    if against:
        import subprocess

        from against import old_build

        against = old_build(against)

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([against, os.environ.get("PYTHONPATH", "")]))
        env.pop("GRAPHPIPE_EXT_DIR", None)
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--zb-json", "--repeats", str(repeats)],
                             env=env, cwd=against, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"--against {against}: the build there failed to time zb_graph "
                             f"(exit {run.returncode}):\n{run.stderr.strip()[-2000:]}")
        out = run.stdout
        for row, theirs in zip(rows, json.loads(out.strip().splitlines()[-1])):
            row["against_generate_seconds"] = theirs["generate_seconds"]
            row["against_whole_backward_stages"] = theirs["whole_backward_stages"]
            row["against_iteration_seconds"] = theirs["iteration_seconds"]
    print(f"\nzb_graph generation{' (against ' + against + ')' if against else ''}")
    print(f"{'stages':>6} {'mbs':>5} {'split':>6} {'generate ms':>11} {'whole':>5} {'zb/1F1B':>7} "
          f"{'against ms':>10} {'whole':>5} {'zb/1F1B':>7} {'speed-up':>8}")
    for r in rows:
        theirs = r.get("against_generate_seconds")
        ofob = r["one_f_one_b_iteration_seconds"]
        cells = ("", "", "", "") if theirs is None else (
            f"{1e3 * theirs:.2f}", str(r["against_whole_backward_stages"]),
            f"{r['against_iteration_seconds'] / ofob:.3f}", f"{theirs / r['generate_seconds']:.1f}x")
        print(f"{r['stages']:>6} {r['micro_batches']:>5} {r['split']:>6} {1e3 * r['generate_seconds']:>11.2f} "
              f"{r['whole_backward_stages']:>5} {r['iteration_seconds'] / ofob:>7.3f} {cells[0]:>10} {cells[1]:>5} "
              f"{cells[2]:>7} {cells[3]:>8}")
    return rows


def best_and_median(fn, repeats: int) -> tuple[float, float, object]:
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default="results/sim_bench.json")
    parser.add_argument("--against", default=None,
                        help="an older build (folder or git ref, as runtime_bench.py's): its zb_graph times beside")
    parser.add_argument("--zb-json", action="store_true", help=argparse.SUPPRESS)  # --against's subprocess
    args = parser.parse_args()
    if args.zb_json:
        print(json.dumps(zb_times(args.repeats)))
        return 0
    missing = [n for n in ("Plan", "Stage", "StageEdge", "Devices") if not hasattr(_C, n)]
    if missing:
        print(f"graphpipe._C does not bind {', '.join(missing)} yet (the partition/cost bindings); "
              "nothing to time.", file=sys.stderr)
        return 2

    rows = []
    header = (f"{'stages':>6} {'mbs':>5} {'kind':>10} {'overlap':>7} {'tasks':>7} "
              f"{'generate ms':>11} {'check ms':>8} {'simulate ms':>11} {'iteration s':>11}")
    print(header)
    print("-" * len(header))
    for stages, mbs in SIZES:
        plan, devices = chain(stages, mbs)
        for kind in ("1f1b", "fill_drain"):
            _, gen_median, schedule = best_and_median(lambda: _C.Schedule.generate(plan, kind), args.repeats)  # noqa: B023 (runs within this iteration)
            _, check_median, _ = best_and_median(schedule.check, args.repeats)
            for overlap in (True, False):
                sim_best, sim_median, result = best_and_median(
                    lambda: _C.simulate(plan, schedule, devices, overlap=overlap), args.repeats)  # noqa: B023 (runs within this iteration)
                row = {
                    "stages": stages, "micro_batches": mbs, "kind": kind, "overlap": overlap,
                    "tasks": len(result.tasks),
                    "generate_seconds": gen_median, "check_seconds": check_median,
                    "simulate_seconds": sim_median, "simulate_best_seconds": sim_best,
                    "iteration_seconds": result.iteration_seconds,
                }
                rows.append(row)
                print(f"{stages:>6} {mbs:>5} {kind:>10} {str(overlap):>7} {row['tasks']:>7} "
                      f"{1e3 * gen_median:>11.2f} {1e3 * check_median:>8.2f} {1e3 * sim_median:>11.2f} "
                      f"{result.iteration_seconds:>11.4f}")
    target = [r for r in rows if (r["stages"], r["micro_batches"]) == TARGET[:2]]
    worst = max(r["simulate_seconds"] for r in target)
    verdict = "meets" if worst < TARGET[2] else "MISSES"
    print(f"\n{TARGET[0]} stages x {TARGET[1]} micro-batches: simulate (check included) takes at most "
          f"{1e3 * worst:.1f} ms (median): {verdict} the {1e3 * TARGET[2]:.0f} ms target")
    zb_rows = zb_table(args.repeats, args.against)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "sim_bench", "machine": platform.platform(),
                   "python": platform.python_version(), "repeats": args.repeats,
                   "target": {"stages": TARGET[0], "micro_batches": TARGET[1], "seconds": TARGET[2],
                              "worst_median_seconds": worst, "met": worst < TARGET[2]},
                   "rows": rows, "zb_graph_generation": zb_rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
