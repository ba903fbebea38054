"""Command line: ``python -m graphpipe <command> ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import graphpipe
from graphpipe import models
from graphpipe.errors import GraphpipeError


def _inspect(args: argparse.Namespace) -> int:
    model, inputs = models.build_model(args.model)
    graph = graphpipe.trace(model, inputs)
    if args.profile:
        graphpipe.profile(graph, model, inputs, batch_sizes=tuple(args.profile))
    print(graph.summary(), end="")
    decomposition = graph.series_parallel()
    if decomposition.is_series_parallel:
        tree = decomposition.tree
        branches = [
            node for node in tree.nodes if node.kind == graphpipe._C.SPNode.Kind.parallel
        ]
        print(f"  parallel splits: {len(branches)} (widths {sorted((len(b.children) for b in branches), reverse=True)[:8]})")
    if args.nodes:
        print(f"  {'node':<32} {'op':<14} {'target':<28} {'MFLOP/sample':>12} {'param KiB':>10} {'out KiB/sample':>14}")
        for node in graph.nodes:
            print(
                f"  {node.name:<32} {node.op:<14} {node.target[-28:]:<28} "
                f"{node.forward_flops / 1e6:>12.3f} {node.param_bytes / 1024:>10.1f} {node.output_bytes / 1024:>14.2f}"
            )
    if args.json:
        graph.save(args.json)
        print(f"  saved to {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the graphpipe command line; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="python -m graphpipe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    inspect = commands.add_parser(
        "inspect", help="trace an example model and print its operator DAG summary"
    )
    inspect.add_argument(
        "model",
        help="model spec, e.g. 'mmt:branches=4', 'dlrm:size=paper,device=meta', 'candle_uno', 'transformer'",
    )
    inspect.add_argument("--json", metavar="PATH", help="also save the graph as JSON")
    inspect.add_argument("--nodes", action="store_true", help="print one line per operator")
    inspect.add_argument(
        "--profile", type=int, nargs="+", metavar="BATCH", help="measure operators at these batch sizes"
    )
    inspect.set_defaults(run=_inspect)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (GraphpipeError, ValueError) as exc:
        print(f"graphpipe: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
