"""What the non-finite step guard costs (not a test): the same plan trained on the same CPU ranks
with ``skip_nonfinite=True`` (the default: the optimizer steps after the closing all-reduce that
carries every rank's flag) and ``skip_nonfinite=False`` (the optimizer steps before it, overlapping
the other ranks' remaining backward), side by side in one run.

    python benchmarks/guard_bench.py [--model mmt:branches=4,batch=32,seed=0] [--world 3] [--steps 30]

Both pipelines are built on the same ranks and stepped alternately (guarded, unguarded; then the
other way round), a barrier before each timed step, so drift on this noisy machine hits both
alike. Real compute, Gloo, one torch thread per rank; the median step of each is reported with
their ratio. Results go to results/guard_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from graphpipe.testing import run_ranks


def _worker(rank: int, world: int, spec: str, steps: int) -> dict[str, list[float]]:
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import build_model, default_loss

    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0] if isinstance(inputs, tuple) else inputs.shape[0],
                                    torch.Generator().manual_seed(1))
    plan = graphpipe.plan(graphpipe.trace(model, inputs), world, "graphpipe", micro_batches=4)
    pipes = {guarded: graphpipe.wrap(model, inputs, default_loss(spec), plan=plan, timeout=120,
                                     skip_nonfinite=guarded) for guarded in (True, False)}
    opts = {g: torch.optim.Adam(list(p.parameters()), lr=1e-4) for g, p in pipes.items()}
    times: dict[str, list[float]] = {"guarded": [], "unguarded": []}
    for k in range(steps + 2):
        order = (True, False) if k % 2 == 0 else (False, True)
        for guarded in order:
            dist.barrier()
            start = time.perf_counter()
            pipes[guarded].step(inputs, targets, optimizer=opts[guarded])
            if k >= 2:  # two warm-up rounds
                times["guarded" if guarded else "unguarded"].append(time.perf_counter() - start)
    for p in pipes.values():
        p.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mmt:branches=4,batch=32,seed=0")
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    results = run_ranks(_worker, args.world, args.model, args.steps, timeout=900)
    for r in results:
        if not r.ok:
            raise SystemExit(f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}")
    # The step's time is its slowest rank's: the rank that returns last.
    per_step = {key: [max(r.value[key][i] for r in results) for i in range(args.steps)]
                for key in ("guarded", "unguarded")}
    median = {key: statistics.median(v) * 1e3 for key, v in per_step.items()}
    ratio = median["guarded"] / median["unguarded"]
    print(f"{args.model} on {args.world} CPU ranks, {args.steps} interleaved steps each (median, slowest rank)")
    print("| skip_nonfinite | step ms |\n| --- | --- |")
    print(f"| True (default) | {median['guarded']:.1f} |\n| False | {median['unguarded']:.1f} |")
    print(f"guarded / unguarded: {ratio:.3f}")
    os.makedirs("results", exist_ok=True)
    with open("results/guard_bench.json", "w", encoding="utf-8") as f:
        json.dump({"model": args.model, "world": args.world, "steps": args.steps, "median_ms": median,
                   "ratio": ratio, "per_step_s": per_step}, f, indent=1)


if __name__ == "__main__":
    main()
