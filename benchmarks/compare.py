"""The main job: throughput of graph pipelines against sequential pipeline baselines.

For each model and world size, in one invocation, with the same global batch, optimizer (SGD),
dtype (float32) and number of ranks:

  graphpipe/graph        graphpipe's runtime on the ``graphpipe`` partitioner's plan (a DAG)
  graphpipe/sequential   graphpipe's runtime on the ``sequential`` plan (a chain, skip tensors
                         relayed through the stages in between)
  torch/1f1b, torch/gpipe
                         PyTorch's torch.distributed.pipelining (Schedule1F1B, ScheduleGPipe),
                         the model cut at the sequential plan's cut points, at the sequential
                         plan's micro-batch count (and at the graph plan's, marked "@graph M")

Each variant runs on freshly spawned ranks (Gloo on CPU, one torch thread each): warm-up
iterations, then measured ones; we report samples/s (median and min-max spread), peak resident
memory per rank, and ratios to each baseline, and check that every variant's first-step loss
equals single-process training's. Plans are made once, in this process, from a profiled graph
(graphpipe.profile at several batch sizes on this machine), with the same memory limit for every
partitioner. Output: a markdown table on stdout, JSON (machine, torch, commit, every figure) and
a PNG chart.

``--emulate`` replaces each stage's compute by a wait of its profiled duration (transfers stay
real), so that 4 to 16 ranks fit on a small machine; every output of that mode says
"emulated", and the measured iteration time is compared with the simulator's.

    python benchmarks/compare.py                          # defaults: 4 models, 2 ranks
    python benchmarks/compare.py --models candle_uno --world 2 3 --steps 10
    python benchmarks/compare.py --emulate --world 4 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import graphpipe  # noqa: E402
from graphpipe.models import build_model, default_loss  # noqa: E402
from graphpipe.runtime.testing import reference_training, run_ranks, seeded_batches  # noqa: E402

#: Benchmark sizes: big enough on a CPU core that compute, not per-operator overhead, dominates;
#: small enough that the default run takes a few minutes on 2 cores.
BENCH_SPECS = {
    "mmt": "mmt:branches=4,depth=2,seq=32,hidden=128,heads=4,ffn=256,batch=32",
    "dlrm": "dlrm:dense_branches=4,sparse_branches=4,dense_in=256,dense_width=512,dense_depth=3,"
            "emb_rows=20000,emb_dim=64,bag=16,top_width=512,top_depth=2,batch=64",
    "candle_uno": "candle_uno:branches=4,feature_in=512,width=512,depth=4,top_width=512,top_depth=2,batch=64",
    "transformer": "transformer:depth=8,seq=32,hidden=128,heads=4,ffn=256,batch=32",
}
LR = 0.001


@dataclass
class Variant:
    name: str
    runtime: str  # "graphpipe" or "torch"
    plan_json: str | None = None
    schedule: str = "1f1b"
    micro_batches: int = 1
    labels: dict[str, int] = field(default_factory=dict)
    num_stages: int = 0
    note: str = ""


# ---- per-rank work -------------------------------------------------------------------------

def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def graphpipe_rank(rank: int, world: int, spec: str, variant: Variant, steps: int, emulate: bool) -> dict:
    import torch.distributed as dist

    model, inputs, data = seeded_batches(spec, steps)
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=variant.plan_json, schedule=variant.schedule)
    if emulate:
        from graphpipe.runtime.emulate import emulate_stage

        emulate_stage(pipe)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=LR) if list(pipe.parameters()) else None
    losses, seconds = [], []
    for x, y in data:
        dist.barrier()
        start = time.perf_counter()
        loss = pipe.step(x, y)
        if optimizer:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
        losses.append(float(loss))
    return {"losses": losses, "seconds": seconds, "peak_rss": _peak_rss_bytes()}


def torch_rank(rank: int, world: int, spec: str, variant: Variant, steps: int, emulate: bool) -> dict:
    import torch.distributed as dist

    from baselines.torch_pipelining import chain_stage_modules, pin_integer_consumers, train_rank
    from graphpipe.trace import trace_module

    model, inputs, data = seeded_batches(spec, steps)
    k = variant.num_stages
    group = dist.new_group(list(range(k))) if k < world else None  # collective: every rank calls it
    if rank >= k:  # more ranks than chain stages: this rank idles, joining the barriers
        for _ in data:
            dist.barrier()
            dist.barrier()
        return {"losses": [float("nan")] * len(data), "seconds": [], "peak_rss": _peak_rss_bytes()}
    traced = trace_module(model, inputs)
    labels = pin_integer_consumers(traced.module, variant.labels, traced.placeholder_values)
    stage = chain_stage_modules(traced.module, labels, k)[rank]
    if emulate:  # the same waits as graphpipe's emulated stages: the sequential plan's figures
        from graphpipe.runtime.emulate import EmulatedStage

        figures = json.loads(variant.plan_json)["stages"][rank]
        stage = EmulatedStage(stage, figures["forward_seconds"], figures["backward_seconds"])
    losses, seconds = train_rank(stage, rank, k, data, default_loss(spec), variant.micro_batches,
                                 variant.schedule, lr=LR, group=group)
    return {"losses": losses, "seconds": seconds, "peak_rss": _peak_rss_bytes()}


# ---- orchestration -------------------------------------------------------------------------

def reference_losses(spec: str, steps: int) -> list[float]:
    model, _, data = seeded_batches(spec, steps)
    return reference_training(model, data, default_loss(spec), LR)


def make_variants(spec: str, world: int, memory_limit: str | None, profile_batches: tuple[int, ...],
                  calibration: tuple[float, float, float]) -> tuple[list[Variant], dict]:
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=profile_batches, repeats=3, warmup=1)
    latency, bandwidth, overhead = calibration
    devices = graphpipe.devices(world, "cpu")
    devices.set_node_links(world, bandwidth, latency, bandwidth, latency)
    plans = {p: graphpipe.plan(graph, devices, p, memory_limit=memory_limit) for p in ("graphpipe", "sequential")}
    seq = plans["sequential"]
    labels = {graph.node(n).name: stage.id for stage in seq.stages for n in stage.nodes}
    variants = [
        Variant("graphpipe/graph", "graphpipe", plans["graphpipe"].to_json(graph), "1f1b",
                plans["graphpipe"].num_micro_batches),
        Variant("graphpipe/sequential", "graphpipe", seq.to_json(graph), "1f1b", seq.num_micro_batches),
        Variant("torch/1f1b", "torch", seq.to_json(graph), "1f1b", seq.num_micro_batches, labels, seq.num_stages),
        Variant("torch/gpipe", "torch", seq.to_json(graph), "fill_drain", seq.num_micro_batches, labels,
                seq.num_stages),
    ]
    graph_m = plans["graphpipe"].num_micro_batches
    if graph_m != seq.num_micro_batches:
        variants.append(Variant(f"torch/1f1b @graph M={graph_m}", "torch", seq.to_json(graph), "1f1b", graph_m,
                                labels, seq.num_stages))
    info = {name: {"stages": p.num_stages, "depth": p.depth, "micro_batches": p.num_micro_batches,
                   "micro_batch_size": p.micro_batch_size, "partitioner": p.partitioner,
                   "predicted_iteration_seconds": p.predicted_iteration_seconds}
            for name, p in plans.items()}
    sims = {name: graphpipe.simulate(p, devices, task_overhead_seconds=overhead).iteration_seconds
            for name, p in plans.items()}
    for name in info:
        info[name]["simulated_iteration_seconds"] = sims[name]
    return variants, info


def run_variant(spec: str, world: int, variant: Variant, steps: int, warmup: int, emulate: bool,
                timeout: float) -> dict:
    fn = graphpipe_rank if variant.runtime == "graphpipe" else torch_rank
    results = run_ranks(fn, world, spec, variant, warmup + steps, emulate, timeout=timeout)
    failed = [r for r in results if not r.ok]
    if failed:
        # Report the rank that failed first, not the ones that lost their connection to it.
        first = min(failed, key=lambda r: ("closed by peer" in r.message or "PeerError" in r.error_type, r.rank))
        return {"error": f"rank {first.rank}: {first.error_type}: {first.message}"}
    seconds = [max(r.value["seconds"][i] for r in results if r.value["seconds"]) for i in range(warmup + steps)]
    measured = seconds[warmup:]
    losses = next((r.value["losses"] for r in results if r.value["losses"] and r.value["losses"][0] == r.value["losses"][0]), [])
    return {
        "iteration_seconds": measured,
        "median_seconds": statistics.median(measured),
        "first_loss": losses[0] if losses else float("nan"),
        "peak_rss_bytes": [r.value["peak_rss"] for r in results],
    }


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(BENCH_SPECS), help="names in BENCH_SPECS or model specs")
    parser.add_argument("--world", type=int, nargs="+", default=[2], help="world sizes (default 2)")
    parser.add_argument("--steps", type=int, default=10, help="measured iterations")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--size", default="bench", choices=["bench", "small", "paper"],
                        help="model sizes: the benchmark sizes (default), the test sizes, or the paper's")
    parser.add_argument("--memory-limit", default=None, help="per-rank memory limit for every planner")
    parser.add_argument("--emulate", action="store_true", help="stage compute replaced by profiled waits")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per variant before giving up")
    parser.add_argument("--out", default="results/compare.json")
    parser.add_argument("--png", default="results/compare.png")
    args = parser.parse_args()
    torch.set_num_threads(1)
    mode = "emulated" if args.emulate else "measured"

    from tqdm import tqdm

    from calibrate import dispatch_overhead, link

    # The simulator's link and dispatch figures, measured with as many ranks at once as each run.
    calibration: dict[int, dict[str, float]] = {}
    for world in sorted(set(args.world)):
        latency, bandwidth = link(concurrency=world)
        overhead = dispatch_overhead(concurrency=world)
        calibration[world] = {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                              "task_overhead_seconds": overhead}
        print(f"calibration, {world} ranks at once: link latency {latency * 1e6:.0f} us, bandwidth "
              f"{bandwidth / 1e9:.2f} GB/s, runtime dispatch {overhead * 1e6:.0f} us per forward/backward",
              file=sys.stderr)
    rows: list[dict] = []
    jobs = [(m, w) for m in args.models for w in args.world]
    bar = tqdm(total=len(jobs) * 5, desc=f"compare ({mode})", unit="run", file=sys.stderr)
    for name, world in jobs:
        spec = BENCH_SPECS.get(name, name) if args.size == "bench" or ":" in name else f"{name}:size={args.size}"
        batch = build_model(spec)[1][0].shape[0]
        profile_batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= batch)
        c = calibration[world]
        variants, plans = make_variants(spec, world, args.memory_limit, profile_batches,
                                        (c["link_latency_seconds"], c["link_bandwidth_bytes_per_second"],
                                         c["task_overhead_seconds"]))
        reference = reference_losses(spec, 1)[0]
        results = {}
        for variant in variants:
            bar.set_postfix_str(f"{name} x{world} {variant.name}")
            results[variant.name] = run_variant(spec, world, variant, args.steps, args.warmup, args.emulate, args.timeout)
            bar.update(1)
        base = {k: v.get("median_seconds") for k, v in results.items()}
        for variant in variants:
            r = results[variant.name]
            row = {"model": name, "spec": spec, "world": world, "variant": variant.name, "mode": mode,
                   "batch": batch, "micro_batches": variant.micro_batches, **r}
            if "median_seconds" in r:
                row["samples_per_second"] = batch / r["median_seconds"]
                row["spread"] = [batch / max(r["iteration_seconds"]), batch / min(r["iteration_seconds"])]
                # Emulated stages compute nothing: their losses are meaningless, so not checked.
                row["loss_matches_reference"] = None if args.emulate else (
                    abs(r["first_loss"] - reference) <= 1e-4 * max(1.0, abs(reference)))
                for other in ("graphpipe/sequential", "torch/1f1b", "torch/gpipe"):
                    if base.get(other):
                        row[f"speedup_vs_{other}"] = base[other] / r["median_seconds"]
            if variant.runtime == "graphpipe":
                key = "graphpipe" if variant.name == "graphpipe/graph" else "sequential"
                row["plan"] = plans[key]
            rows.append(row)
    bar.close()
    print_table(rows, mode)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "compare", "mode": mode, "machine": platform.platform(), "cpus": os.cpu_count(),
        "torch": torch.__version__, "commit": git_commit(), "steps": args.steps, "warmup": args.warmup,
        "calibration": calibration, "rows": rows}, indent=1))
    print(f"wrote {out}")
    write_png(rows, Path(args.png), mode)


def print_table(rows: list[dict], mode: str) -> None:
    print(f"\n### graph vs sequential pipelines ({mode}; samples/s, median of measured iterations)\n")
    print("| model | ranks | variant | M | samples/s (min-max) | vs graphpipe/sequential | vs torch/1f1b | vs torch/gpipe | loss ok | peak RSS/rank MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['world']} | {r['variant']} | {r['micro_batches']} | failed: {r['error'][:80]} | | | | | |")
            continue
        ratio = lambda k: f"{r[k]:.2f}x" if k in r else "-"  # noqa: E731
        rss = max(r["peak_rss_bytes"]) / 2**20
        print(f"| {r['model']} | {r['world']} | {r['variant']} | {r['micro_batches']} | "
              f"{r['samples_per_second']:.1f} ({r['spread'][0]:.1f}-{r['spread'][1]:.1f}) | "
              f"{ratio('speedup_vs_graphpipe/sequential')} | {ratio('speedup_vs_torch/1f1b')} | "
              f"{ratio('speedup_vs_torch/gpipe')} | { {True: 'yes', False: 'NO', None: 'n/a'}[r['loss_matches_reference']] } | {rss:.0f} |")
    for r in rows:
        if r["variant"].startswith("graphpipe/") and "plan" in r and "median_seconds" in r:
            p = r["plan"]
            print(f"- {r['model']} x{r['world']} {r['variant']}: {p['partitioner']}, {p['stages']} stages, depth "
                  f"{p['depth']}, {p['micro_batches']} x {p['micro_batch_size']}; simulated "
                  f"{1e3 * p['simulated_iteration_seconds']:.1f} ms vs {mode} {1e3 * r['median_seconds']:.1f} ms")


def write_png(rows: list[dict], path: Path, mode: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["world"]) for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4))
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        values = []
        for g in groups:
            r = next((x for x in rows if (x["model"], x["world"]) == g and x["variant"] == v), None)
            values.append(r.get("samples_per_second", 0.0) if r else 0.0)
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=v)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m}\nx{w}" for m, w in groups])
    ax.set_ylabel("samples/s")
    ax.set_title(f"graph vs sequential pipelines ({mode})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
