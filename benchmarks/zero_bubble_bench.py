"""Simulated zero-bubble schedules on stage DAGs: graph 1F1B against ``zb_graph`` on the same plans.

Two tables, both from ``graphpipe.simulate`` (nothing here is measured):

1. Chains of p equal stages with F = I = W (a backward of 2, split evenly) and free links, against
   the closed forms: 1F1B's iteration (M + p - 1)(F + B), ZB-H1's M (F + B) + (p - 1)(F + I - W).
2. The paper's models (MMT, DLRM, CANDLE-Uno at the sizes of docs/design.md §8, traced on the
   meta device) planned by the ``graphpipe`` partitioner on 8 and 32 V100-class GPUs (8 per
   node), each plan simulated under ``1f1b`` and under ``zb_graph``: iteration time, the mean
   bubble share over the ranks that hold a stage, and the peak activation memory of the stage
   that holds the most (peak micro-batches in flight, until their W, times the stage's
   activation bytes).

Prints both tables and writes results/zero_bubble_bench.json.

    python benchmarks/zero_bubble_bench.py [--devices 8 32] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import graphpipe
from graphpipe.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODELS = {
    "mmt": "mmt:size=paper,device=meta",
    "dlrm": "dlrm:size=paper,device=meta",
    "candle_uno": "candle_uno:size=paper,device=meta",
}


def chain(p: int, M: int) -> Any:
    """p equal stages in a chain: forward 1, backward 2 (so I = W = 1), M micro-batches (the
    simulator benchmark's chain with these costs)."""
    from sim_bench import chain as bench_chain

    return bench_chain(p, M, forward=1.0, backward=2.0, edge_bytes=0.0)[0]


def free_devices(n: int) -> Any:
    d = graphpipe.devices(n, "cpu")
    d.link_latency = [[0.0] * n for _ in range(n)]
    d.link_bandwidth = [[1e30] * n for _ in range(n)]
    d.memory_bandwidth = 0.0
    return d


def figures(result: Any, plan: Any) -> dict[str, float]:
    held = [r for r in result.ranks if r.stage >= 0]
    return {
        "iteration_seconds": result.iteration_seconds,
        "bubble_share": statistics.mean(r.bubble_share for r in held),
        "peak_activation_bytes": max(s.peak_activation_bytes for s in result.stages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--out", default="results/zero_bubble_bench.json")
    args = parser.parse_args()

    chains = []
    print("### Chains, F = I = W = 1, free links (simulated)\n")
    print("| p | M | 1f1b | closed form | zb_graph | ZB-H1 closed form | zb / 1f1b |")
    print("|---|---|---|---|---|---|---|")
    for p, M in [(4, 8), (4, 32), (8, 16), (8, 64)]:
        plan = chain(p, M)
        one = graphpipe.simulate(plan, free_devices(p), "1f1b").iteration_seconds
        zb = graphpipe.simulate(plan, free_devices(p), "zb_graph").iteration_seconds
        row = {"p": p, "M": M, "1f1b": one, "1f1b_formula": 3.0 * (M + p - 1), "zb_graph": zb,
               "zb_h1_formula": 3.0 * M + (p - 1)}
        chains.append(row)
        print(f"| {p} | {M} | {one:g} | {row['1f1b_formula']:g} | {zb:g} | {row['zb_h1_formula']:g} | {zb / one:.3f} |")

    models = []
    print("\n### Paper models, graphpipe plans on V100-class GPUs, 8 per node (simulated)\n")
    print("| model | GPUs | stages | depth | M | 1f1b ms | zb_graph ms | zb / 1f1b | bubble 1f1b | bubble zb | "
          "peak activations 1f1b GB | zb GB |")
    print("|" + "---|" * 12)
    for name, spec in MODELS.items():
        model, example = build_model(spec)
        graph = graphpipe.trace(model, example)
        for n in args.devices:
            devices = graphpipe.devices(n, "v100", per_node=8)
            plan = graphpipe.plan(graph, devices, "graphpipe", batch_size=args.batch)
            one = figures(graphpipe.simulate(plan, devices, "1f1b"), plan)
            zb = figures(graphpipe.simulate(plan, devices, "zb_graph"), plan)
            row = {"model": name, "devices": n, "stages": plan.num_stages, "depth": plan.depth,
                   "micro_batches": plan.num_micro_batches, "1f1b": one, "zb_graph": zb}
            models.append(row)
            print(f"| {name} | {n} | {plan.num_stages} | {plan.depth} | {plan.num_micro_batches} | "
                  f"{1e3 * one['iteration_seconds']:.2f} | {1e3 * zb['iteration_seconds']:.2f} | "
                  f"{zb['iteration_seconds'] / one['iteration_seconds']:.3f} | {100 * one['bubble_share']:.1f}% | "
                  f"{100 * zb['bubble_share']:.1f}% | {one['peak_activation_bytes'] / 1e9:.2f} | "
                  f"{zb['peak_activation_bytes'] / 1e9:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"chains": chains, "models": models, "batch": args.batch}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
