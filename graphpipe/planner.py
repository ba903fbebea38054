"""Front door to the C++ partitioners: ``graphpipe.plan`` and device descriptions.

All the work (cost model, METIS, the series-parallel dynamic program, the sequential baseline,
micro-batch choice, plan validation) happens in the core (csrc/cost, csrc/partition); this
module only turns Python arguments into the core's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError
from graphpipe.sync import named as named_sync
from graphpipe.trace import autocast_for, trace

__all__ = ["plan", "retime", "devices", "all_reduce_cost", "parse_bytes", "sync_method", "PARTITIONERS", "DEVICE_KINDS",
           "OPTIMIZERS", "PRECISIONS"]

#: Partitioner names accepted by :func:`plan`, as the C++ registry lists them.
PARTITIONERS: tuple[str, ...] = tuple(_C.partitioner_names())
#: Device kinds accepted by :func:`devices`: the C++ presets (CPU ranks and documented GPUs).
DEVICE_KINDS: tuple[str, ...] = tuple(_C.device_presets())
#: Optimizers the cost model prices (their state counts toward memory).
OPTIMIZERS: tuple[str, ...] = tuple(_C.optimizer_names())
#: Compute precisions the cost model prices (``plan(dtype=...)``, ``OpGraph.compute_dtype``).
PRECISIONS: tuple[str, ...] = tuple(_C.precision_names())

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20, "mib": 2**20,
          "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40, "tib": 2**40}


def parse_bytes(value: float | int | str) -> float:
    """``16e9``, ``"16GiB"``, ``"512 MB"`` -> bytes (binary units: 1 GB = 2**30 bytes here)."""
    if isinstance(value, (int, float)):
        return float(value)
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise InputError(f"cannot read a memory size from {value!r} (examples: 16GiB, 512MB, 1e9)")
    return float(match.group(1)) * _UNITS[match.group(2).lower()]


def devices(count: int, kind: str = "cpu", *, measure: bool = False, per_node: int | None = None) -> Any:
    """A device description for the cost model: ``count`` devices of ``kind``.

    ``cpu`` describes CPU ranks (``measure=True`` calibrates throughput on this machine and the
    runtime's per-instruction and per-step costs, ``instruction_overhead_seconds`` and
    ``step_overhead_seconds``, and the link a collective sees, ``collective_latency_seconds`` and
    ``collective_bandwidth_bytes_per_second``, and what a collective beside the compute costs
    it, ``collective_overlap_loss``, each optimizer's step per parameter tensor,
    ``optimizer_tensor_seconds``, and the wait for the slowest rank per second of compute,
    ``rank_skew_fraction``, with ``count`` ranks at once, in a few seconds:
    graphpipe.calibration; the default uses
    documented constants so that every rank computes the same plan), on one host
    unless ``per_node`` groups them onto several (10 GbE between hosts); ``v100`` and ``h100``
    are documented GPU presets with fast links inside a node and slower ones across nodes
    (``per_node`` GPUs to a node; default 4 and 8). A JSON file path (``*.json``) loads a saved
    description. ``.node`` lists each device's node, which the all-reduce cost
    (:func:`all_reduce_cost`) reads.
    """
    if count < 1:
        raise InputError(f"devices: count must be at least 1, got {count}")
    if per_node is not None and per_node < 1:
        raise InputError(f"devices: per_node must be at least 1, got {per_node}")
    if kind.endswith(".json"):
        if per_node is not None:
            raise InputError(f"devices: {kind} describes its own nodes; per_node applies to presets")
        loaded = _C.Devices.load(kind)
        if loaded.count != count:
            raise InputError(f"{kind} describes {loaded.count} devices, {count} were asked for")
        return loaded
    if kind == "cpu":
        described = _C.Devices.cpu_rank(count, measure=measure, per_node=per_node or 0)
        if measure:  # the runtime's dispatch and per-step costs, and the collective link, measured
            # with ``count`` ranks at once (graphpipe/calibration.py)
            from graphpipe.calibration import apply_runtime_costs

            apply_runtime_costs(described, concurrency=count)
            if per_node is not None and per_node < count:
                # Measured on this one host, the collective link knows nothing of the links
                # between hosts: the hierarchy is priced from the described links instead.
                described.collective_latency_seconds = 0.0
                described.collective_bandwidth_bytes_per_second = 0.0
        return described
    # The preset lookup raises PlanningError naming the presets for an unknown kind.
    return _C.Devices.preset(kind, count, per_node=per_node or 0)


def all_reduce_cost(devices: Any, group: Sequence[int], nbytes: float, algorithm: str = "best") -> Any:
    """What summing ``nbytes`` over the devices in ``group`` costs on ``devices`` (the C++ cost
    model's figure, csrc/cost/all_reduce.h): ``algorithm`` is ``ring``, ``hierarchical`` (inside
    each node, then across nodes) or ``best`` of the two. Returns an ``AllReduceCost`` with
    ``algorithm``, ``seconds`` and the bytes each device sends inside and across nodes."""
    return _C.all_reduce_cost(devices, list(group), float(nbytes), algorithm)


_describe_devices = devices  # plan() takes a parameter named `devices`


def plan(
    model_or_graph: nn.Module | Any,
    devices: int | Any = 2,
    partitioner: str = "graphpipe",
    *,
    example_inputs: Any = None,
    batch_size: int | None = None,
    micro_batches: int | None = None,
    micro_batch_size: int | None = None,
    memory_limit: float | str | None = None,
    optimizer: str = "adam",
    manual: Mapping[str, int] | Sequence[tuple[str, int]] | None = None,
    device_kind: str = "cpu",
    seed: int = 0,
    replicate: bool | None = None,
    stage_devices: Mapping[int, Sequence[int]] | None = None,
    schedule: str = "1f1b",
    sync: Any = None,
    bucket_bytes: float | None = None,
    dtype: str | torch.dtype | None = None,
    stages_per_rank: int | None = None,
    fold_budget_limit: int = 8,
    fold: str | None = None,
    cross_replica: Any = None,
) -> Any:
    """Cuts a model (or its traced ``OpGraph``) into pipeline stages.

    Args:
        model_or_graph: an ``nn.Module`` (traced with ``example_inputs``) or an ``OpGraph``.
        devices: a device count (described by ``device_kind``) or a ``Devices`` description.
        partitioner: a name from ``PARTITIONERS``: ``graphpipe`` (the paper's series-parallel
            DP), ``metis`` (METIS + acyclic repair + refinement), ``sequential`` (the chain
            baseline; with replicas PipeDream's planner), ``piper`` (Piper's planner) or
            ``manual``; an unknown name raises the registry's PlanningError.
        batch_size: mini-batch size (default: the traced one). micro_batches / micro_batch_size: fix
            the micro-batching; by default it is chosen with the stages (powers of two dividing the batch).
        memory_limit: bytes per device (number or ``"16GiB"``); default: the device's memory.
        optimizer: a name from ``OPTIMIZERS`` (optimizer state counts toward memory).
        manual: for ``partitioner="manual"``: module-name prefix -> stage.
        replicate: let stages run on several devices as data-parallel replicas, with plain data
            parallelism and the plans without replicas on 1, 2, 4 and 8 devices among the
            candidates (a tie: no replicas). ``False``: one device per stage. ``None`` (default):
            also those on every count up to 16, and replicas by simulation.
        stage_devices: for ``partitioner="manual"``: stage -> device ids (``{0: [0, 1], 1: [2]}``);
            a stage not named gets one device (the lowest free one).
        schedule: the schedule the plan will run under (``SCHEDULES``; ``zb_graph`` weighs
            depth against its shorter fill and drain), or ``"auto"``: 1F1B or ``zb_graph``,
            whichever simulates faster. ``plan.schedule`` records it for ``simulate``/``wrap``.
        sync: how replicated stages will synchronise (:func:`sync_method`; default all-reduce), each
            charged that method's cost per step (local SGD amortised, top-k, PowerSGD) (``plan.sync``).
        bucket_bytes / dtype: the replicas' gradient bucket size (``wrap``'s); the compute precision (_graph_of).
        stages_per_rank / fold_budget_limit / fold: the most stages a device may hold (None: 2 in the
            default search, 1 for another partitioner or with ``replicate`` given); from 2, plans folded
            so (``fold``: ``"v"``, ZB-V's placement, or ``"looping"``, Megatron's; None: both) on the
            first 2, 4, ... ranks up to the limit (0: all), the fastest plan winning, folded or not.
        cross_replica: a ``graphpipe.CrossReplica``: the plan runs as one of that many fault-tolerant
            replicas; each step simulated with their average (cost/cross_replica.h).

    Every candidate (any micro-batch size, fitting in memory) is simulated under ``schedule``; the
    fastest is returned, its step that simulation (csrc/planner/planner.h). Returns: a ``Plan``
    (stages, their devices and nodes, edges, micro-batching, depth, predicted step; ``print``, ``save``).

    Raises:
        PlanningError: zero devices, more devices than operators (``replicate=False``), a model
            that does not fit (with the shortfall), a bad manual mapping or ``stage_devices``.
        InputError: an unknown ``dtype``, or a graph traced in another (_graph_of).
    """
    graph = _graph_of(model_or_graph, example_inputs, _precision(dtype))
    described = _devices_of(devices, device_kind)
    # Order of the checks as the arguments are read: mapping, stage devices, then the rest; replicate
    # None: the default search, replicas allowed and widened (planner/default_search.h).
    options = {"manual": _manual_mapping(manual), "stage_devices": _stage_device_lists(stage_devices),
               "memory_limit": parse_bytes(memory_limit) if memory_limit is not None else None,
               "schedule": schedule, "sync": sync_method(sync),  # "auto" or a name: the core's rule
               "bucket_bytes": float(bucket_bytes) if bucket_bytes is not None else float(_C.default_bucket_bytes),
               "cross_replica": cross_replica if cross_replica is not None else _C.CrossReplica(),
               "fold_budget_limit": int(fold_budget_limit), "stages_per_rank": stages_per_rank, "fold": fold}
    return _C.plan_by_simulation(graph, described, partitioner=partitioner, batch_size=batch_size or 0,
                                 micro_batch_size=micro_batch_size, num_micro_batches=micro_batches,
                                 optimizer=optimizer, seed=seed, replicate=replicate, **options).plan


def retime(plan: Any, graph: Any, devices: int | Any | None = None, device_kind: str = "cpu") -> Any:
    """``plan`` priced again on ``graph``'s current profile: every stage's forward, backward, I,
    W, transfer, memory and sync figures, and the closed-form step, evaluated afresh, with
    everything the plan decided kept (its stages' operators and ranks, micro-batching, schedule,
    sync method, optimizer, memory limit, fold and label). For a plan made before the operators
    were profiled again (``profile(group=)`` beside the runs) or on another description of the
    same devices. ``devices``: a ``Devices`` description, a count of ``device_kind``, or None for
    the plan's own count of ``device_kind``. Simulate the result for its simulated step.

    Raises:
        PlanningError: the plan is not of ``graph``, uses more ranks than ``devices`` has, or
            would change (a stage whose recomputation flips under another memory figure)."""
    if devices is None:
        devices = plan.num_devices
    return _C.retime(plan, graph, _devices_of(devices, device_kind))


def _precision(dtype: str | torch.dtype | None) -> str | None:
    """``plan(dtype=...)`` as a name of ``PRECISIONS`` (None: not given)."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in PRECISIONS:
        raise InputError(f"dtype {dtype!r} is not a precision the planner prices: choose {', '.join(PRECISIONS)}")
    return name


