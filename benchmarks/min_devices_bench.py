"""What occupying more devices costs: the least simulated step among plans that use at least N devices.

For a paper-size model on V100-class GPUs (8 per node, batch 256, 25 MiB buckets), the planner
(``_C.plan_by_simulation``, the ranking ``graphpipe.plan`` runs) is asked for its best plan with
``min_devices`` = 0 (the default plan) and then with each given lower bound on the devices used.
It answers whether a planner that leaves devices idle does so because using them would be
slower (the step printed for each bound), which is the case for CANDLE-Uno at paper size. Prints
a table and writes JSON.

    python benchmarks/min_devices_bench.py [--model candle_uno] [--gpus 32] [--min-devices 12 20 28]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import graphpipe
from graphpipe._ext import _C
from graphpipe.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="candle_uno", choices=["mmt", "dlrm", "candle_uno"])
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--min-devices", type=int, nargs="+", default=[12, 20, 28])
    parser.add_argument("--partitioners", nargs="+", default=["graphpipe", "sequential"])
    parser.add_argument("--bucket-mib", type=float, default=25.0)
    parser.add_argument("--out", default="results/min_devices.json")
    args = parser.parse_args()

    model, inputs = build_model(f"{args.model}:size=paper,device=meta,batch=256")
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(args.gpus, "v100", per_node=8)
    print(f"{args.model} on {args.gpus} V100s (8 per node), batch 256: the least simulated step using at least N devices")
    print("| partitioner | N | simulated ms | stages | devices used | micro-batches | candidates | simulated | plan s |")
    print("|" + "---|" * 9)
    rows = []
    for partitioner in args.partitioners:
        for least in [0, *args.min_devices]:
            start = time.perf_counter()
            try:
                # With the default's growth of replicas by simulation (planner/planner.h).
                result = _C.plan_by_simulation(graph, devices, partitioner=partitioner, replicate=True,
                                               bucket_bytes=args.bucket_mib * 2**20, min_devices=least,
                                               grow_replicas=True)
            except graphpipe.PlanningError as error:
                rows.append({"partitioner": partitioner, "min_devices": least, "error": str(error)})
                print(f"| {partitioner} | {least} | none: {error} | | | | | | |")
                continue
            plan = result.plan
            used = sum(len(s.devices) for s in plan.stages)
            row = {"partitioner": partitioner, "min_devices": least,
                   "simulated_iteration_seconds": plan.predicted_iteration_seconds, "stages": len(plan.stages),
                   "devices_used": used, "widths": [len(s.devices) for s in plan.stages],
                   "micro_batches": plan.num_micro_batches, "micro_batch_size": plan.micro_batch_size,
                   "candidates": result.candidates, "simulated": result.simulated,
                   "plan_seconds": time.perf_counter() - start}
            rows.append(row)
            print(f"| {partitioner} | {least} | {row['simulated_iteration_seconds'] * 1e3:.2f} | {row['stages']} | {used} | "
                  f"{plan.num_micro_batches} x {plan.micro_batch_size} | {result.candidates} | {result.simulated} | "
                  f"{row['plan_seconds']:.2f} |", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "min_devices", "model": args.model, "gpus": args.gpus, "simulated": True,
                   "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
