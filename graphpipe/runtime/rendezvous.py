"""What every rank of a new pipeline must agree on before it runs: the traced model, the plan
(made once, on rank 0, or given) and the options.

Ranks exchange through the pipeline's :class:`~graphpipe.runtime.failure.FailureBoard` (the
c10d store, every wait with the deadline), so a rank that fails here, or that was given another
model or other options, is named on every rank instead of leaving the others in a collective.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError, PlanningError
from graphpipe.planner import plan as make_plan
from graphpipe.runtime import microbatch
from graphpipe.runtime.failure import FailureBoard
from graphpipe.runtime.microbatch import call_inputs, to_device
from graphpipe.runtime.options import WrapOptions
from graphpipe.runtime.plan import check_runnable, load_plan, plan_json
from graphpipe.runtime.stages import flatten_values
from graphpipe.runtime.sync_batchnorm import StageSyncBatchNorm, adopt_sync_batchnorm
from graphpipe.sync import SyncMethod
from graphpipe.trace import trace_module

__all__ = ["Agreed", "rendezvous", "trace_model"]


@dataclass
class Agreed:
    """The outcome of :func:`rendezvous`, the same on every rank."""

    traced: Any              # graphpipe.trace's result for this rank's model
    example_args: tuple      # (args, kwargs) of the example inputs, on the model's device
    plan: Any                # the C++ Plan, read and validated by the C++ loader


def trace_model(model: nn.Module, example_args: tuple, options: WrapOptions) -> tuple[Any, tuple]:
    """The model's trace and the example's ``(args, kwargs)`` (``example_args``, as
    ``microbatch.call_inputs`` gives them). The trace runs the model once: example inputs go
    where its parameters are (a model on a GPU may be given CPU example inputs, as step() may be
    given CPU batches), under ``options.autocast`` (so the graph records the bytes of the
    activations the steps will move)."""
    args, kwargs = example_args
    home = next((p.device for p in model.parameters()), torch.device("cpu"))
    if home.type != "cpu":
        args, kwargs = to_device((args, kwargs), home)
    leaf_modules = options.leaf_modules
    # SyncBatchNorm runs on CPU and over the stage's replicas (sync_batchnorm.py): one operator.
    if adopt_sync_batchnorm(model):
        leaf_modules = (*leaf_modules, StageSyncBatchNorm)
    # trace_module leaves the model's buffers (BatchNorm statistics) as they were.
    with options.autocast_context(home):
        traced = trace_module(model, args, kwargs, leaf_modules=leaf_modules, capture=options.capture)
    return traced, (args, kwargs)


def rendezvous(board: FailureBoard, rank: int, world_size: int, model: nn.Module, example_inputs: Any,
               options: WrapOptions, sync_method: SyncMethod) -> Agreed:
    """Traces the model, gets the plan (rank 0 plans unless one was given), checks that every
    rank has the same model, plan and options, and loads the plan through the C++ loader."""
    traced, example_args = board.guard(lambda: trace_model(model, call_inputs(example_inputs), options))
    planning_options = options.planning(sync_method) if options.plan is None else {}
    if _fixed_at_whole_batch(traced, example_args, planning_options):
        traced, example_args = _capture_micro_batch(board, rank, world_size, model, traced, example_args, options,
                                                    planning_options)
    if options.plan is None:
        planning = _describe_options(planning_options)
        plan = _plan_on_rank0(board, rank, world_size, traced.graph, planning_options)
    else:
        options.refuse_ignored_planning()
        plan, planning = options.plan, {}
    text = board.guard(lambda: plan_json(plan, traced.graph))
    # Agreement first, so that a rank with another model is named as such rather than failing
    # to read a plan made for a graph it does not have.
    _agree(board, rank, _description(traced, model, text, options, sync_method, planning))
    # Every rank reads the plan text through the C++ loader, which validates it against this
    # rank's trace: a bad plan raises the loader's own error here, on every rank.
    loaded = board.guard(lambda: _load_runnable(text, traced.graph, world_size, options.micro_batches))
    return Agreed(traced=traced, example_args=example_args, plan=loaded)


def _fixed_at_whole_batch(traced: Any, example_args: tuple, planning_options: Mapping[str, Any]) -> bool:
    """Whether torch.export fixed the batch size at the example's (the model's code depends on
    it) where the example is the step's whole batch: a planning ``batch_size`` of several
    examples says the example is one micro-batch already."""
    if traced.static_batch is None:
        return False
    batch = planning_options.get("batch_size")
    return batch is None or int(batch) == traced.static_batch


def _capture_micro_batch(board: FailureBoard, rank: int, world_size: int, model: nn.Module, traced: Any,
                         example_args: tuple, options: WrapOptions, planning_options: dict[str, Any]) -> tuple[Any, tuple]:
    """A model whose code depends on the batch size runs, once captured, at that batch only;
    the pipeline runs it on micro-batches. So it is captured again on the example's first rows,
    one micro-batch: the count given, the one the plan given was made for, or the planner's
    choice for the whole-batch graph. The planner then plans for the whole batch."""
    micro = options.micro_batches or getattr(options.plan, "num_micro_batches", None)
    if micro is None and options.plan is None:
        text = _plan_on_rank0(board, rank, world_size, traced.graph, dict(planning_options), key="whole-batch plan")
        micro = board.guard(lambda: load_plan(text, traced.graph)).num_micro_batches
    return board.guard(lambda: _recapture(model, traced, example_args, options, planning_options, micro))


def _recapture(model: nn.Module, traced: Any, example_args: tuple, options: WrapOptions,
               planning_options: dict[str, Any], micro: int | None) -> tuple[Any, tuple]:
    name, rows = type(model).__name__, traced.static_batch
    if micro is None:
        raise InputError(f"{name}'s code depends on the batch size, so graphpipe captures it at the micro-batch "
                         "size, which the plan given does not say: pass micro_batches= to wrap")
    micro = int(micro)
    if micro == 1:
        return traced, example_args
    if rows % micro != 0:
        raise InputError(f"{name}'s code depends on the batch size, so graphpipe captures it at the micro-batch size, "
                         f"but the example's {rows} rows do not split into {micro} micro-batches")
    size = rows // micro
    # The core's logger (GRAPHPIPE_LOG_LEVEL=debug shows it), the one the planner logs through.
    _C.log("debug", f"{name}: torch.export fixed the batch size at the example's {rows} rows (the model's code "
                    f"depends on it); captured again at the micro-batch size, on the example's first {size} rows")
    if options.plan is None:
        planning_options["micro_batches"] = micro
        planning_options.setdefault("batch_size", rows)
    return trace_model(model, microbatch.rows(example_args, 0, size), options)


def _load_runnable(text: str, graph: Any, world_size: int, micro_batches: int | None) -> Any:
    loaded = load_plan(text, graph)
    check_runnable(loaded, world_size, micro_batches)
    return loaded


def _plan_on_rank0(board: FailureBoard, rank: int, world_size: int, graph: Any, options: dict[str, Any],
                   key: str = "plan") -> str:
    """Rank 0 plans through :func:`graphpipe.plan` (the one front door to the partitioners, with
    every option it takes; ``devices`` defaults to one per rank of the group) and shares the
    plan's JSON text through the store, so every rank runs the same one (and a planning error
    reaches every rank instead of leaving the others waiting)."""
    if rank == 0:
        try:
            if options.get("devices") is None:
                options["devices"] = world_size
            made = make_plan(graph, **options)
            value = ("ok", made.to_json(graph))
        except Exception as exc:
            value = ("error", f"{type(exc).__name__}: {exc}")
        board.share(key, value)
    status, value = board.collect(key, ranks=[0], what=key)[0]
    if status != "ok":
        raise PlanningError(f"partitioning on rank 0 failed: {value}")
    return value


def _description(traced: Any, model: nn.Module, plan_text: str, options: WrapOptions, sync_method: SyncMethod,
                 planning: dict[str, str]) -> dict[str, Any]:
    """What every rank must have alike, field by field (compared by :func:`_agree`)."""
    graph = traced.graph
    return {
        "model operators": (graph.num_nodes, graph.fingerprint()),
        "parameters": [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
        "example inputs": [(tuple(t.shape), str(t.dtype)) for t in flatten_values(list(traced.placeholder_values))],
        "operator output bytes": [graph.node(i).output_bytes for i in range(graph.num_nodes)],
        # Before the plan: rank 0 alone plans, so another rank's options would otherwise be
        # ignored without a word.
        "planning options": planning,
        "plan": plan_text,
        "schedule": options.schedule.to_json() if options.given_schedule() else options.schedule,
        "micro_batches": options.micro_batches,
        "timeout": float(options.timeout),
        "sync method": repr(sync_method),
        "skip_nonfinite": bool(options.skip_nonfinite),
        "autocast": str(options.autocast),
        "check_replicas_every": options.check_replicas_every,
    }


def _agree(board: FailureBoard, rank: int, mine: dict[str, Any]) -> None:
    """Every rank must run the same model, plan and options: each shares a description and
    compares it with every other rank's, so a rank that differs fails here, on every rank,
    naming the first difference, instead of desynchronising (or aborting) in a step."""
    board.share("agreement", mine)
    everyone = board.collect("agreement", what="model description")
    for r, theirs in sorted(everyone.items()):
        for field_name, value in mine.items():
            if theirs.get(field_name) != value:
                raise InputError(
                    f"graphpipe.wrap: rank {r} differs from rank {rank} in its {field_name}: "
                    f"{_first_difference(theirs.get(field_name), value)}. Every rank must pass the "
                    "same model, example inputs and options"
                )


def _describe_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The planning options as comparable text (a Devices description by its JSON, not its
    address), for the agreement check."""
    def text(value: Any) -> str:
        return value.to_json() if isinstance(value, _C.Devices) else repr(value)

    return {k: text(v) for k, v in sorted(options.items())}


def _first_difference(theirs: Any, mine: Any) -> str:
    """The first place where two descriptions differ, both sides shown."""
    if isinstance(theirs, list) and isinstance(mine, list):
        for i, (a, b) in enumerate(zip(theirs, mine)):
            if a != b:
                return f"entry {i} is {a!r} there and {b!r} here"
        return f"{len(theirs)} entries there and {len(mine)} here"
    text_a, text_b = repr(theirs), repr(mine)
    if len(text_a) > 200 or len(text_b) > 200:
        i = next((k for k, (a, b) in enumerate(zip(text_a, text_b)) if a != b), min(len(text_a), len(text_b)))
        return f"...{text_a[max(0, i - 60):i + 60]}... there and ...{text_b[max(0, i - 60):i + 60]}... here"
    return f"{text_a} there and {text_b} here"
