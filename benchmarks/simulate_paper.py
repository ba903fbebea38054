"""Simulated throughput of graph vs sequential pipelines at the paper's model sizes.

For the multi-modal Transformer, DLRM and CANDLE-Uno at the sizes of docs/design.md §8 (traced on
the meta device: no memory is allocated), on 8, 16 and 32 V100-class GPUs: plan with the
``graphpipe`` partitioner and with the ``sequential`` baseline (same devices, batch, memory
limit and optimizer), generate the graph-aware 1F1B schedule, simulate one iteration, and report
throughput, their ratio, pipeline depth, micro-batching and first-stage memory. Prints a markdown
table and writes JSON.

    python benchmarks/simulate_paper.py [--devices 8 16 32] [--batch 256] [--out results/simulate_paper.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import graphpipe
from graphpipe.models import build_model

MODELS = {
    "mmt": "mmt:size=paper,device=meta",
    "dlrm": "dlrm:size=paper,device=meta",
    "candle_uno": "candle_uno:size=paper,device=meta",
    "candle_uno16": "candle_uno:size=paper,branches=16,device=meta",
    "transformer": "transformer:size=paper,device=meta",
}


def first_stage_memory(plan) -> float:
    sources = {s.id for s in plan.stages} - {e.dst for e in plan.edges}
    return max(plan.stages[i].memory_bytes for i in sources)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--batch", type=int, default=256, help="mini-batch size (samples per step)")
    parser.add_argument("--device-kind", default="v100")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", default="results/simulate_paper.json")
    args = parser.parse_args()
    rows = []
    header = ("| model | GPUs | partitioner | stages | depth | micro-batches | samples/s | vs sequential "
              "| first-stage memory GiB | plan s |")
    print(header)
    print("|" + "---|" * 10)
    for name in args.models:
        model, inputs = build_model(f"{MODELS[name]},batch={args.batch}")
        graph = graphpipe.trace(model, inputs)
        for count in args.devices:
            devices = graphpipe.devices(count, args.device_kind)
            results = {}
            for partitioner in ("sequential", "graphpipe"):
                start = time.perf_counter()
                plan = graphpipe.plan(graph, devices, partitioner)
                seconds = time.perf_counter() - start
                sim = graphpipe.simulate(plan, devices)
                results[partitioner] = (plan, sim, seconds)
            base = results["sequential"][1].samples_per_second
            for partitioner, (plan, sim, seconds) in results.items():
                row = {
                    "model": name, "gpus": count, "partitioner": plan.partitioner,
                    "stages": plan.num_stages, "depth": plan.depth,
                    "micro_batches": plan.num_micro_batches, "micro_batch_size": plan.micro_batch_size,
                    "samples_per_second": sim.samples_per_second,
                    "ratio_vs_sequential": sim.samples_per_second / base,
                    "first_stage_memory_bytes": first_stage_memory(plan),
                    "bottleneck_seconds_per_sample": plan.bottleneck_seconds_per_sample,
                    "plan_seconds": seconds,
                }
                rows.append(row)
                print(f"| {name} | {count} | {row['partitioner']} | {row['stages']} | {row['depth']} | "
                      f"{row['micro_batches']} x {row['micro_batch_size']} | {row['samples_per_second']:.1f} | "
                      f"{row['ratio_vs_sequential']:.2f}x | {row['first_stage_memory_bytes'] / 2**30:.2f} | "
                      f"{seconds:.2f} |", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "simulate_paper", "device_kind": args.device_kind, "batch": args.batch,
                   "simulated": True, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
