"""Simulated: the best plan with up to k stages per device against the best with one.

For the paper's models (docs/design.md §8 sizes, traced on the meta device) on 8, 16, 32 and 64
V100-class GPUs (8 per node), batch 256, pipelines without replicas, the schedule chosen by the
planner (``schedule="auto"``: graph 1F1B or ``zb_graph``): ``graphpipe.plan(...,
stages_per_rank=1)`` against ``stages_per_rank=k`` (default 2), which also weighs the
partitioner's plans for k times the devices folded onto them in a V and looping
(csrc/planner/folded_search.h), on the first 2, 4, ... ranks up to the device count
(``fold_budget_limit=0``: at these powers of two, onto all the devices; the default limit folds
on the first 2, 4 and 8 only). Each plan is simulated; the table gives both steps, their ratio,
the mean bubble share of the ranks (``graphpipe.simulate(...).ranks[r].bubble_share``), the
plan's stages and its placement, and the planning time. Simulated only: nothing runs.

    python benchmarks/stages_per_rank_bench.py [--devices 8 16 32 64] [--models mmt dlrm candle_uno transformer]
        [--stages-per-rank 2] [--default] [--out results/stages_per_rank_bench.json]

``--default`` plans with ``graphpipe.plan``'s default search instead (replicas allowed, the
baselines weighed), ``stages_per_rank=1`` against ``k`` with the default fold budgets (the first
2, 4 and 8 ranks): what asking for folds gives there, and costs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import graphpipe
from graphpipe.models import build_model

MODELS = {
    "mmt": "mmt:size=paper,device=meta",
    "dlrm": "dlrm:size=paper,device=meta",
    "candle_uno": "candle_uno:size=paper,device=meta",
    "transformer": "transformer:size=paper,device=meta",
}


def measure(graph: Any, devices: Any, k: int, default: bool = False) -> dict[str, Any]:
    """The planner's plan with up to ``k`` stages per device, simulated; ``default``: with
    ``graphpipe.plan``'s default search (replicas allowed, baselines weighed, folds on the first
    2, 4 and 8 ranks)."""
    start = time.perf_counter()
    if default:
        plan = graphpipe.plan(graph, devices, schedule="auto", stages_per_rank=k)
    else:
        # Folds on every power of two up to the device count (fold_budget_limit 0), not only the
        # default's first 2, 4 and 8 ranks: what folding can give, at its planning cost.
        plan = graphpipe.plan(graph, devices, replicate=False, schedule="auto", stages_per_rank=k,
                              fold_budget_limit=0)
    seconds = time.perf_counter() - start
    result = graphpipe.simulate(plan, devices)
    shares = [r.bubble_share for r in result.ranks]
    per_device: dict[int, int] = {}
    for stage in plan.stages:
        for d in stage.devices:
            per_device[int(d)] = per_device.get(int(d), 0) + 1
    return {"step_seconds": result.iteration_seconds, "planner_step_seconds": plan.predicted_iteration_seconds,
            "bubble_share": sum(shares) / len(shares), "stages": len(plan.stages),
            "most_stages_per_device": max(per_device.values()), "partitioner": plan.partitioner,
            "schedule": plan.schedule, "micro_batches": plan.num_micro_batches, "plan_seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--stages-per-rank", type=int, default=2)
    parser.add_argument("--device-kind", default="v100")
    parser.add_argument("--default", action="store_true",
                        help="graphpipe.plan's default search (replicas, baselines; folds on 2-8 ranks)")
    parser.add_argument("--out", default=None, help="default results/stages_per_rank_bench[_default].json")
    args = parser.parse_args()
    args.out = args.out or f"results/stages_per_rank_bench{'_default' if args.default else ''}.json"
    k = args.stages_per_rank
    print(f"| model | GPUs | one per device: ms | bubble | up to {k}: ms | bubble | speedup | stages | "
          "plan | plan s (1 / k) |")
    print("|" + "---|" * 10)
    rows = []
    for name in args.models:
        graph = graphpipe.trace(*build_model(f"{MODELS[name]},batch={args.batch}"))
        for count in args.devices:
            devices = graphpipe.devices(count, args.device_kind, per_node=8)
            one, several = measure(graph, devices, 1, args.default), measure(graph, devices, k, args.default)
            speedup = one["step_seconds"] / several["step_seconds"]
            rows.append({"model": name, "gpus": count, "one": one, "several": several, "speedup": speedup})
            print(f"| {name} | {count} | {one['step_seconds'] * 1e3:.2f} | {one['bubble_share']:.3f} | "
                  f"{several['step_seconds'] * 1e3:.2f} | {several['bubble_share']:.3f} | {speedup:.2f}x | "
                  f"{one['stages']} / {several['stages']} | {several['partitioner']}, {several['schedule']} | "
                  f"{one['plan_seconds']:.1f} / {several['plan_seconds']:.1f} |", flush=True)
    worse = [r for r in rows if r["speedup"] < 1.0 - 1e-9]
    print(f"rows where up to {k} stages per device simulate slower: {len(worse)} of {len(rows)}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "stages_per_rank_bench", "simulated": True, "default_search": args.default,
                   "device_kind": args.device_kind,
                   "per_node": 8, "batch": args.batch, "stages_per_rank": k,
                   "figure": "graphpipe.simulate(plan, devices).iteration_seconds", "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
