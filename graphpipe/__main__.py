"""Command line: ``python -m graphpipe <command> ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import graphpipe
from graphpipe import models
from graphpipe._ext import _C
from graphpipe.errors import GraphpipeError
from graphpipe.planner import DEVICE_KINDS, OPTIMIZERS, PARTITIONERS
from graphpipe.simulation import SCHEDULES


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


def _graph_path(plan_path: str) -> str:
    stem = plan_path[:-5] if plan_path.endswith(".json") else plan_path
    return stem + ".graph.json"


def _plan(args: argparse.Namespace) -> int:
    model, inputs = models.build_model(args.model)
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.plan(
        graph,
        graphpipe.devices(args.devices, args.device_kind),
        args.partitioner,
        micro_batches=args.micro_batches,
        memory_limit=args.memory_limit,
        optimizer=args.optimizer,
    )
    print(plan.to_string(graph) if args.nodes else str(plan), end="")
    if args.out:
        plan.save(graph, args.out)
        graph.save(_graph_path(args.out))
        print(f"saved {args.out} (and its graph, {_graph_path(args.out)})")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    graph = graphpipe.OpGraph.load(args.graph or _graph_path(args.plan))
    plan = graphpipe.Plan.load(args.plan, graph)
    devices = graphpipe.devices(plan.num_devices, args.device_kind)
    result = graphpipe.simulate(plan, devices, args.schedule, overlap=not args.no_overlap)
    print(result.summary(), end="" if result.summary().endswith("\n") else "\n")
    if args.png or args.trace or args.dag:
        from graphpipe import viz

        if args.png:
            viz.gantt_png(result, args.png)
            print(f"wrote {args.png}")
        if args.dag:
            viz.stage_dag_png(plan, args.dag)
            print(f"wrote {args.dag}")
        if args.trace:
            viz.write_chrome_trace(result, args.trace)
            print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from graphpipe.runtime.flight import diagnose_folder

    if not os.path.isdir(args.folder):
        raise ValueError(f"{args.folder} is not a folder")
    lines, culprit = diagnose_folder(args.folder)
    print("\n".join(lines))
    return 0 if culprit is not None else 1


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

    plan = commands.add_parser("plan", help="cut a model into pipeline stages and print the plan")
    plan.add_argument("model", help="model spec (see inspect)")
    plan.add_argument("--devices", type=int, default=4, help="number of devices (default 4)")
    plan.add_argument("--device-kind", default="cpu", help=f"{', '.join(DEVICE_KINDS)} or a devices .json (default cpu)")
    placed_by_planner = [p for p in PARTITIONERS if not _C.partitioner_places_by_user(p)]
    plan.add_argument("--partitioner", default="graphpipe", choices=placed_by_planner)
    plan.add_argument("--micro-batches", type=int, help="fix the number of micro-batches")
    plan.add_argument("--memory-limit", help="bytes per device, e.g. 16GiB (default: device memory)")
    plan.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    plan.add_argument("--nodes", action="store_true", help="list each stage's operators")
    plan.add_argument("--out", metavar="PATH", help="save the plan (and PATH.graph.json) as JSON")
    plan.set_defaults(run=_plan)

    simulate = commands.add_parser("simulate", help="simulate one training iteration of a saved plan")
    simulate.add_argument("plan", help="plan JSON written by `plan --out`")
    simulate.add_argument("--graph", help="its graph JSON (default: beside the plan)")
    simulate.add_argument("--device-kind", default="cpu", help="devices the plan was made for")
    simulate.add_argument("--schedule", default=None, choices=SCHEDULES,
                          help="default: the schedule the plan was made for")
    simulate.add_argument("--no-overlap", action="store_true", help="transfers block compute")
    simulate.add_argument("--png", metavar="PATH", help="Gantt chart of ranks over time")
    simulate.add_argument("--dag", metavar="PATH", help="drawing of the stage DAG")
    simulate.add_argument("--trace", metavar="PATH", help="Chrome trace JSON (Perfetto)")
    simulate.set_defaults(run=_simulate)

    diagnose = commands.add_parser(
        "diagnose", help="read the flight recorder dumps of a failed pipeline and name the culprit rank"
    )
    diagnose.add_argument("folder", help="the dump folder (wrap's flight_recorder_dir, default <tmp>/graphpipe-flight)")
    diagnose.set_defaults(run=_diagnose)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (GraphpipeError, ValueError) as exc:
        print(f"graphpipe: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
