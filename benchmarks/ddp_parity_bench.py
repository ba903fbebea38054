"""graphpipe's one replicated stage against torch DDP, in the same ranks, steps interleaved.

Where the planner's pick is plain data parallelism (one stage, every rank a replica), graphpipe
should train as fast as DDP. ``compare.py --no-emulate`` measures each variant in its own spawned
ranks, round after round; on a 2-core machine that drifts 10-20% from minute to minute, two runs
of the same plan there differ by up to that much. Here every variant lives in the same 2 ranks
(Gloo, one torch thread each), and they take turns every ``--chunk`` steps (rotating who goes
first), so a drift hits all alike. Variants:

- ``ddp``: DistributedDataParallel over the eager model, on each rank's half of the batch
  (compare.py's DDP step: forward, backward with DDP's gradient all-reduce, SGD, the global
  loss by an all-reduce of one number);
- ``ddp on the fx module``: the same over graphpipe's traced GraphModule of the model (whether
  the captured module is slower than the eager one);
- ``graphpipe``: ``wrap`` with the one-stage plan on both ranks, 1 micro-batch of the whole
  batch, ``step(optimizer=)``; its gradient buckets are DDP's sizes (1 MiB first, then 25 MiB);
- ``graphpipe, 1 MiB buckets``: the same with ``bucket_bytes=1 MiB``, every bucket 1 MiB (the
  runtime's layout before it took DDP's sizes);
- ``graphpipe, no sums``: the same plan under local SGD with a period longer than the run
  (``graphpipe.sync.LocalSGD``), so that no gradient is summed: its difference from
  ``graphpipe`` is what the gradient sums cost a step, in the backward they run beside and in
  the wait after it.

Prints a table (median ms per step and each variant's speed against DDP), then each rank's
milliseconds by instruction (forward, backward, the gradient sum's wait after the backward; the
medians over the timed turns' last steps, from the executor's flight recorder) for ``graphpipe``
and ``graphpipe, no sums``, and writes JSON.

    python benchmarks/ddp_parity_bench.py [--models transformer mmt] [--steps 15] [--chunk 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_SPECS, LR  # noqa: E402

MIB = 2**20
VARIANTS = ("ddp", "ddp on the fx module", "graphpipe", "graphpipe, 1 MiB buckets", "graphpipe, no sums")
#: The variants whose instructions are timed from their executors' flight recorders.
TIMED = ("graphpipe", "graphpipe, no sums")
#: A local-SGD period longer than any run: its replicas never average, so nothing is summed.
NEVER = 10**9


def _graphpipe_stepper(spec: str, inputs: Any, targets: Any, plan_json: str, bucket_bytes: float | None,
                       sums: bool = True) -> Any:
    import graphpipe
    from graphpipe.models import build_model, default_loss

    model, _ = build_model(spec)
    sync = None if sums else graphpipe.sync.LocalSGD(period=NEVER)
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), plan=plan_json, skip_nonfinite=False,
                          bucket_bytes=bucket_bytes, sync=sync)
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=LR)
    step = lambda: float(pipe.step(inputs, targets, optimizer=optimizer))  # noqa: E731
    return step, pipe


def _rank(rank: int, world: int, spec: str, plan_json: str, steps: int, chunk: int) -> dict[str, Any]:
    """Every variant's seconds per step on this rank ("seconds") and, for TIMED's variants, the
    median milliseconds of each instruction of a step ("timeline_ms"); run_ranks has joined the
    Gloo group."""
    from baselines.torch_ddp import make_stepper

    from graphpipe.models import build_model, default_loss
    from graphpipe.trace import trace_module

    torch.manual_seed(0)
    model, inputs = build_model(spec)
    batch = inputs[0].shape[0]
    targets = model.example_targets(batch, torch.Generator().manual_seed(1))
    loss_fn = default_loss(spec)
    fx_model, _ = build_model(spec)
    fx_module = trace_module(fx_model, inputs).module
    # compare.py's DDP step: this rank's shard, DDP's all-reduce, SGD, the global loss.
    ddp = {name: make_stepper(module, rank, world, loss_fn, lr=LR)
           for name, module in (("ddp", model), ("ddp on the fx module", fx_module))}
    steppers: dict[str, Any] = {name: (lambda step=step: step(tuple(inputs), targets)) for name, step in ddp.items()}
    pipes = {}
    for name, bucket, sums in (("graphpipe", None, True), ("graphpipe, 1 MiB buckets", float(MIB), True),
                               ("graphpipe, no sums", None, False)):
        steppers[name], pipes[name] = _graphpipe_stepper(spec, inputs, targets, plan_json, bucket, sums)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    instructions: dict[str, dict[str, list[float]]] = {name: {} for name in TIMED}
    warmup = 2
    for i in range(warmup + steps):
        turn = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
        for name in turn:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(chunk):  # back to back, as a training loop runs them
                steppers[name]()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) / chunk)
                if name in TIMED:
                    _record_last_step(pipes[name], instructions[name])
    for pipe in pipes.values():
        pipe.close()
    timeline = {name: {kind: statistics.median(ms) for kind, ms in kinds.items()} for name, kinds in instructions.items()}
    return {"seconds": times, "timeline_ms": timeline}


def _record_last_step(pipe: Any, into: dict[str, list[float]]) -> None:
    """Where the pipeline's last step spent its time on this rank (its executor's flight
    recorder): each instruction's milliseconds, the gradient sum's wait after the backward (which
    the simulator prices as the last bucket's all-reduce) among them."""
    records = pipe.executor.flight_recorder.records()
    last = [r for r in records if r["run"] == max(q["run"] for q in records)]
    for r in last:
        into.setdefault(r["kind"], []).append((r["end"] - r["start"]) * 1e3)


def measure(name: str, steps: int, chunk: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.local_ranks import expect_ok, run_ranks
    from graphpipe.models import build_model

    spec = BENCH_SPECS[name]
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.plan(graph, 2, "manual", manual={"": 0}, stage_devices={0: [0, 1]}, micro_batches=1)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        plan.save(graph, path)
        plan_json = Path(path).read_text()
    ranks = expect_ok(run_ranks(_rank, 2, spec, plan_json, steps, chunk, timeout=1800))
    times = ranks[0].value["seconds"]
    medians = {v: statistics.median(times[v]) for v in VARIANTS}
    return {"model": name, "spec": spec, "median_seconds": medians,
            "speed_vs_ddp": {v: medians["ddp"] / medians[v] for v in VARIANTS}, "seconds": times,
            "instructions_ms": [r.value["timeline_ms"] for r in ranks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "mmt"], choices=sorted(BENCH_SPECS))
    parser.add_argument("--steps", type=int, default=15, help="timed turns per variant")
    parser.add_argument("--chunk", type=int, default=4, help="steps per turn")
    parser.add_argument("--out", default="results/ddp_parity_bench.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    steps_ms: list[tuple[str, list[dict[str, float]]]] = []
    print("| model | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | " +
          " | ".join(f"{v} vs DDP" for v in VARIANTS[1:]) + " |")
    print("|---" * (2 * len(VARIANTS)) + "|")
    for name in args.models:
        r = measure(name, args.steps, args.chunk)
        rows.append(r)
        print(f"| {name} | " + " | ".join(f"{r['median_seconds'][v] * 1e3:.1f}" for v in VARIANTS) + " | " +
              " | ".join(f"{r['speed_vs_ddp'][v]:.3f}x" for v in VARIANTS[1:]) + " |", flush=True)
        steps_ms.append((name, r["instructions_ms"]))
    for name, ranks in steps_ms:
        for rank, timelines in enumerate(ranks):
            for variant, timeline in timelines.items():
                print(f"{name}, rank {rank}, {variant}, a step's instructions (medians): " +
                      ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in timeline.items()))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "ddp_parity_bench", "torch": torch.__version__, "cpus": os.cpu_count(),
                   "steps": args.steps, "chunk": args.chunk, "rows": rows}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
