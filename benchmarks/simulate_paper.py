"""Simulated throughput of graph vs sequential pipelines at the paper's model sizes.

For the multi-modal Transformer, DLRM and CANDLE-Uno at the sizes of docs/design.md §8 (traced on
the meta device: no memory is allocated), on 8, 16 and 32 V100-class GPUs: plan with the
``graphpipe`` partitioner and with the ``sequential`` baseline (same devices, batch, memory
limit and optimizer), generate the graph-aware 1F1B schedule, simulate one iteration, and report
throughput, their ratio, pipeline depth, micro-batching and first-stage memory. Prints a markdown
table and writes JSON.

    python benchmarks/simulate_paper.py [--devices 8 16 32] [--batch 256] [--out results/simulate_paper.json]

``--dtype float32 bfloat16`` prices each model in every precision given, side by side in one run
(a second table: each precision's graphpipe step and its speedup over sequential, and the 16-bit
step against float32's). A 16-bit precision traces the model as mixed-precision training runs
it: float32 parameters, the forward under ``torch.autocast("cpu", dtype)`` (CPU autocast's
operator lists), so its activations and stage transfers are those of the autocast dtype; the
planner prices the device's rate for it (``--device-kind a100``: 312 TFLOP/s bfloat16 against
19.5 float32, halved as every preset rate is; a V100 has float16 tensor cores but none for
bfloat16). autocast does not run on the meta device, so these models are built on fake CPU
tensors (``FakeTensorMode``: shapes without memory) instead.

``--replicas`` compares, for MMT, DLRM and CANDLE-Uno on 8, 16, 32 and 64 V100-class GPUs with 8
per node, three ways of using the devices when stages may be replicated (docs/design.md §4.8):
graph+dp (``graphpipe`` with ``plan``'s default ``replicate``: replicas allowed, the plans
without them weighed on every count up to 16, and replicas granted by
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

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

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


def traced(name: str, batch: int, dtype: str) -> object:
    """The model's graph at ``batch`` computing in ``dtype``: float32 on the meta device; a 16-bit
    dtype on fake CPU tensors under ``torch.autocast("cpu", dtype)`` (autocast skips meta)."""
    spec = f"{MODELS[name]},batch={batch}"
    if dtype == "float32":
        return graphpipe.trace(*build_model(spec))
    with FakeTensorMode(allow_non_fake_inputs=True):
        model, inputs = build_model(spec.replace("device=meta", "device=cpu"))
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        return graphpipe.trace(model, inputs)


def print_precisions(rows: list[dict], dtypes: list[str]) -> None:
    """Each precision's graphpipe step and speedup over sequential per model and GPU count, and
    each 16-bit step's speedup over float32's (same run, same devices)."""
    if len(dtypes) < 2:
        return
    print()
    print("| model | GPUs | " + " | ".join(f"{d} step ms (vs sequential)" for d in dtypes) + " | " +
          " | ".join(f"{d} vs {dtypes[0]}" for d in dtypes[1:]) + " |")
    print("|" + "---|" * (2 + 2 * len(dtypes) - 1))
    graph = {(r["model"], r["gpus"], r["dtype"]): r for r in rows if r["partitioner"].startswith("graphpipe")}
    for model, gpus in dict.fromkeys((r["model"], r["gpus"]) for r in rows):
        cells = [graph[model, gpus, d] for d in dtypes]
        steps = [f"{c['iteration_seconds'] * 1e3:.2f} ({c['ratio_vs_sequential']:.2f}x)" for c in cells]
        speedups = [f"{cells[0]['iteration_seconds'] / c['iteration_seconds']:.2f}x" for c in cells[1:]]
        print(f"| {model} | {gpus} | " + " | ".join(steps) + " | " + " | ".join(speedups) + " |")


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


def pipelines_compared(graph: object, name: str, count: int, dtype: str, device_kind: str) -> list[dict]:
    """The sequential and graphpipe pipelines of ``graph`` on ``count`` devices (one device a
    stage), simulated: one printed and returned row each."""
    devices = graphpipe.devices(count, device_kind)
    results = {}
    for partitioner in ("sequential", "graphpipe"):
        start = time.perf_counter()
        plan = graphpipe.plan(graph, devices, partitioner, replicate=False)  # pipelines, one device a stage
        seconds = time.perf_counter() - start
        results[partitioner] = (plan, graphpipe.simulate(plan, devices), seconds)
    base = results["sequential"][1].samples_per_second
    rows = []
    for plan, sim, seconds in results.values():
        row = {
            "model": name, "gpus": count, "dtype": plan.compute_dtype, "partitioner": plan.partitioner,
            "stages": plan.num_stages, "depth": plan.depth,
            "micro_batches": plan.num_micro_batches, "micro_batch_size": plan.micro_batch_size,
            "samples_per_second": sim.samples_per_second, "iteration_seconds": sim.iteration_seconds,
            "ratio_vs_sequential": sim.samples_per_second / base,
            "first_stage_memory_bytes": first_stage_memory(plan),
            "bottleneck_seconds_per_sample": plan.bottleneck_seconds_per_sample,
            "plan_seconds": seconds,
        }
        rows.append(row)
        print(f"| {name} | {count} | {dtype} | {row['partitioner']} | {row['stages']} | {row['depth']} | "
              f"{row['micro_batches']} x {row['micro_batch_size']} | {row['samples_per_second']:.1f} | "
              f"{row['ratio_vs_sequential']:.2f}x | {row['first_stage_memory_bytes'] / 2**30:.2f} | "
              f"{seconds:.2f} |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--batch", type=int, default=256, help="mini-batch size (samples per step)")
    parser.add_argument("--batch-per-gpu", type=int, default=0,
                        help="--replicas: the mini-batch is this many samples per GPU at every GPU count (the "
                             "GraphPipe paper's weak scaling: its mini-batch grows with the GPUs); 0: --batch")
    parser.add_argument("--device-kind", default="v100", help="a device preset: " + ", ".join(graphpipe.DEVICE_KINDS))
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"],
                        help="the precisions to price each model in, side by side (16-bit: traced under autocast)")
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
    header = ("| model | GPUs | dtype | partitioner | stages | depth | micro-batches | samples/s | vs sequential "
              "| first-stage memory GiB | plan s |")
    print(header)
    print("|" + "---|" * 11)
    for name in args.models:
        for dtype in args.dtype:
            graph = traced(name, args.batch, dtype)
            for count in args.devices:
                rows.extend(pipelines_compared(graph, name, count, dtype, args.device_kind))
    print_precisions(rows, args.dtype)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "simulate_paper", "device_kind": args.device_kind, "batch": args.batch,
                   "dtypes": args.dtype, "simulated": True, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
