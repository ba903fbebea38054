"""``graphpipe.wrap``'s options, declared once: :class:`WrapOptions` is what ``wrap`` and
``Pipeline`` take (as an object, or as keywords of the same names), and the one place their
types, defaults and meaning are written down."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from graphpipe._ext import _C
from graphpipe.errors import InputError
from graphpipe.sync import AllReduce, SyncMethod

__all__ = ["DEFAULT_TIMEOUT", "WrapOptions"]

#: Default timeout of every wait on a peer, in seconds.
DEFAULT_TIMEOUT = 300.0


@dataclass(frozen=True)
class WrapOptions:
    """How ``graphpipe.wrap`` builds and runs a pipeline. Every rank passes the same options
    (``wrap`` checks that they agree).

    Attributes:
        group: the process group whose ranks run the pipeline (default: the default group).
        partitioner: a name from ``graphpipe.PARTITIONERS`` (rank 0 plans with
            :func:`graphpipe.plan`).
        schedule: a name from ``graphpipe.SCHEDULES``, or ``"auto"``: the planner picks graph
            1F1B or ``zb_graph`` with the plan; or a ``Schedule`` made for ``plan`` (generated
            and edited, parsed, loaded, built from programs: checked to fit the plan and not to
            deadlock, ``graphpipe.simulation.schedule_for``), which needs ``plan=``. Default
            (``None``): the schedule the plan was made for (``plan.schedule``; a plan made here
            is made for ``1f1b``).
        micro_batches: number of micro-batches per step (default: the partitioner's choice).
        plan: a Plan (graphpipe.plan, graphpipe.runtime.manual_plan), plan JSON text or file, or
            the JSON form as a dict; read and validated by the C++ loader (Plan.from_json) on
            every rank, so a bad plan raises the loader's FormatError or PlanningError.
        timeout: seconds every wait on a peer may take before PipelineTimeout.
        devices: what :func:`graphpipe.plan` takes: a ``Devices`` description or a device count
            described by ``device_kind`` (default: one CPU rank per rank of the group).
        device: where this rank's stage runs (default: where its parameters are).
        leaf_modules: module classes traced as one operator.
        bucket_bytes: size of the buckets in which a replicated stage's gradients are summed
            over its replicas, each starting as soon as the last backward has produced its
            gradients (default ``graphpipe._C.default_bucket_bytes``, 25 MiB, DDP's); the first
            bucket holds up to 1 MiB (DDP's first bucket), so the first sum starts early.
        sync: how replicated stages synchronise (graphpipe/sync.py): ``"allreduce"`` (default,
            exact; any name the C++ parser takes for it, ``"all_reduce"`` too),
            ``AllReduce(hierarchical=True)``, ``LocalSGD(period)``, ``QSR(base_period, alpha)``,
            ``TopK(ratio)`` or ``PowerSGD(rank)``. The planner plans for it. Local methods need
            ``step(..., optimizer=...)``.
        skip_nonfinite: with ``step(..., optimizer=...)``, skip the optimizer step on every rank
            when any stage's gradients hold a NaN or an infinity.
        check_replicas_every: run ``Pipeline.check_replicas`` after every N-th step (default
            never). Replicas always start equal: ``wrap`` broadcasts each replicated stage's
            parameters and buffers from its first replica, and tied parameters from their first
            holder.
        capture: ``"auto"``, ``"fx"`` or ``"export"`` (see :func:`graphpipe.trace`).
        autocast: ``torch.bfloat16`` or ``torch.float16``: mixed precision. Every step and
            evaluation runs under ``torch.autocast(<the stage's device type>, autocast)``, the
            same as wrapping ``pipe.step`` in it yourself: each stage's forward and the loss
            compute in that precision where autocast does, activations and their gradients
            cross the stage edges in the dtype they are produced in (half float32's bytes in
            bf16), parameters, gradients and optimizer state keep their own dtype. ``wrap``
            traces and plans under it too, so the planner prices the activations it moves.
            Default (``None``): whatever autocast the caller runs ``step`` in.
        flight_recorder_dir: the folder where each rank writes its flight recorder dump
            (``rank<R>.json``: its last executor instructions and collectives, what it and every
            peer was doing) when the pipeline fails; ``python -m graphpipe diagnose FOLDER``
            reads them. Default (``None``): ``$GRAPHPIPE_FLIGHT_RECORDER_DIR`` if set, else
            ``<tempfile.gettempdir()>/graphpipe-flight`` (on by default: written only on a
            failure, a file per rank, replaced by the next failure's); ``""`` (or the variable
            set to ``""`` or ``off``) writes none. The recorder itself is always on
            (``$GRAPHPIPE_FLIGHT_RECORDER_SIZE`` records per rank, default 1024, 0: off). May
            differ between ranks.
        plan_options: every other keyword of :func:`graphpipe.plan` (``memory_limit``,
            ``micro_batch_size``, ``optimizer``, ``manual``, ``device_kind``, ``seed``), passed
            to it unchanged. With ``plan``, planning options raise ``InputError`` (they would be
            ignored).
    """

    group: Any = None
    partitioner: str = "graphpipe"
    schedule: str | Any | None = None  # a name, or a _C.Schedule
    micro_batches: int | None = None
    plan: Any = None
    timeout: float = DEFAULT_TIMEOUT
    devices: Any = None
    device: Any = None
    leaf_modules: Any = ()
    bucket_bytes: float | None = None
    sync: SyncMethod | str | None = None
    skip_nonfinite: bool = True
    check_replicas_every: int | None = None
    capture: str = "auto"
    autocast: Any = None
    flight_recorder_dir: str | None = None
    plan_options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_keywords(cls, base: WrapOptions | None = None, **keywords: Any) -> WrapOptions:
        """``base`` (default: the defaults) with the fields named in ``keywords`` replaced; a
        keyword that is no field is a planning option (``plan_options``)."""
        if base is not None and not isinstance(base, WrapOptions):
            raise InputError(f"graphpipe.wrap: options must be a graphpipe.WrapOptions, got a {type(base).__name__} "
                             "(pass the process group as group=)")
        names = {f.name for f in dataclasses.fields(cls)} - {"plan_options"}
        fields = {k: v for k, v in keywords.items() if k in names}
        extra = {k: v for k, v in keywords.items() if k not in names}
        base = base if base is not None else cls()
        return dataclasses.replace(base, **fields, plan_options={**base.plan_options, **extra})

    def bucket_size(self) -> float:
        """``bucket_bytes``, or the C++ default; InputError unless positive."""
        size = float(self.bucket_bytes) if self.bucket_bytes is not None else float(_C.default_bucket_bytes)
        if not size > 0:
            raise InputError(f"graphpipe.wrap: bucket_bytes must be positive, got {self.bucket_bytes!r}")
        return size

    def schedule_for(self, plan: Any) -> Any:
        """The schedule the pipeline runs: the ``Schedule`` or name asked for, or the name of the
        one ``plan`` was made for (``schedule`` None or ``"auto"``)."""
        if self.given_schedule():
            return self.schedule
        return plan.schedule if self.schedule in (None, "auto") else self.schedule

    def given_schedule(self) -> bool:
        """A ``Schedule`` was given (not a name); InputError without the plan it was made for."""
        if not isinstance(self.schedule, _C.Schedule):
            return False
        if self.plan is None:
            raise InputError("graphpipe.wrap: a Schedule is made for a plan, and none was given: pass the plan it was "
                             "made for as plan=, or a schedule name")
        return True

    def schedule_name(self) -> str | None:
        """The schedule's name (a given ``Schedule``'s kind), None for the plan's."""
        return self.schedule.kind if self.given_schedule() else self.schedule

    def autocast_context(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` on ``device``'s type in the ``autocast`` dtype (nothing when
        unset); InputError for a dtype autocast does not compute in."""
        if self.autocast is None:
            return contextlib.nullcontext()
        if self.autocast not in (torch.bfloat16, torch.float16):
            raise InputError(f"graphpipe.wrap: autocast must be torch.bfloat16, torch.float16 or None, got "
                             f"{self.autocast!r}")
        return torch.autocast(device.type, dtype=self.autocast)

    def check_every(self) -> int | None:
        """``check_replicas_every``, checked: a positive int or None."""
        every = self.check_replicas_every
        if every is not None and (not isinstance(every, int) or every < 1):
            raise InputError(f"graphpipe.wrap: check_replicas_every must be a positive int or None, got {every!r}")
        return every

    def planning(self, sync_method: SyncMethod) -> dict[str, Any]:
        """The keywords rank 0 gives :func:`graphpipe.plan` when no plan was given: the planner
        plans for the schedule that will run (zb_graph's shorter bubbles) and for the sync
        method its replicated stages will use (the default needs no say)."""
        options = dict(self.plan_options, partitioner=self.partitioner, devices=self.devices,
                       micro_batches=self.micro_batches, schedule=self.schedule_name() or "1f1b")
        if sync_method != AllReduce():
            options["sync"] = sync_method
        return options

    def refuse_ignored_planning(self) -> None:
        """With ``plan=``, planning options would be ignored: InputError naming them."""
        given = sorted(self.plan_options) + (["devices"] if self.devices is not None else []) + (
            ["partitioner"] if self.partitioner != "graphpipe" else [])
        if given:
            raise InputError(f"graphpipe.wrap: plan= was given, so the planning options {given} would be ignored; "
                             "pass either a plan or the options to make one")
