"""How well graphpipe.profile's per-operator times add up to the model's real forward and backward.

The cost model sums per-operator times into stage times, so their sum over the whole graph
should be what a training step of the whole model costs. For each benchmark model (compare.py's
sizes) and micro-batch size, this profiles the graph, then times the eager model's forward and
backward (loss included) in this process, and prints both with the profile's error; one torch
thread, medians over ``--repeats`` runs. Writes results/profile_bench.json.

    python benchmarks/profile_bench.py [--models mmt dlrm candle_uno transformer] [--batches 8 32]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_SPECS, git_commit  # noqa: E402

import graphpipe  # noqa: E402
from graphpipe.models import build_model, default_loss  # noqa: E402


def _rows(value: Any, batch: int, size: int) -> Any:
    return [t[:size] if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == batch else t for t in value]


def real_step(model: Any, inputs: Any, targets: Any, loss_fn: Any, repeats: int) -> tuple[float, float]:
    """Median (forward, backward) seconds of the eager model on one batch."""
    forward, backward = [], []
    for i in range(repeats + 2):
        start = time.perf_counter()
        loss = loss_fn(model(*inputs), targets)
        middle = time.perf_counter()
        loss.backward()
        end = time.perf_counter()
        if i >= 2:  # warm-up
            forward.append(middle - start)
            backward.append(end - middle)
    model.zero_grad(set_to_none=True)
    return statistics.median(forward), statistics.median(backward)


def measure(name: str, batches: list[int], repeats: int) -> list[dict[str, Any]]:
    spec = BENCH_SPECS.get(name, name)
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    full = inputs[0].shape[0]
    sizes = sorted({b for b in batches if b <= full})
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=tuple(sizes), repeats=repeats, warmup=2)
    targets = model.example_targets(full)
    rows = []
    for i, size in enumerate(sizes):
        fwd, bwd = real_step(model, _rows(inputs, full, size), targets[:size], default_loss(spec), repeats)
        pf = sum(n.profile[i].forward_seconds for n in graph.nodes)
        pb = sum(n.profile[i].backward_seconds for n in graph.nodes)
        rows.append({"model": name, "spec": spec, "micro_batch": size, "operators": graph.num_nodes,
                     "real_forward_seconds": fwd, "profile_forward_seconds": pf,
                     "real_backward_seconds": bwd, "profile_backward_seconds": pb})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(BENCH_SPECS))
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", default="results/profile_bench.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row for name in args.models for row in measure(name, args.batches, args.repeats)]

    def ms(x: float) -> str:
        return f"{x * 1e3:.2f}"

    def err(profile: float, real: float) -> str:
        return f"{(profile - real) / real:+.1%}"

    print("| model | micro-batch | operators | forward real / profile (ms) | error | backward real / profile (ms) | error |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['micro_batch']} | {r['operators']} | "
              f"{ms(r['real_forward_seconds'])} / {ms(r['profile_forward_seconds'])} | "
              f"{err(r['profile_forward_seconds'], r['real_forward_seconds'])} | "
              f"{ms(r['real_backward_seconds'])} / {ms(r['profile_backward_seconds'])} | "
              f"{err(r['profile_backward_seconds'], r['real_backward_seconds'])} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "profile_bench", "machine": platform.platform(),
                               "torch": torch.__version__, "commit": git_commit(), "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
