"""How a replicated stage's replicas stay in agreement: ``graphpipe.wrap(..., sync=...)``.

A plan stage with several devices runs data parallel (each replica on its rows of every
micro-batch). By default its replicas sum their gradients every step, which is exact: training
equals single-process training. The other methods trade exactness for less communication:

=====================  ==========================================================  ============
method                 what crosses the replicas' links                            exact?
=====================  ==========================================================  ============
``AllReduce()``        every step, every gradient (in buckets, during the last     yes
                       backward); ``hierarchical=True`` sums inside each node
                       first, then across nodes
``LocalSGD(H)``        every H steps, the parameters (averaged); replicas step     H = 1 only
                       on their own gradients in between
``QSR(H_base, a)``     local SGD whose period follows the learning rate:           no
                       H = max(H_base, floor((a / lr)^2)), chosen at the start of
                       each round from the optimizer's current learning rate
``TopK(ratio)``        every step, the largest ``ratio`` of each bucket's          ratio = 1
                       gradient entries, with the rest carried to the next step
                       (error feedback)
``PowerSGD(rank)``     every step, rank-``rank`` factors of each gradient matrix   no
                       (torch's PowerSGD hook, with its error feedback)
=====================  ==========================================================  ============

What is torch's and what is graphpipe's: local SGD averages with torch's
``torch.distributed.algorithms.model_averaging`` (``utils.average_parameters``); PowerSGD and fp16 compression are torch's DDP communication hooks,
run unchanged on graphpipe's gradient buckets through torch's ``PythonCommHook``. Written here,
because torch has none: QSR's period rule (below), top-k with error feedback and the hierarchical
all-reduce (C++, ``csrc/runtime``).

Each method also describes itself to the cost model (``cost_method()``, a ``_C.SyncMethod``), so
that ``graphpipe.plan(..., sync=...)`` and ``graphpipe.simulate`` price what will run, and makes
the communication hook its replicas run on the gradient buckets (``gradient_hook()``, None for
the local methods). So a method is one class here, and the runtime (runtime/replica_sync.py)
asks it rather than testing which one it is; docs/extending.md lists the rest a new one needs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from graphpipe._ext import _C
from graphpipe.errors import InputError

__all__ = ["AllReduce", "GradientHook", "LocalSGD", "PowerSGD", "QSR", "SyncMethod", "TopK", "named", "parse",
           "qsr_period"]


@dataclass
class GradientHook:
    """The communication hook a gradient method's replicas run on every gradient bucket
    (a ``_C.CommHook``), and the state a resumed run needs from it: saved under ``state_key``
    (None: it keeps none) by ``state_dict()`` and given back to ``load_state_dict()``."""

    hook: Any
    state_key: str | None = None
    state_dict: Any = None
    load_state_dict: Any = None


class SyncMethod(ABC):
    """A way for a replicated stage's replicas to synchronise (see the module's table)."""

    #: Replicas step on their own gradients and average parameters now and then (local SGD).
    local_updates: bool = False

    @abstractmethod
    def cost_method(self) -> _C.SyncMethod:
        """This method as the cost model and the simulator price it."""

    def gradient_hook(self, group: Any, hierarchy: tuple[Any, Any] | None) -> GradientHook | None:
        """The hook that sums the replicas' gradients, bucket by bucket, over ``group`` (the
        replicas' counting process group; ``hierarchy``: this rank's (intra-node, inter-node)
        groups, None when the replicas share a node). None: the replicas update locally."""
        return None

    def round_length(self, lr: float) -> int:
        """Local methods: the local steps of a round that starts at learning rate ``lr``."""
        raise InputError(f"{self.describe()} does not update locally: it has no rounds")

    def describe(self) -> str:
        """A short name for tables and logs."""
        return repr(self)


@dataclass(frozen=True)
class AllReduce(SyncMethod):
    """Sum the replicas' gradients every step (exact). ``hierarchical=True``: reduce-scatter
    inside each node, all-reduce across nodes, all-gather inside the node (csrc/runtime). A node
    is ``ranks_per_node`` consecutive global ranks (default: torchrun's ``LOCAL_WORLD_SIZE``)."""

    hierarchical: bool = False
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise InputError(f"AllReduce: ranks_per_node must be at least 1, got {self.ranks_per_node}")

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="all_reduce", hierarchical=self.hierarchical)

    def gradient_hook(self, group: Any, hierarchy: tuple[Any, Any] | None) -> GradientHook:
        if not self.hierarchical:
            return GradientHook(_C.all_reduce_hook())
        if hierarchy is None:
            raise InputError("AllReduce(hierarchical=True): this stage's replicas lie on one node, "
                             "so there is no hierarchy to use")
        # The buckets count the hook's traffic on these groups with their own.
        return GradientHook(_C.hierarchical_all_reduce_hook(*hierarchy))

    def describe(self) -> str:
        return "all-reduce (hierarchical)" if self.hierarchical else "all-reduce"


