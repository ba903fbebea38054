"""The flight recorder's cost: a training step's time with the recorder on and off, measured
side by side (interleaved blocks of steps) on 3 CPU ranks of a small model.

    python benchmarks/flight_bench.py [--model mmt:branches=4,batch=32] [--rounds 20] [--steps 5]

Prints the median step time of the slowest rank with the recorder on (1024 records, the
watcher thread running) and off (capacity 0, watcher stopped), and their ratio."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

from graphpipe.testing import expect_ok, run_ranks, seeded_batches


def _worker(rank: int, world: int, spec: str, rounds: int, steps: int) -> dict[str, list[float]]:
    import graphpipe
    from graphpipe.models import default_loss

    model, inputs, data = seeded_batches(spec, 1)
    pipe = graphpipe.wrap(model, inputs, default_loss(spec.split(":")[0]), partitioner="sequential", timeout=60)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.01)
    batch = data[0]
    recorder = pipe.executor.flight_recorder
    for _ in range(5):
        pipe.step(*batch, optimizer=opt)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for k in range(2 * rounds):
        mode = "on" if k % 2 == 0 else "off"
        recorder.capacity = 1024 if mode == "on" else 0
        paused = mode == "off"
        if paused:  # the watcher thread is part of the cost: stopped while off
            pipe._link.flight.close()
        for _ in range(steps):
            start = time.perf_counter()
            pipe.step(*batch, optimizer=opt)
            times[mode].append(time.perf_counter() - start)
        if paused:
            pipe._link.flight._stop.clear()
            pipe._link.flight._thread = None
            pipe._link.flight.attach(recorder)
    pipe.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mmt:branches=4,batch=32")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="results/flight_recorder.json")
    args = parser.parse_args()
    results = expect_ok(run_ranks(_worker, 3, args.model, args.rounds, args.steps, timeout=900))
    out: dict[str, Any] = {}
    for mode in ("on", "off"):
        per_step = [max(r.value[mode][i] for r in results) for i in range(len(results[0].value[mode]))]
        out[mode] = statistics.median(per_step) * 1000
    print(f"{'recorder':<10} {'ms per step (median, slowest rank)':>36}")
    for mode in ("on", "off"):
        print(f"{mode:<10} {out[mode]:>36.2f}")
    print(f"{args.model}, 3 ranks, {args.rounds} x {args.steps} steps each, interleaved: on/off "
          f"{out['on'] / out['off']:.4f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"model": args.model, "ranks": 3, "rounds": args.rounds, "steps": args.steps,
                   "median_ms": out, "on_over_off": out["on"] / out["off"]}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
