"""Times graphpipe.trace (fx trace + FLOP counting + OpGraph construction) from 100 to 10,000 operators.

Models are CANDLE-Uno-shaped (parallel MLP branches joined by a concatenation), narrow so that
the time measured is graphpipe's, not the arithmetic's. Prints a table, writes JSON.

    python benchmarks/trace_bench.py [--out results/trace_bench.json] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

import graphpipe
from graphpipe.models import CandleUno, CandleUnoConfig

# (branches, depth): about 2 * branches * depth operators (Linear + ReLU per layer).
SIZES = [(2, 25), (10, 50), (20, 125), (50, 100)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/trace_bench.json")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    warm = CandleUno(CandleUnoConfig(branches=2, feature_in=8, width=8, depth=2, top_width=8, top_depth=1, out=1))
    graphpipe.trace(warm, warm.example_inputs(4))  # first-call costs (imports, fx caches) stay out
    print(f"{'branches':>8} {'depth':>6} {'operators':>10} {'edges':>8} {'trace s (median)':>17} {'us/operator':>12}")
    for branches, depth in SIZES:
        config = CandleUnoConfig(branches=branches, feature_in=8, width=8, depth=depth, top_width=8, top_depth=1, out=1)
        model = CandleUno(config)
        inputs = model.example_inputs(4)
        times = []
        graph = None
        for _ in range(args.repeats):
            start = time.perf_counter()
            graph = graphpipe.trace(model, inputs)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows.append({"branches": branches, "depth": depth, "operators": graph.num_nodes,
                     "edges": graph.num_edges, "seconds": median, "all_seconds": times})
        print(f"{branches:>8} {depth:>6} {graph.num_nodes:>10} {graph.num_edges:>8} {median:>17.3f} "
              f"{1e6 * median / graph.num_nodes:>12.1f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "trace", "torch": torch.__version__, "machine": platform.platform(),
                   "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
