"""Gets the C++ ``Plan`` the runtime executes, from a Plan object, a JSON file or
text, or a dict; and builds hand-made plans for tests.

The C++ Plan is the runtime's only form of a plan: whatever the user gives goes through the C++
loader (``Plan.from_json``, plan/plan_io.h), which validates it against the traced graph,
so a bad plan raises the same FormatError or PlanningError as loading it with
``graphpipe.Plan.from_json`` does. Its JSON text (``plan.to_json(graph)``) is how ranks share
and compare plans. What is checked here is only what the runtime adds to a valid plan: ranks
within the process group, the micro-batch count asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from graphpipe._ext import _C
from graphpipe.errors import PlanningError
from graphpipe.planner import plan as make_plan

__all__ = ["plan_json", "plan_fingerprint", "load_plan", "manual_plan", "stage_assignment", "check_runnable",
           "stage_ranks"]


def plan_json(plan: Any, graph: Any) -> str:
    """The JSON text of ``plan`` (a Plan, plan JSON text or file, or the JSON form as a dict),
    as given: what ranks share and compare before each reads it with :func:`load_plan`."""
    if isinstance(plan, _C.Plan):
        return plan.to_json(graph)
    if isinstance(plan, Mapping):
        return json.dumps(dict(plan), sort_keys=True)
    if isinstance(plan, (str, os.PathLike)):
        text = str(plan)
        if text.lstrip().startswith("{"):
            return text
        with open(text, encoding="utf-8") as f:
            return f.read()
    raise PlanningError(
        f"cannot read a plan from a {type(plan).__name__}; pass a graphpipe Plan, a plan JSON file "
        "or text, or its dict"
    )


def plan_fingerprint(plan: Any, graph: Any) -> str:
    """A digest of the plan's JSON (stages, devices, micro-batches): a rank of another plan is
    another replica or stage, whose private state (a checkpoint's, a healing replica's) would be
    wrong here."""
    return hashlib.sha256(plan.to_json(graph).encode()).hexdigest()


def load_plan(plan: Any, graph: Any) -> Any:
    """The C++ Plan of ``plan`` (any form :func:`plan_json` takes), read and validated against
    ``graph`` by the C++ loader. A Plan object goes through the loader too: one built or edited
    by hand gets the same checks, and every rank then holds exactly what the text describes."""
    return _C.Plan.from_json(plan_json(plan, graph), graph)


def check_runnable(plan: Any, world_size: int, micro_batches: int | None) -> None:
    """Raises PlanningError if a valid plan cannot run on this process group: every stage's
    ranks (its replicas when it has several) within the group, with the micro-batch count asked
    for."""
    if micro_batches and int(plan.num_micro_batches) != int(micro_batches):
        raise PlanningError(
            f"the plan splits the batch into {plan.num_micro_batches} micro-batches, but "
            f"micro_batches={micro_batches} was asked for"
        )
    ranks = [r for stage in stage_ranks(plan) for r in stage]
    if max(ranks) >= world_size:
        raise PlanningError(
            f"the plan places stages on ranks {sorted(ranks)}, but the process group has only "
            f"{world_size} ranks"
        )


def stage_ranks(plan: Any) -> list[list[int]]:
    """The ranks of every stage: its devices, the lead first (several for a replicated stage)."""
    return [[int(d) for d in stage.devices] for stage in plan.stages]


def manual_plan(
    graph: Any,
    assignment: Mapping[str, int],
    num_micro_batches: int,
    batch_size: int | None = None,
    stage_devices: Mapping[int, Sequence[int]] | Sequence[Sequence[int]] | None = None,
    devices: Any = None,
    **plan_options: Any,
) -> Any:
    """A Plan from ``{operator name or module prefix: stage}``, made by the C++ manual
    partitioner (partition/manual/manual.h: the longest matching rule wins). An operator that no rule
    covers goes to the earliest stage of its consumers, as the manual partitioner does for
    inputs. Stage s runs on rank s, unless ``stage_devices`` (``{stage: [ranks]}``, or one list
    per stage) gives its ranks: several ranks make the stage data parallel, each replica taking
    its rows of every micro-batch. Stages are renumbered in a topological order of the stage
    graph. ``devices`` (a ``Devices`` description) prices the stages; default: CPU devices.
    ``plan_options`` go to :func:`graphpipe.plan` (``memory_limit``, ``optimizer``, ...): a stage
    that does not fit the memory limit with its activations gets activation recomputation where
    that makes it fit."""
    rules = {str(name): int(stage) for name, stage in assignment.items()}
    if "" not in rules:
        _follow_consumers(graph, rules)
    num_stages = max(rules.values(), default=0) + 1
    if stage_devices is None:
        return make_plan(graph, num_stages if devices is None else devices, "manual", batch_size=batch_size,
                         micro_batches=int(num_micro_batches), manual=rules, **plan_options)
    placed = dict(stage_devices) if isinstance(stage_devices, Mapping) else dict(enumerate(stage_devices))
    if devices is None:
        devices = max(max((int(d) for ranks in placed.values() for d in ranks), default=num_stages - 1) + 1,
                      num_stages)
    return make_plan(graph, devices, "manual", batch_size=batch_size, micro_batches=int(num_micro_batches),
                     manual=rules, stage_devices=placed, **plan_options)


def stage_assignment(plan: Any, graph: Any) -> dict[str, int]:
    """``{operator name: stage id}`` of ``plan``: the assignment :func:`manual_plan` takes, so
    that another plan can keep this one's cut and change its placement or replicas."""
    return {graph.node(n).name: int(stage.id) for stage in plan.stages for n in stage.nodes}


def _follow_consumers(graph: Any, rules: dict[str, int]) -> None:
    """Adds a rule for every operator that no rule covers (torch.cat in the model's own forward,
    say): the earliest stage of its consumers, so that naming the main operators suffices. Which
    rule covers an operator is the C++ manual partitioner's answer (``_C.manual_rule_stages``,
    partition/manual/manual.h: the longest matching rule), not matched again here."""
    ruled = _C.manual_rule_stages(graph, list(rules.items()))
    stage_of: dict[int, int] = {}
    for v in reversed(list(graph.topological_order())):
        if ruled[v] >= 0:
            stage_of[v] = ruled[v]
            continue
        consumers = [stage_of[w] for w in graph.successors(v) if w in stage_of]
        if consumers:
            stage_of[v] = min(consumers)
            rules[graph.node(v).name] = stage_of[v]
