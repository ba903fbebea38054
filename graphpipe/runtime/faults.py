"""Fault injection for failure tests: one switch, the environment variable
``GRAPHPIPE_FAULT=rank:step:phase:kind`` (several faults separated by commas).

- ``rank``: the pipeline rank (rank in the pipeline's group) the fault fires on;
- ``step``: the pipeline's ``step_count`` at which it fires (0-based, counted by ``Pipeline.step``);
- ``phase``: ``forward``, ``backward``, ``send``, ``receive``, ``allreduce`` (the gradient
  all-reduce of a replicated stage), ``optimizer``, ``save`` or ``load``;
- ``kind``: ``raise`` (an error naming "injected fault"), ``hang`` (sleeps
  :func:`hang_seconds` of the pipeline's timeout, well past it, then goes on) or ``kill``
  (SIGKILL of the rank's own process).

The value is parsed once, in ``wrap`` (:func:`from_environment`): a malformed one is an
``InputError`` naming it. The executor phases fire inside the C++ executor, before the first
instruction of their kinds in that step's run: Python decides which ``OpKind``\\ s each phase
means (:data:`EXECUTOR_PHASES`) and hands the executor only "these kinds, this action" for the
run (:meth:`Injector.arm`). The other phases fire where the pipeline calls :meth:`Injector.fire`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphpipe._ext import _C
from graphpipe.errors import InputError

__all__ = ["ENV", "EXECUTOR_PHASES", "KINDS", "PHASES", "Fault", "InjectedFault", "Injector", "from_environment",
           "hang_seconds", "parse"]

#: The environment variable read by :func:`from_environment`.
ENV = "GRAPHPIPE_FAULT"

#: The instruction kinds each executor phase fires before (the first of any of them in a run).
EXECUTOR_PHASES: dict[str, tuple[str, ...]] = {
    "forward": ("forward",),
    "backward": ("backward", "backward_input"),
    "send": ("send_activation", "send_gradient"),
    "receive": ("recv_activation", "recv_gradient"),
    "allreduce": ("all_reduce",),
}
#: Every phase, the executor's and those fired from Python.
PHASES: tuple[str, ...] = (*EXECUTOR_PHASES, "optimizer", "save", "load")
KINDS: tuple[str, ...] = ("raise", "hang", "kill")
# A hang never lasts longer than this, whatever the timeout: an injected fault must not turn a
# test run into a job that never ends.
_MAX_HANG_SECONDS = 900.0


#: The error a ``raise`` fault raises, in the executor's phases (C++ runtime/errors.h
#: InjectedFaultError) and in Python's alike: one class, a GraphpipeError.
InjectedFault = _C.InjectedFault


@dataclass(frozen=True)
class Fault:
    """One injected fault: at pipeline rank ``rank``, at step ``step``, in ``phase``, do ``kind``."""

    rank: int
    step: int
    phase: str
    kind: str

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.phase}:{self.kind}"


def parse(text: str) -> list[Fault]:
    """The faults of a ``GRAPHPIPE_FAULT`` value (empty: none); InputError naming the value
    and what is wrong with it."""
    faults = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split(":")

        def bad(why: str, item: str = item) -> InputError:
            return InputError(f"{ENV}={text!r}: fault {item!r} {why}; expected rank:step:phase:kind with phase in "
                              f"{', '.join(PHASES)} and kind in {', '.join(KINDS)}, e.g. 1:0:forward:hang")

        if len(fields) != 4:
            raise bad(f"has {len(fields)} fields, not 4")
        rank, step, phase, kind = (f.strip() for f in fields)
        if not (rank.isdigit() and step.isdigit()):
            raise bad("needs a rank and a step that are non-negative integers")
        if phase not in PHASES:
            raise bad(f"has an unknown phase {phase!r}")
        if kind not in KINDS:
            raise bad(f"has an unknown kind {kind!r}")
        faults.append(Fault(int(rank), int(step), phase, kind))
    return faults


def from_environment() -> list[Fault]:
    """The faults ``GRAPHPIPE_FAULT`` asks for (none when unset)."""
    return parse(os.environ.get(ENV, ""))


def hang_seconds(timeout: float) -> float:
    """How long a ``hang`` sleeps: twice the pipeline's timeout and 5 s more (so every peer has
    timed out, and seen why, before the hung rank goes on), at most 900 s."""
    return min(2.0 * float(timeout) + 5.0, _MAX_HANG_SECONDS)


class Injector:
    """One rank's faults (:func:`from_environment`, parsed once in ``wrap``), fired where they are
    due. ``activity(what)`` is a context that tells the peers what this rank does (flight.py),
    so that a hung rank still says so."""

    def __init__(self, faults: list[Fault], rank: int, timeout: float,
                 activity: Callable[[str], Any] | None = None) -> None:
        self.faults = list(faults)
        self.rank = rank
        self.timeout = float(timeout)
        self._activity = activity

    def _due(self, step: int, phase: str | None = None) -> list[Fault]:
        return [f for f in self.faults if f.rank == self.rank and f.step == step
                and (phase is None or f.phase == phase)]

    def fire(self, phase: str, step: int) -> None:
        """Fires the faults due at ``step`` (the pipeline's ``step_count``) on this rank in the
        Python ``phase`` (``optimizer``, ``save``, ``load``): raises :class:`InjectedFault`,
        sleeps, or kills this process."""
        for fault in self._due(step, phase):
            what = f"injected fault {ENV}={fault} on rank {self.rank}, step {step}, phase {phase}"
            if fault.kind == "raise":
                raise InjectedFault(what)
            if fault.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            with self._activity(f"hanging ({what})") if self._activity is not None else contextlib.nullcontext():
                time.sleep(hang_seconds(self.timeout))

    def arm(self, executor: Any, step: int) -> None:
        """Gives ``executor`` the faults of its executor phases due at ``step`` on this rank (for
        its next run only; none clears them)."""
        armed = []
        for fault in self._due(step):
            kinds = EXECUTOR_PHASES.get(fault.phase)
            if kinds is None:
                continue
            label = f"injected fault {ENV}={fault} on rank {self.rank}, step {step}"
            armed.append(([getattr(_C.OpKind, k) for k in kinds], fault.kind, hang_seconds(self.timeout), label))
        executor.set_faults(armed)