@dataclass(frozen=True)
class LocalSGD(SyncMethod):
    """Replicas step on their own gradients; parameters are averaged every ``period`` steps
    (torch's ``model_averaging.utils.average_parameters``): after steps H, 2H, ..."""

    period: int
    local_updates = True

    def __post_init__(self) -> None:
        if not isinstance(self.period, int) or self.period < 1:
            raise InputError(f"LocalSGD: period must be a positive integer, got {self.period!r}")

    def round_length(self, lr: float) -> int:
        return self.period

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="local_sgd", period=float(self.period))

    def describe(self) -> str:
        return f"local SGD H={self.period}"


def qsr_period(base_period: int, alpha: float, lr: float) -> int:
    """The Quadratic Synchronization Rule (Gu et al., ICLR 2024): the number of local steps of
    the round that starts at learning rate ``lr``, ``max(base_period, floor((alpha / lr)^2))``.
    As the learning rate decays, rounds grow quadratically longer."""
    if not lr > 0:
        raise InputError(f"QSR: the learning rate must be positive to choose a period, got {lr!r}")
    return max(int(base_period), math.floor((alpha / lr) ** 2))


@dataclass(frozen=True)
class QSR(SyncMethod):
    """Local SGD whose period follows the learning rate (:func:`qsr_period`): at the start of
    each round, the optimizer's current learning rate (its first parameter group's ``lr``, so
    any ``torch.optim.lr_scheduler`` works) fixes the round's length; the parameters are
    averaged at its end. ``mean_period`` is what the cost model amortises the averaging over
    (default ``base_period``); ``QSR.mean_period_of`` computes it for a learning-rate schedule."""

    base_period: int
    alpha: float
    mean_period: float | None = None
    local_updates = True

    def __post_init__(self) -> None:
        if not isinstance(self.base_period, int) or self.base_period < 1:
            raise InputError(f"QSR: base_period must be a positive integer, got {self.base_period!r}")
        if not self.alpha > 0:
            raise InputError(f"QSR: alpha must be positive, got {self.alpha!r}")

    def period(self, lr: float) -> int:
        """The length of a round that starts at learning rate ``lr``."""
        return qsr_period(self.base_period, self.alpha, lr)

    def round_length(self, lr: float) -> int:
        return self.period(lr)

    def rounds(self, lrs: Iterable[float]) -> list[int]:
        """The round lengths QSR runs on a schedule of per-step learning rates (the last round
        may be cut short by the end of the schedule)."""
        lengths: list[int] = []
        lrs = list(lrs)
        step = 0
        while step < len(lrs):
            h = self.period(lrs[step])
            lengths.append(min(h, len(lrs) - step))
            step += h
        return lengths

    def mean_period_of(self, lrs: Iterable[float]) -> float:
        """Steps per synchronisation over a schedule of per-step learning rates."""
        lrs = list(lrs)
        return len(lrs) / max(1, len(self.rounds(lrs)))

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="local_sgd", period=float(self.mean_period or self.base_period))

    def describe(self) -> str:
        return f"QSR H_base={self.base_period} alpha={self.alpha:g}"


