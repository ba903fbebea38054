"""Simulated throughput of graph vs sequential pipelines at the paper's model sizes.

For the multi-modal Transformer, DLRM and CANDLE-Uno at the sizes of docs/design.md §8 (traced on
the meta device: no memory is allocated), on 8, 16 and 32 V100-class GPUs: plan with the
``graphpipe`` partitioner and with the ``sequential`` baseline (same devices, batch, memory
limit and optimizer), generate the graph-aware 1F1B schedule, simulate one iteration, and report
throughput, their ratio, pipeline depth, micro-batching and first-stage memory. Prints a markdown
table and writes JSON.

    python benchmarks/simulate_paper.py [--devices 8 16 32] [--batch 256] [--out results/simulate_paper.json]

``--replicas`` compares, for MMT, DLRM and CANDLE-Uno on 8, 16, 32 and 64 V100-class GPUs with 8
per node, three ways of using the devices when stages may be replicated (docs/design.md §4.8):
graph+dp (``graphpipe`` with ``plan``'s default ``replicate``: replicas allowed, the plans
without them weighed on every count up to 16 and every power of two, and replicas granted by
simulation), sequential+dp (``sequential``, the same search, PipeDream's planner), piper+dp
(``piper``, the same search, Piper's planner without tensor parallelism) and plain data parallelism (one stage on every device, via
a manual plan). Each plan is simulated (graph-aware 1F1B; the simulator models the replicas'
re-sharded transfers and their bucketed gradient all-reduce, here with ``--bucket-mib`` 25 MiB
buckets, DDP's default, as a GPU run would use: ``wrap(..., bucket_bytes=)``), and the
planner's own predicted step is printed beside it (the planner ranks its candidates by
simulating them with the same buckets, docs/design.md §4.10, so the two agree). A second table gives graph+dp's simulated
speedup over the other three per row, each planner's predicted / simulated step, and the GraphPipe
paper's 1.25-1.61x (over PipeDream and Piper, 32 GPUs) beside the 32-GPU rows. Writes
results/simulate_paper_replicas.json.

    python benchmarks/simulate_paper.py --replicas [--devices 8 16 32 64] [--batch 256 | --batch-per-gpu 256]
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


REPLICA_MODELS = ("mmt", "dlrm", "candle_uno")


#: The GraphPipe paper's speedups over PipeDream and Piper on 32 GPUs (Jeon et al., ASPLOS 2025).
PAPER_32_GPUS = "1.25-1.61x"


def print_ratios(rows: list[dict]) -> None:
    """graph+dp's simulated speedup over sequential+dp and over data parallelism per row, and how
    far each planner's predicted step is from the simulated one; the paper's range beside 32 GPUs."""
    print()
    print("| model | GPUs | graph+dp vs sequential+dp | graph+dp vs piper+dp | graph+dp vs data parallel | "
          "paper (32 GPUs) | planner / simulated: graph+dp, sequential+dp, piper+dp, data parallel |")
    print("|" + "---|" * 7)
    keyed = {(r["model"], r["gpus"], r["plan"]): r for r in rows if "simulated_iteration_seconds" in r}
    for model, gpus in dict.fromkeys((r["model"], r["gpus"]) for r in rows):
        graph, seq, piper, dp = (keyed.get((model, gpus, label))
                                 for label in ("graph+dp", "sequential+dp", "piper+dp", "data parallel"))

        def ratio(other, graph=graph):
            if graph is None or other is None:
                return "-"
            return f"{other['simulated_iteration_seconds'] / graph['simulated_iteration_seconds']:.2f}x"

        agreement = ", ".join(f"{r['predicted_iteration_seconds'] / r['simulated_iteration_seconds']:.2f}" if r else "-"
                              for r in (graph, seq, piper, dp))
        print(f"| {model} | {gpus} | {ratio(seq)} | {ratio(piper)} | {ratio(dp)} | {PAPER_32_GPUS if gpus == 32 else ''} "
              f"| {agreement} |")


def replicas_mode(args) -> None:
    """graph+dp vs sequential+dp vs plain data parallelism, by simulated iteration time."""
    counts = args.devices if args.devices != [8, 16, 32] else [8, 16, 32, 64]
    models = [m for m in args.models if m in REPLICA_MODELS] if args.models != list(MODELS) else list(REPLICA_MODELS)
    print("Simulated iteration time (graphpipe.simulate, 1F1B) of each plan; the planner's predicted step beside it.")
    print("| model | GPUs | plan | label | stages | devices used | widest stage | micro-batches | "
          "simulated ms | planner ms | samples/s | vs data parallel | plan s |")
    print("|" + "---|" * 13)
    rows = []
    graphs: dict[tuple[str, int], object] = {}
    for name in models:
        for count in counts:
            # The paper's weak scaling (--batch-per-gpu): the mini-batch grows with the GPUs.
            batch = args.batch_per_gpu * count if args.batch_per_gpu else args.batch
            if (name, batch) not in graphs:
                model, inputs = build_model(f"{MODELS[name]},batch={batch}")
                graphs[name, batch] = graphpipe.trace(model, inputs)
            graph = graphs[name, batch]
            devices = graphpipe.devices(count, args.device_kind, per_node=8)
            made = {}
            for label, kwargs in (
                ("graph+dp", {"partitioner": "graphpipe"}),
                ("sequential+dp", {"partitioner": "sequential"}),
                ("piper+dp", {"partitioner": "piper"}),
                ("data parallel", {"partitioner": "manual", "manual": {"": 0},
                                   "stage_devices": {0: list(range(count))}}),
            ):
                start = time.perf_counter()
                try:
                    # The planner simulates its candidates with the buckets the run will use.
                    plan = graphpipe.plan(graph, devices, bucket_bytes=args.bucket_mib * 2**20, **kwargs)
                except graphpipe.PlanningError as error:  # e.g. plain data parallelism out of memory
                    made[label] = (None, str(error), time.perf_counter() - start)
                    continue
                made[label] = (plan, None, time.perf_counter() - start)
            simulated = {label: graphpipe.simulate(plan, devices, bucket_bytes=args.bucket_mib * 2**20).iteration_seconds
                         for label, (plan, _, _) in made.items() if plan is not None}
            base = simulated.get("data parallel")
            for label, (plan, error, seconds) in made.items():
                if plan is None:
                    rows.append({"model": name, "gpus": count, "plan": label, "error": error, "plan_seconds": seconds})
                    print(f"| {name} | {count} | {label} | - | - | - | - | - | infeasible | - | - | - | {seconds:.2f} |")
                    continue
                step = simulated[label]
                widths = [len(s.devices) for s in plan.stages]
                row = {
                    "model": name, "gpus": count, "batch": batch, "plan": label, "partitioner": plan.partitioner,
                    "stages": len(plan.stages), "devices_used": sum(widths), "widest_stage": max(widths),
                    "depth": plan.depth, "micro_batches": plan.num_micro_batches,
                    "micro_batch_size": plan.micro_batch_size,
                    "simulated_iteration_seconds": step,
                    "predicted_iteration_seconds": plan.predicted_iteration_seconds,
                    "simulated_samples_per_second": batch / step,
                    "speedup_vs_data_parallel": (base / step) if base else None,
                    "all_reduce_seconds": [s.all_reduce_seconds for s in plan.stages],
                    "plan_seconds": seconds,
                }
                rows.append(row)
                ratio = f"{row['speedup_vs_data_parallel']:.2f}x" if base else "-"
                print(f"| {name} | {count} | {label} | {plan.partitioner} | {row['stages']} | {row['devices_used']} | "
                      f"{row['widest_stage']} | {plan.num_micro_batches} x {plan.micro_batch_size} | {step * 1e3:.2f} | "
                      f"{plan.predicted_iteration_seconds * 1e3:.2f} | {batch / step:.0f} | {ratio} | {seconds:.2f} |",
                      flush=True)
    print_ratios(rows)
    out = args.out if args.out != "results/simulate_paper.json" else "results/simulate_paper_replicas.json"
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump({"benchmark": "simulate_paper_replicas", "device_kind": args.device_kind, "per_node": 8,
                   "batch": args.batch, "batch_per_gpu": args.batch_per_gpu, "simulated": True,
                   "bucket_mib": args.bucket_mib, "figure": "graphpipe.simulate(plan, devices).iteration_seconds",
                   "rows": rows}, f, indent=1)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--batch", type=int, default=256, help="mini-batch size (samples per step)")
    parser.add_argument("--batch-per-gpu", type=int, default=0,
                        help="--replicas: the mini-batch is this many samples per GPU at every GPU count (the "
                             "GraphPipe paper's weak scaling: its mini-batch grows with the GPUs); 0: --batch")
    parser.add_argument("--device-kind", default="v100")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--out", default="results/simulate_paper.json")
    parser.add_argument("--bucket-mib", type=float, default=25.0,
                        help="--replicas: gradient bucket size the simulated runtime uses (DDP's default on GPUs)")
    parser.add_argument("--replicas", action="store_true",
                        help="graph+dp vs sequential+dp vs data parallelism, simulated (8..64 GPUs, 8 per node)")
    args = parser.parse_args()
    if args.replicas:
        replicas_mode(args)
        return
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
                plan = graphpipe.plan(graph, devices, partitioner, replicate=False)  # pipelines, one device a stage
                seconds = time.perf_counter() - start
                sim = graphpipe.simulate(plan, devices)
                results[partitioner] = (plan, sim, seconds)
            base = results["sequential"][1].samples_per_second
            for plan, sim, seconds in results.values():
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
