"""What each measured runtime term of the simulator moves: compare.py's graphpipe rows priced again
with one term of their stored device description turned off at a time.

    python benchmarks/sim_terms_bench.py results/compare.json [more reports] [--out results/sim_terms.json]

Each graphpipe row of a compare.py report carries its plan (stage times included) and the
description it was simulated with. The plan is simulated under that description as stored, then
with each of these set to 0 in turn, and with all of them at 0:

- ``collective_overlap_loss``: the compute a rank loses per second of a gradient bucket's sum
  beside its backward;
- ``rank_skew_fraction``: the step's wait for its slowest rank, per second of compute;
- ``optimizer_tensor_seconds``: the optimizer step's price per parameter tensor.

Every column rests on the same measured run and the same profile, so the differences between
them are the terms' alone (a report's own simulated column can differ from one run to the next
by its profile). Prints a table of the simulator's error per column and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from compare import RUN_OPTIMIZER  # this folder's compare.py: the optimizer its runs step
from resimulate import load_plan  # this folder's resimulate.py: a report row's plan, loaded

import graphpipe
from graphpipe.models import build_model

#: The description's measured terms, each turned off in a column of its own.
TERMS = ("collective_overlap_loss", "rank_skew_fraction", "optimizer_tensor_seconds")
#: Each term's value when off: nothing lost, nobody waited for, no optimizer priced per tensor.
OFF: dict[str, Any] = {"collective_overlap_loss": 0.0, "rank_skew_fraction": 0.0, "optimizer_tensor_seconds": {}}


def priced(report: dict, name: str) -> list[dict[str, Any]]:
    """One row per graphpipe row of ``report`` that ran, with a stored description: the run's
    median step and the plan's simulated step as stored, without each term and without all."""
    graphs: dict[str, Any] = {}
    rows = []
    for r in report["rows"]:
        if "plan" not in r or "median_seconds" not in r or "devices" not in r["plan"]:
            continue
        spec = r.get("spec", r["model"])
        if spec not in graphs:
            model, inputs = build_model(spec)
            graphs[spec] = graphpipe.trace(model, inputs)
        plan, _ = load_plan(r["plan"], graphs[spec])
        stored = json.dumps(r["plan"]["devices"])

        def simulated(off: tuple[str, ...], plan: Any = plan, r: dict = r, stored: str = stored) -> float:
            devices = graphpipe.Devices.from_json(stored)
            for term in off:
                setattr(devices, term, OFF[term])
            return graphpipe.simulate(plan, devices, r["plan"]["schedule"], optimizer=RUN_OPTIMIZER).iteration_seconds

        columns = {"stored": simulated(())} | {f"no {t}": simulated((t,)) for t in TERMS} | {"none": simulated(TERMS)}
        devices = graphpipe.Devices.from_json(stored)
        terms = {"collective_overlap_loss": devices.collective_overlap_loss,
                 "rank_skew_fraction": devices.rank_skew_fraction,
                 "run_optimizer_tensor_seconds": devices.optimizer_tensor_seconds.get(RUN_OPTIMIZER, 0.0)}
        rows.append({"report": name, "model": r["model"], "variant": r["variant"], "world": r["world"],
                     "run_seconds": r["median_seconds"], "terms": terms,
                     "simulated_seconds": columns,
                     "off_by": {k: s / r["median_seconds"] - 1.0 for k, s in columns.items()}})
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    keys = list(rows[0]["off_by"])
    print("| report | model | variant | run ms | overlap loss | skew | us/tensor | " + " | ".join(keys) + " |")
    print("|---" * (7 + len(keys)) + "|")
    for r in rows:
        t = r["terms"]
        print(f"| {r['report']} | {r['model']} | {r['variant']} | {r['run_seconds'] * 1e3:.1f} | "
              f"{t['collective_overlap_loss']:.2f} | {t['rank_skew_fraction']:.3f} | "
              f"{t['run_optimizer_tensor_seconds'] * 1e6:.1f} | "
              + " | ".join(f"{r['off_by'][k] * 100:+.1f}%" for k in keys) + " |")
    for k in keys:
        within = sum(abs(r["off_by"][k]) <= 0.10 for r in rows)
        print(f"- {k}: within 10% in {within} of {len(rows)} rows")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", help="JSON reports of benchmarks/compare.py")
    parser.add_argument("--out", default="results/sim_terms.json")
    args = parser.parse_args()
    rows = [row for path in args.reports for row in priced(json.loads(Path(path).read_text()), Path(path).parent.name
                                                           or path)]
    if not rows:
        sys.exit("no graphpipe row that ran with a stored description")
    print_table(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "sim_terms", "reports": args.reports, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
