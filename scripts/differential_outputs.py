"""Dumps the planner's, the scheduler's and the simulator's outputs for a fixed matrix, so that a
refactoring can be checked to change none of them: run it before and after, then compare.

For the paper-size models (traced on the meta device), on V100-class clusters of 8 and 16
devices: every partitioner except ``manual``, replicas allowed, not, and the default search, and every sync method's
pricing (all-reduce, hierarchical all-reduce, local SGD, top-k, PowerSGD); for each plan, its
JSON, every schedule policy's instruction lists and the simulated step.

    python scripts/differential_outputs.py --out before.json      # on the old build
    python scripts/differential_outputs.py --out after.json       # on the new one
    python scripts/differential_outputs.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import sys

import graphpipe
from graphpipe import sync
from graphpipe.models import build_model

MODELS = {
    "mmt": "mmt:size=paper,device=meta",
    "dlrm": "dlrm:size=paper,device=meta",
    "candle_uno": "candle_uno:size=paper,device=meta",
    "transformer": "transformer:size=paper,device=meta",
}
SYNC_METHODS = {
    "all_reduce": sync.AllReduce(),
    "hierarchical": sync.AllReduce(hierarchical=True),
    "local_sgd": sync.LocalSGD(period=4),
    "top_k": sync.TopK(ratio=0.01),
    "power_sgd": sync.PowerSGD(rank=2),
}


def outputs(model_names: list[str], device_counts: list[int]) -> dict[str, object]:
    """Every case's plan, schedules and simulated step, keyed by the case's name."""
    results: dict[str, object] = {}
    for model_name in model_names:
        model, example = build_model(MODELS[model_name])
        graph = graphpipe.trace(model, example)
        for devices in device_counts:
            for partitioner in [p for p in graphpipe.PARTITIONERS if p != "manual"]:
                for replicate in (False, True, None):
                    for sync_name, method in SYNC_METHODS.items():
                        if replicate is False and sync_name != "all_reduce":
                            continue  # without replicas no sync is priced
                        key = f"{model_name}/{devices}/{partitioner}/replicate={replicate}/{sync_name}"
                        results[key] = case(graph, devices, partitioner, replicate, method)
                        print(key, file=sys.stderr)
    return results


def case(graph: object, devices: int, partitioner: str, replicate: bool | None, method: object) -> dict[str, object]:
    """One plan's JSON, its schedules and their simulated steps, or the error it raised."""
    try:
        plan = graphpipe.plan(graph, devices, partitioner, device_kind="v100", replicate=replicate, sync=method)
    except graphpipe.GraphpipeError as error:
        return {"error": f"{type(error).__name__}: {error}"}
    result: dict[str, object] = {"plan": json.loads(plan.to_json(graph)), "schedules": {}}
    for policy in graphpipe.SCHEDULES:
        schedule = graphpipe.schedule(plan, policy)
        sim = graphpipe.simulate(plan, schedule_kind=schedule, device_kind="v100")
        result["schedules"][policy] = {"programs": schedule.to_json(), "step": sim.iteration_seconds, "amortized": sim.amortized_iteration_seconds}
    return result


def compare(before_path: str, after_path: str) -> int:
    """Prints the cases whose outputs differ; returns the count."""
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    differing = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in differing:
        print("differs:", key)
    print(f"{len(before)} cases before, {len(after)} after, {len(differing)} differ")
    return len(differing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--devices", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--out", default="differential_outputs.json")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.compare) else 0)
    with open(args.out, "w") as f:
        json.dump(outputs(args.models, args.devices), f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
