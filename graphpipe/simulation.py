"""Front door to the C++ scheduler and simulator: ``graphpipe.schedule`` and ``graphpipe.simulate``."""

from __future__ import annotations

from typing import Any

from graphpipe._ext import _C
from graphpipe.planner import devices as make_devices
from graphpipe.planner import sync_method

__all__ = ["schedule", "schedule_for", "simulate", "SCHEDULES"]

#: Schedule kinds, as the C++ generator lists them (schedule/generate.h, policies()): graph-aware
#: 1F1B, GPipe's fill-drain, 1F1B's greedy variant and zero-bubble on the stage DAG (zb_graph).
SCHEDULES: tuple[str, ...] = tuple(_C.schedule_kinds())


def schedule(plan: Any, kind: str = "1f1b") -> Any:
    """The per-rank instruction lists for ``plan`` (deadlock-free by construction; checked)."""
    result = _C.Schedule.generate(plan, kind)
    result.validate()
    return result


def schedule_for(plan: Any, kind: Any) -> Any:
    """The schedule ``plan`` runs under ``kind``: a name from ``SCHEDULES`` generates it, a
    ``Schedule`` (generated and edited, read back with ``Schedule.parse``/``load``, or built from
    programs) is checked to be well formed, deadlock-free and made for ``plan``. What
    ``simulate`` predicts and ``wrap`` runs is this one schedule.

    Raises:
        ScheduleError: a schedule made for another plan (naming the first difference), one
            that is malformed, or one that can deadlock (naming the blocked ranks).
    """
    if not isinstance(kind, _C.Schedule):
        return schedule(plan, kind)
    kind.validate()
    kind.check_fits(plan)
    verdict = kind.check()
    if not verdict.ok:
        raise _C.ScheduleError(f"the given schedule can deadlock: {verdict}")
    return kind


def simulate(
    plan: Any,
    devices: Any = None,
    schedule_kind: str | None = None,
    *,
    overlap: bool = True,
    device_kind: str = "cpu",
    bucket_bytes: float | None = None,
    sync: Any = None,
    sync_step: bool = True,
    cross_replica: Any = None,
    optimizer: str | None = None,
) -> Any:
    """Predicts one training iteration of ``plan`` under a schedule.

    Args:
        plan: a ``Plan`` from :func:`graphpipe.plan`.
        devices: the ``Devices`` the plan was made for (default: ``plan.num_devices`` devices of
            ``device_kind``). Stage times come from the plan; transfers from the devices' links;
            the runtime's costs per instruction and per step from the devices' measured
            ``instruction_overhead_seconds`` and ``step_overhead_seconds`` (0 unless measured),
            and what the gradient buckets' sums beside the backward cost it from
            ``collective_overlap_loss`` (0 unless measured), and the optimizer step's price per
            parameter tensor from ``optimizer_tensor_seconds`` (the price of ``optimizer``),
            and the wait for the slowest rank
            from ``rank_skew_fraction`` (each 0 unless measured): the figures the planner
            charges too.
        schedule_kind: a name from ``SCHEDULES`` or a ``Schedule``; default: the schedule the
            plan was made for (``plan.schedule``).
        overlap: whether transfers overlap computation (own streams) or block the rank.
        bucket_bytes: the gradient bucket size of replicated stages, as given to ``wrap``
            (default: the runtime's, ``graphpipe._C.default_bucket_bytes``).
        sync: how replicated stages synchronise (a ``graphpipe.sync`` method or a
            ``graphpipe._C.SyncMethod``); default: the method the plan was made for
            (``plan.sync``).
        sync_step: for local SGD, simulate a step that averages the parameters (default) or a
            local step; ``amortized_iteration_seconds`` weighs both over the period either way.
        cross_replica: a ``graphpipe.CrossReplica``: the step of one of that many
            fault-tolerant replicas (``graphpipe.fault_tolerant``): each rank's average across
            the replicas (``cross_replica`` tasks), their agreement, then the optimizer steps
            (csrc/sim/cross_replica_tail.h). Default: no replicas.
        optimizer: the optimizer the step runs (a name from ``graphpipe.OPTIMIZERS``), whose
            price per parameter tensor it pays; default: the one the plan was made for
            (``plan.optimizer``). Name it where a run steps another optimizer than the one its
            plan's memory was sized for (benchmarks/compare.py plans Adam's memory and steps SGD).

    Returns:
        A ``SimResult``: iteration time (and its mean over a local-SGD period), throughput, per-rank busy/idle/bubble shares, peak
        activation memory per stage, the critical path and every task (for ``graphpipe.viz``).
    """
    if devices is None:
        devices = make_devices(plan.num_devices, device_kind)
    kind = plan.schedule if schedule_kind is None else schedule_kind
    sched = schedule_for(plan, kind)
    buckets = float(bucket_bytes) if bucket_bytes is not None else float(_C.default_bucket_bytes)
    method = sync_method(sync) if sync is not None else None
    return _C.simulate(plan, sched, devices, overlap=overlap, bucket_bytes=buckets, sync=method,
                       sync_step=bool(sync_step),
                       cross_replica=cross_replica if cross_replica is not None else _C.CrossReplica(),
                       optimizer=optimizer)
