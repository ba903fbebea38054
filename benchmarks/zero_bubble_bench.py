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

``--measure`` instead runs the graph plan for real on CPU ranks (Gloo, real compute, one thread per
rank) under graph 1F1B and under ``zb_graph``, rounds interleaved (1F1B, zb, 1F1B, zb, ...: a drift
of the machine's load hits both alike), and prints the measured zb / 1F1B ratio of the median
iterations beside the one the simulator predicts for the same plan on the same calibrated devices
(compare.py's profile, calibration and rank harness), then writes results/zero_bubble_measured.json:

    python benchmarks/zero_bubble_bench.py --measure [--models transformer mmt] [--world 2] [--steps 12] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
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


def unsplit_stages(schedule: Any) -> list[int]:
    """The stages a zb_graph schedule runs whole backwards (B) on: those whose split costs more
    than it saves (docs/design.md, zero-bubble)."""
    return sorted({i.stage for r in range(schedule.num_ranks) for i in schedule.instructions(r)
                   if i.kind.name == "backward"})


def measured(args: argparse.Namespace) -> None:
    """Graph 1F1B against zb_graph on the same plan, measured on CPU ranks and simulated."""
    import compare

    launch = compare.start(argparse.Namespace(device="cpu", timeout=args.timeout))
    calibration = compare.calibrate([args.world], launch)[args.world]
    rounds = compare.split_steps(args.steps, args.rounds)
    rows = []
    print(f"### Measured on {args.world} CPU ranks (real compute), {len(rounds)} interleaved rounds\n")
    print("| model | stages | M | stages run whole (B) under zb | 1f1b ms | zb_graph ms | measured zb / 1f1b | "
          "simulated 1f1b ms | simulated zb ms | simulated zb / 1f1b | simulated / measured ratio |")
    print("|" + "---|" * 11)
    for name in args.models:
        spec = compare.BENCH_SPECS.get(name, name)
        model, inputs = build_model(spec)
        graph = graphpipe.trace(model, inputs)
        batch = graph.trace_batch_size
        graphpipe.profile(graph, model, inputs, batch_sizes=tuple(b for b in (1, 2, 4, 8, 16, 32, 64) if b <= batch),
                          repeats=3, warmup=1)
        devices = compare._device_model(args.world, "cpu", "h100", 1.0, calibration)
        plan = graphpipe.plan(graph, devices, "graphpipe", replicate=False)
        info = compare.simulate_plans({"graphpipe": plan}, graph, devices)
        whole = unsplit_stages(graphpipe.schedule(plan, "zb_graph"))
        variants = {}
        for schedule, key in (("1f1b", "graphpipe"), ("zb_graph", "graphpipe zb")):
            run = compare.GraphpipeRun(plan.to_json(graph), schedule, key, info[key]["optimizer_seconds"])
            variants[schedule] = compare.Variant(f"graph {schedule}", "graphpipe", run, plan.num_micro_batches,
                                                 plan.depth)
        pooled: dict[str, dict] = {k: {} for k in variants}
        for index in range(len(rounds)):
            for schedule, variant in variants.items():
                compare.run_variant(spec, args.world, variant, launch, rounds, args.warmup, None, index,
                                    pooled[schedule])
        errors = {k: v["error"] for k, v in pooled.items() if "error" in v}
        if errors:
            raise RuntimeError(f"{name}: {errors}")
        one, zb = (pooled[k]["median_seconds"] for k in ("1f1b", "zb_graph"))
        sim_one, sim_zb = (info[k]["simulated_iteration_seconds"] for k in ("graphpipe", "graphpipe zb"))
        row = {"model": name, "spec": spec, "world": args.world, "stages": plan.num_stages,
               "micro_batches": plan.num_micro_batches, "measured": {k: pooled[k] for k in pooled},
               "measured_ratio": zb / one, "simulated": {"1f1b": sim_one, "zb_graph": sim_zb},
               "simulated_ratio": sim_zb / sim_one, "unsplit_stages": whole, "calibration": calibration}
        rows.append(row)
        print(f"| {name} | {plan.num_stages} | {plan.num_micro_batches} | {whole or 'none'} | {1e3 * one:.2f} | "
              f"{1e3 * zb:.2f} | "
              f"{zb / one:.3f} | {1e3 * sim_one:.2f} | {1e3 * sim_zb:.2f} | {sim_zb / sim_one:.3f} | "
              f"{(sim_zb / sim_one) / (zb / one):.3f} |", flush=True)
    out = Path(args.out or "results/zero_bubble_measured.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "rounds": rounds, "warmup": args.warmup, "load": os.getloadavg()},
                              indent=1))
    print(f"\nload average {os.getloadavg()}; wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--measure", action="store_true", help="measure graph 1F1B against zb_graph on CPU ranks")
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], help="--measure: compare.py's names")
    parser.add_argument("--world", type=int, default=2, help="--measure: CPU ranks")
    parser.add_argument("--steps", type=int, default=12, help="--measure: measured iterations per schedule")
    parser.add_argument("--rounds", type=int, default=4, help="--measure: interleaved rounds per schedule")
    parser.add_argument("--warmup", type=int, default=2, help="--measure: warm-up iterations per round")
    parser.add_argument("--timeout", type=float, default=600.0, help="--measure: seconds per run")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.measure:
        measured(args)
        return
    args.out = args.out or "results/zero_bubble_bench.json"

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
