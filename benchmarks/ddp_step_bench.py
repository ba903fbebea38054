"""What one torch DDP step costs on 2 Gloo CPU ranks, split into its parts, beside the simulator.

The simulator reads every real-compute row of ``compare.py --no-emulate`` fast, DDP's step as
much as graphpipe's one-stage plan (docs/results.md). This splits DDP's step on the same models
(compare.py's BENCH_SPECS, the same 16 rows per rank, SGD) into what the cost model prices
separately, each timed from a barrier, in interleaved rounds:

- ``sync``: the whole step (forward, backward with DDP's gradient all-reduce, SGD step);
- ``no sync``: the same under ``DistributedDataParallel.no_sync()`` (no communication);
- ``no sync + barrier``: that, until both ranks are done (the slower rank's compute: the skew
  of two ranks that the simulator, with one duration per task, does not see);
- ``all-reduce alone``: one all-reduce of all gradients' bytes, nothing else running.

The all-reduce's cost inside the step is ``sync`` - ``no sync + barrier``, against its cost alone.
Prints a table and writes JSON (``--out``).

    python benchmarks/ddp_step_bench.py [--models transformer mmt] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_SPECS, LR  # noqa: E402

MODES = ("sync", "no sync", "no sync + barrier", "all-reduce alone")
ROWS_PER_RANK = 16


def _one_step(mode: str, ddp: Any, inputs: Any, target: Any, loss_fn: Any, optimizer: Any, flat: Any) -> None:
    if mode == "all-reduce alone":
        dist.all_reduce(flat)
        return
    if mode == "sync":
        loss_fn(ddp(*inputs), target).backward()
    else:
        with ddp.no_sync():
            loss_fn(ddp(*inputs), target).backward()
    optimizer.step()
    optimizer.zero_grad()
    if mode == "no sync + barrier":
        dist.barrier()


def _rank(rank: int, world: int, spec: str, steps: int, warmup: int) -> dict[str, Any]:
    """One rank's timings per mode (run_ranks has joined the Gloo group, one torch thread)."""
    from graphpipe.models import build_model, default_loss

    torch.manual_seed(0)
    model, inputs = build_model(spec)
    rows = tuple(t[:ROWS_PER_RANK] for t in inputs)
    target = model.example_targets(ROWS_PER_RANK)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(warmup + steps):
        for mode in MODES:  # interleaved: a drift of the machine hits every mode alike
            dist.barrier()
            start = time.perf_counter()
            _one_step(mode, ddp, rows, target, default_loss(spec), optimizer, flat)
            if i >= warmup:
                times[mode].append(time.perf_counter() - start)
    return {"times": times, "gradient_bytes": flat.numel() * flat.element_size()}


def measure(spec: str, steps: int, warmup: int) -> dict[str, Any]:
    """One model's medians per mode (rank 0's), on 2 freshly spawned ranks."""
    from graphpipe.local_ranks import expect_ok, run_ranks

    raw = expect_ok(run_ranks(_rank, 2, spec, steps, warmup, timeout=600))[0].value
    medians = {m: statistics.median(v) for m, v in raw["times"].items()}
    return {"medians_seconds": medians, "gradient_bytes": raw["gradient_bytes"],
            "all_reduce_in_step_seconds": medians["sync"] - medians["no sync + barrier"],
            "skew_seconds": medians["no sync + barrier"] - medians["no sync"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(BENCH_SPECS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--out", default="results/ddp_step_bench.json")
    args = parser.parse_args()
    rows = []
    print("| model | step (sync) ms | no sync ms | no sync + barrier ms | all-reduce in the step ms | "
          "all-reduce alone ms | skew ms |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = measure(BENCH_SPECS[name], args.steps, args.warmup)
        m = r["medians_seconds"]
        rows.append({"model": name, "spec": BENCH_SPECS[name], **r})
        print(f"| {name} | {m['sync'] * 1e3:.1f} | {m['no sync'] * 1e3:.1f} | {m['no sync + barrier'] * 1e3:.1f} | "
              f"{r['all_reduce_in_step_seconds'] * 1e3:.1f} | {m['all-reduce alone'] * 1e3:.1f} | "
              f"{r['skew_seconds'] * 1e3:.1f} |", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "ddp_step_bench", "torch": torch.__version__, "cpus": os.cpu_count(),
                   "rows_per_rank": ROWS_PER_RANK, "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