@dataclass(frozen=True)
class TopK(SyncMethod):
    """Every step, each replica sends the ``ratio`` largest-magnitude entries of each gradient
    bucket (plus what it held back before: error feedback); the replicas' sparse parts are
    summed. ``ratio=1`` is the exact sum."""

    ratio: float

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise InputError(f"TopK: ratio must be in (0, 1], got {self.ratio!r}")

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="top_k", ratio=float(self.ratio))

    def gradient_hook(self, group: Any, hierarchy: tuple[Any, Any] | None) -> GradientHook:
        hook = _C.topk_hook(self.ratio)  # its residuals (error feedback) carry over a resume
        return GradientHook(hook, "residuals", hook.state_dict, hook.load_state_dict)

    def describe(self) -> str:
        return f"top-k {self.ratio:g}"


@dataclass(frozen=True)
class PowerSGD(SyncMethod):
    """torch's PowerSGD communication hook (rank-``rank`` factors with error feedback and warm
    start), run on the replicas' gradient buckets. The first ``start_iter`` steps sum exactly
    (torch's hook all-reduces plainly until its iteration count reaches ``start_iter``); torch
    requires ``start_iter > 1`` with error feedback."""

    rank: int = 1
    start_iter: int = 2
    min_compression_rate: float = 2.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise InputError(f"PowerSGD: rank must be a positive integer, got {self.rank!r}")
        if self.start_iter < 2:
            raise InputError(f"PowerSGD: start_iter must be at least 2 (torch's error feedback needs it), "
                             f"got {self.start_iter!r}")

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="power_sgd", rank=self.rank, min_compression_rate=self.min_compression_rate)

    def gradient_hook(self, group: Any, hierarchy: tuple[Any, Any] | None) -> GradientHook:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

        state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=self.rank,
                                       start_powerSGD_iter=self.start_iter,
                                       min_compression_rate=self.min_compression_rate, random_seed=self.seed)
        # A resumed run needs its error feedback, warm-start factors, random generator and
        # iteration count: every slot but the group.
        slots = [slot for slot in type(state).__slots__ if slot != "process_group"]

        def load(saved: dict[str, Any]) -> None:
            for slot, value in saved.items():
                setattr(state, slot, value)

        return GradientHook(_C.python_comm_hook(state, powersgd.powerSGD_hook), "powersgd",
                            lambda: {slot: getattr(state, slot) for slot in slots}, load)

    def describe(self) -> str:
        return f"PowerSGD rank {self.rank}"


def named(name: str) -> _C.SyncMethod:
    """The cost model's description of a sync method given by name, read by the C++ parser
    (cost/sync_method.cpp ``parse_sync_kind``: the one list of names and spellings, so
    ``"allreduce"`` and ``"all_reduce"`` mean the same to ``wrap``, ``plan`` and ``simulate``).
    Only the all-reduce is complete without parameters: another kind's name raises, asking for
    the method object with its parameters.

    Raises:
        InputError: an unknown name (the parser's message), or a kind that needs parameters.
    """
    try:
        method = _C.SyncMethod(kind=str(name))
    except _C.PlanningError as exc:
        raise InputError(f"sync must be 'allreduce' or a graphpipe.sync method (AllReduce, LocalSGD, QSR, TopK, "
                         f"PowerSGD), got {name!r}: {exc}") from exc
    if method.kind != "all_reduce":
        raise InputError(f"sync={name!r} needs its parameters: pass a graphpipe.sync method (LocalSGD(period), "
                         "QSR(base_period, alpha), TopK(ratio), PowerSGD(rank))")
    return method


def parse(sync: SyncMethod | str | None) -> SyncMethod:
    """``wrap``'s ``sync=`` argument as a method: ``None`` and the all-reduce's names
    (:func:`named`) are AllReduce()."""
    if sync is None:
        return AllReduce()
    if isinstance(sync, SyncMethod):
        return sync
    if isinstance(sync, str):
        named(sync)  # raises for anything but the all-reduce
        return AllReduce()
    raise InputError(f"sync must be 'allreduce' or a graphpipe.sync method (AllReduce, LocalSGD, QSR, TopK, "
                     f"PowerSGD), got {sync!r}")