def _graph_of(model_or_graph: nn.Module | Any, example_inputs: Any, precision: str | None = None) -> Any:
    """The ``OpGraph`` to plan, computing in ``precision`` (None: as given or as called).

    A model is traced with ``example_inputs`` under ``torch.autocast(dtype=precision)`` for
    ``bfloat16``/``float16`` (autocast off for ``float32``), so that its graph records the
    activations autocast makes (``graph.compute_dtype``), and the planner prices them and the
    devices' rate for that precision (a GPU preset's tensor-core rate). A graph given must have
    been traced in ``precision``: InputError otherwise (no silent approximation), as for a model
    on a device autocast does not run on (meta) or one whose parameters' dtype differs.
    """
    if isinstance(model_or_graph, nn.Module):
        if example_inputs is None:
            raise InputError("plan(model, ...) needs example_inputs to trace the model")
        with autocast_for(model_or_graph, precision):
            graph = trace(model_or_graph, example_inputs)
        if precision is not None and graph.compute_dtype != precision:
            raise InputError(f"plan(dtype={precision!r}): {type(model_or_graph).__name__} computes in "
                             f"{graph.compute_dtype} (its parameters' dtype); convert it to "
                             f"{precision} or plan it with dtype={graph.compute_dtype!r}")
        return graph
    if isinstance(model_or_graph, _C.OpGraph):
        if precision is not None and model_or_graph.compute_dtype != precision:
            raise InputError(
                f"plan(dtype={precision!r}) was given a graph traced in {model_or_graph.compute_dtype}: its "
                f"activation bytes are those of {model_or_graph.compute_dtype}. Trace the model under "
                f"torch.autocast(device_type, dtype=torch.{precision}) (or pass the model with dtype=), "
                "so that the graph records what the model computes")
        return model_or_graph
    raise InputError(f"plan needs an nn.Module or an OpGraph, got {type(model_or_graph).__name__}")


