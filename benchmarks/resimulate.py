"""Prices compare.py's graphpipe plans again from its report, with and without the measured cost
of each extra tensor of a transfer, beside the emulated or measured times of the same run.

    python benchmarks/resimulate.py results/compare_world8.json [--out results/resimulate.json]

Every graphpipe row of the report carries its plan (stage times included) and, from this commit
on, the device description it was simulated with. A plan saved before model inputs stopped
making stage edges is brought to that rule, its stage times as stored (``load_plan``; the
table's "plan" column). Each plan is simulated twice under that
description: as measured (``Devices.extra_tensor_seconds`` from the report's calibration: a
transfer's tensors, posted together, share one latency and each extra one costs one more
message), and with the figure unset (each extra tensor charged a whole link latency, the rule
before the figure was measured). Both columns rest on one measured run, so the difference between
them is the rule's alone. A report written before the description was stored is priced with the
report's calibrated links and runtime costs and this machine's measured throughput and memory
bandwidth (which set the optimizer step), and the table says so.

Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import compare  # this folder's compare.py: the description it makes from a calibration

import graphpipe
from graphpipe.models import build_model


def rebuilt_devices(report: dict, world: int) -> Any:
    """The description compare.py made for ``world`` ranks, rebuilt from the report's
    calibration and this machine's measured throughput (for reports that do not store it)."""
    return compare.calibrated_description(graphpipe._C.Devices.cpu_rank(world, measure=True), world,
                                          report["slowdown"], report["calibration"][str(world)])


def load_plan(stored: dict, graph: Any) -> tuple[Any, str]:
    """A report row's plan and how it was loaded: "as stored", or "inputs dropped" for a plan
    saved before model inputs stopped making stage edges (they never travel; docs/design.md §3),
    brought to that rule by the loader (``Plan.from_json(..., drop_input_edges=True)``: its
    input edges dropped, the depth recounted, the stage times as stored)."""
    text = json.dumps(stored["json"])
    try:
        return graphpipe.Plan.from_json(text, graph), "as stored"
    except graphpipe.FormatError as exc:
        if "operator edges out of model inputs" not in str(exc):
            raise
    return graphpipe.Plan.from_json(text, graph, drop_input_edges=True), "inputs dropped"


def resimulate(report: dict) -> list[dict]:
    """One row per graphpipe row of ``report`` that ran: the run's time and the plan simulated
    with the measured extra-tensor figure and without it."""
    graphs: dict[str, Any] = {}
    rows = []
    for r in report["rows"]:
        if "plan" not in r or "median_seconds" not in r:
            continue
        spec = r.get("spec", r["model"])
        if spec not in graphs:
            model, inputs = build_model(spec)
            graphs[spec] = graphpipe.trace(model, inputs)
        stored = "devices" in r["plan"]
        devices = (graphpipe.Devices.from_json(json.dumps(r["plan"]["devices"])) if stored
                   else rebuilt_devices(report, r["world"]))
        plan, loaded = load_plan(r["plan"], graphs[spec])
        measured_figure = devices.extra_tensor_seconds
        if measured_figure is None:
            raise SystemExit(f"{r['model']} {r['variant']}: the report has no measured extra_tensor_seconds "
                             "(written before compare.py measured it)")
        simulated = {}
        for rule, figure in (("measured", measured_figure), ("latency", None)):
            devices.extra_tensor_seconds = figure
            simulated[rule] = graphpipe.simulate(plan, devices, r["plan"]["schedule"],
                                                 optimizer=compare.RUN_OPTIMIZER).iteration_seconds
        rows.append({"model": r["model"], "world": r["world"], "variant": r["variant"],
                     "most_tensors_per_edge": max((e.tensors for e in plan.edges), default=0),
                     "run_seconds": r["median_seconds"], "description": "stored" if stored else "rebuilt",
                     "plan": loaded, "depth": plan.depth,
                     "extra_tensor_seconds": measured_figure,
                     "simulated_seconds": simulated,
                     "off_by": {rule: s / r["median_seconds"] - 1.0 for rule, s in simulated.items()}})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| model | ranks | variant | plan | depth | tensors/edge (most) | run ms "
          "| simulated ms, measured per-tensor cost | off by | simulated ms, a latency per tensor | off by "
          "| description |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, off = r["simulated_seconds"], r["off_by"]
        print(f"| {r['model']} | {r['world']} | {r['variant']} | {r['plan']} | {r['depth']} | "
              f"{r['most_tensors_per_edge']} | {r['run_seconds'] * 1e3:.1f} | {s['measured'] * 1e3:.1f} | "
              f"{off['measured'] * 100:+.1f}% | {s['latency'] * 1e3:.1f} | {off['latency'] * 100:+.1f}% | "
              f"{r['description']} |")
    for rule, words in (("measured", "measured per-tensor cost"), ("latency", "a latency per tensor")):
        within = sum(abs(r["off_by"][rule]) <= 0.10 for r in rows)
        worst = max((r["off_by"][rule] for r in rows), key=abs, default=0.0)
        print(f"- {words}: within 10% in {within} of {len(rows)} runs, worst {worst * 100:+.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="a JSON report of benchmarks/compare.py")
    parser.add_argument("--out", default="results/resimulate.json")
    args = parser.parse_args()
    report = json.loads(Path(args.report).read_text())
    rows = resimulate(report)
    if not rows:
        sys.exit(f"{args.report}: no graphpipe row that ran")
    print_table(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "resimulate", "report": args.report, "report_commit": report.get("commit"),
                               "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
