"""How repeatable graphpipe.profile's figures are from one batch size to the next.

The planner weighs micro-batch sizes against each other (one micro-batch of 16 rows, or two of
8?), so what must repeat from one profile to the next is the ratio between sizes, more than any
one figure. For each benchmark model (compare.py's sizes) this profiles the graph ``--runs`` times,
each in a fresh process, one torch thread, at batch sizes 1-32, and prints for each pair of
adjacent sizes the ratio t(2b) / (2 t(b)) of the whole graph's forward + backward (below 1: one
micro-batch of 2b rows beats two of b) in every run, with its spread and standard deviation.

``--against OLD`` profiles with an older build too (a folder holding a graphpipe package, or a git
ref built once into results/against/<commit>; benchmarks/against.py), the builds alternating
run by run, so that both see the same machine. Writes results/profile_repeatability.json.

    python benchmarks/profile_repeatability.py [--models mmt transformer] [--runs 5] [--against 3f0df4b]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from against import old_build  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32)


def profile_once(spec: str) -> dict[str, Any]:
    """This process: one profile of ``spec``'s graph; the whole graph's forward + backward per size."""
    import time

    import torch

    import graphpipe
    from graphpipe.models import build_model

    torch.set_num_threads(1)
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    start = time.perf_counter()
    graphpipe.profile(graph, model, inputs, device="cpu", batch_sizes=SIZES)
    seconds = time.perf_counter() - start
    totals = {b: 0.0 for b in SIZES}
    for node in graph.nodes:
        for sample in node.profile:
            totals[sample.batch_size] += sample.forward_seconds + sample.backward_seconds
    return {"profile_seconds": seconds, "totals": totals}


def run(spec: str, build: str | None) -> dict[str, Any]:
    """One profile in a fresh process, with ``build``'s graphpipe (None: the installed one)."""
    env = dict(os.environ)
    if build is not None:
        env["PYTHONPATH"] = build + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", spec], env=env, cwd="/",
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"profiling {spec} with {build or 'the installed build'} failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["totals"] = {int(b): t for b, t in result["totals"].items()}
    return result


def ratios(result: dict[str, Any]) -> dict[str, float]:
    t = result["totals"]
    return {f"{2 * b}/(2x{b})": t[2 * b] / (2.0 * t[b]) for b in SIZES if 2 * b in t}


def report(model: str, build: str, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prints and returns one build's rows for ``model``: each pair's ratio in every profile."""
    rows = []
    per_run = [ratios(r) for r in results]
    for pair in per_run[0]:
        values = [r[pair] for r in per_run]
        row = {"model": model, "build": build, "pair": pair, "ratios": values, "spread": max(values) - min(values),
               "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
               "profile_seconds": [r["profile_seconds"] for r in results]}
        rows.append(row)
        print(f"  {build:12s} {pair:10s} {' '.join(f'{v:.3f}' for v in values)}   spread {row['spread']:.3f}"
              f"  stdev {row['stdev']:.3f}")
    seconds = " ".join(f"{r['profile_seconds']:.1f}" for r in results)
    print(f"  {build:12s} profile seconds {seconds}")
    return rows


def main() -> None:
    from compare import BENCH_SPECS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mmt", "transformer"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--against", default=None, help="an older build (folder or git ref) profiled beside")
    parser.add_argument("--out", default="results/profile_repeatability.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one profile of this spec
    args = parser.parse_args()
    if args.one:
        print(json.dumps(profile_once(args.one)))
        return
    builds: dict[str, str | None] = {"this build": None}
    if args.against:
        builds = {f"{args.against}": old_build(args.against), "this build": None}
    rows = []
    for model in args.models:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in builds}
        for _ in range(args.runs):
            for name, build in builds.items():
                runs[name].append(run(BENCH_SPECS[model], build))
        print(f"\n{model}: t(2b) / (2 t(b)), whole graph's forward + backward, {args.runs} profiles per build")
        for name, results in runs.items():
            rows += report(model, name, results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "profile_repeatability", "against": args.against,
                                          "sizes": list(SIZES), "rows": rows}, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