def _devices_of(devices: int | Any, device_kind: str) -> Any:
    """``plan(devices=...)`` as a ``Devices`` description: a count of ``device_kind``, or as given."""
    if not isinstance(devices, int):
        return devices
    if devices < 1:
        raise _C.PlanningError(f"plan needs at least one device, got {devices}")
    return _describe_devices(devices, device_kind)


def _manual_mapping(manual: Mapping[str, int] | Sequence[tuple[str, int]] | None) -> list | None:
    """``plan(manual=...)`` as the core takes it: a list of (module prefix, stage) pairs."""
    return list(manual.items()) if isinstance(manual, Mapping) else (list(manual) if manual else None)


def _stage_device_lists(stage_devices: Mapping[int, Sequence[int]] | None) -> dict[int, list[int]] | None:
    """``plan(stage_devices=...)`` as the core takes it: stage -> list of device ids."""
    if stage_devices is None:
        return None
    if not isinstance(stage_devices, Mapping):
        raise InputError(f"stage_devices must map stage numbers to lists of device ids, got {type(stage_devices).__name__}")
    return {int(stage): [int(d) for d in ids] for stage, ids in stage_devices.items()}


def sync_method(sync: Any) -> Any:
    """The cost model's description (``graphpipe._C.SyncMethod``) of a sync method.

    Accepts ``None`` or ``"allreduce"`` (the default all-reduce), a ``_C.SyncMethod``, or any
    object whose ``cost_method()`` returns one (the methods of ``graphpipe.sync``).

    Raises:
        InputError: anything else, naming what was given.
    """
    if sync is None or isinstance(sync, str):  # a name: the one C++ parser (graphpipe.sync.named)
        return _C.SyncMethod() if sync is None else named_sync(sync)
    if isinstance(sync, _C.SyncMethod):
        return sync
    describe = getattr(sync, "cost_method", None)
    if callable(describe):
        method = describe()
        if isinstance(method, _C.SyncMethod):
            return method
        raise InputError(f"{type(sync).__name__}.cost_method() returned {type(method).__name__}, "
                         "not a graphpipe._C.SyncMethod")
    raise InputError(f"sync must be a graphpipe.sync method, a graphpipe._C.SyncMethod or 'allreduce', got {sync!r}")
