"""Gets the Plan the runtime executes, in its JSON form (partition/plan_io.h), from a partitioner,
a Plan object, a JSON file or text, or a dict; and builds hand-made plans for tests."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from graphpipe._ext import _C
from graphpipe.errors import PlanningError

__all__ = ["resolve_plan", "manual_plan", "partition_plan", "stage_devices"]


def _to_dict(plan: Any, graph: Any) -> dict[str, Any]:
    if isinstance(plan, Mapping):
        return dict(plan)
    if isinstance(plan, (str, os.PathLike)):
        text = str(plan)
        if not text.lstrip().startswith("{"):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        return json.loads(text)
    for attr in ("to_json", "dumps", "to_dict"):
        method = getattr(plan, attr, None)
        if method is None:
            continue
        try:
            value = method(graph)
        except TypeError:
            value = method()
        return json.loads(value) if isinstance(value, str) else dict(value)
    dumps = getattr(_C, "dumps_plan", None) or getattr(_C, "plan_to_json", None)
    if dumps is not None:
        value = dumps(plan, graph)
        return json.loads(value) if isinstance(value, str) else dict(value)
    raise PlanningError(
        f"cannot read a plan from a {type(plan).__name__}; pass a graphpipe Plan, a plan JSON file "
        "or text, or its dict"
    )


def partition_plan(
    graph: Any, world_size: int, partitioner: str, micro_batches: int | None, devices: Any = None
) -> dict[str, Any]:
    """Runs a partitioner of the C++ core (graphpipe._C.partition) and returns the plan's dict.

    ``devices`` defaults to ``world_size`` CPU ranks with the documented constants (not measured,
    so that every rank that calls this gets the same plan)."""
    fn = getattr(_C, "partition", None)
    if fn is None:
        raise PlanningError(
            "this build of graphpipe has no partitioner bindings (graphpipe._C.partition); pass "
            "plan=... (a Plan, plan JSON or graphpipe.runtime.manual_plan(...)) to graphpipe.wrap"
        )
    if devices is None:
        devices = _C.Devices.cpu_rank(world_size, measure=False)
    kwargs: dict[str, Any] = {"partitioner": partitioner}
    if micro_batches:
        kwargs["num_micro_batches"] = int(micro_batches)
    plan = fn(graph, devices, **kwargs)
    return _to_dict(plan, graph)


def resolve_plan(
    plan: Any, graph: Any, world_size: int, partitioner: str, micro_batches: int | None
) -> dict[str, Any]:
    """The plan as a dict: stages (nodes by name, devices), edges (src, dst), micro-batching."""
    if plan is None:
        plan = partition_plan(graph, world_size, partitioner, micro_batches)
    d = _to_dict(plan, graph)
    for key in ("stages", "edges", "num_micro_batches"):
        if key not in d:
            raise PlanningError(f"the plan has no {key!r} field")
    if micro_batches and int(d["num_micro_batches"]) != int(micro_batches):
        raise PlanningError(
            f"the plan splits the batch into {d['num_micro_batches']} micro-batches, but "
            f"micro_batches={micro_batches} was asked for"
        )
    used = stage_devices(d)
    if max(r for devs in used for r in devs) >= world_size:
        raise PlanningError(
            f"the plan places stages on ranks {sorted(r for devs in used for r in devs)}, but the "
            f"process group has only {world_size} ranks"
        )
    return d


def stage_devices(plan: Mapping[str, Any]) -> list[list[int]]:
    out = []
    for s, st in enumerate(plan["stages"]):
        devs = [int(r) for r in st.get("devices", [s])]
        if len(devs) != 1:
            raise PlanningError(
                f"stage {s} is placed on devices {devs}; the runtime runs each stage on one rank "
                "(data parallelism inside a stage is not supported yet)"
            )
        out.append(devs)
    return out


def manual_plan(
    graph: Any,
    assignment: Mapping[str, int],
    num_micro_batches: int,
    batch_size: int | None = None,
) -> dict[str, Any]:
    """A plan dict from ``{operator name: stage}`` (stage s on rank s). Inputs not listed go to
    the stage of their first consumer. Stages must be numbered in a topological order."""
    names = [graph.node(i).name for i in range(graph.num_nodes)]
    stage_of: dict[int, int] = {}
    for i, name in enumerate(names):
        if name in assignment:
            stage_of[i] = int(assignment[name])
    for i in reversed(list(graph.topological_order())):
        name = names[i]
        if i not in stage_of:
            succ = [stage_of[j] for j in graph.successors(i) if j in stage_of]
            if not succ:
                raise PlanningError(f"manual_plan: operator {name!r} has no stage")
            stage_of[i] = min(succ)
    num_stages = max(stage_of.values()) + 1
    stages = [{"id": s, "nodes": [], "devices": [s]} for s in range(num_stages)]
    for i in graph.topological_order():
        stages[stage_of[i]]["nodes"].append(names[i])
    edges: dict[tuple[int, int], list[int]] = {}
    for eid in range(graph.num_edges):
        e = graph.edge(eid)
        a, b = stage_of[e.src], stage_of[e.dst]
        if a == b:
            continue
        if a > b:
            raise PlanningError(f"manual_plan: edge {names[e.src]} -> {names[e.dst]} goes from stage {a} back to {b}")
        edges.setdefault((a, b), []).append(eid)
    batch = int(batch_size or graph.trace_batch_size)
    return {
        "format": "graphpipe.plan",
        "partitioner": "manual",
        "batch_size": batch,
        "micro_batch_size": batch // num_micro_batches,
        "num_micro_batches": num_micro_batches,
        "num_devices": num_stages,
        "stages": stages,
        "edges": [{"src": a, "dst": b, "edges": ids} for (a, b), ids in sorted(edges.items())],
    }
