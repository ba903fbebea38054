"""A pipeline's connections: its own process group, the executor over it, and the groups that
tied parameters and replicated stages synchronise over (:class:`Connections`); and the
:class:`Link`, those connections as everything collective uses them: usable until the pipeline
fails or is closed, every collective on them failing together (failure.py).

Every rank makes every group, in the same order (torch names groups by the order they are
made, process_group.py), members and others alike; each group is the pipeline's own, so that
failure handling can destroy them (closing this rank's connections is what wakes peers blocked
on it) without touching the user's groups. Every collective on them has the deadline."""

from __future__ import annotations

import atexit
import gc
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError
from graphpipe.runtime.failure import Collective, FailureBoard, Failures
from graphpipe.runtime.process_group import new_process_group
from graphpipe.runtime.replica_agreement import broadcast_from_first_replica
from graphpipe.runtime.replica_sync import ReplicaSync, sync_state_refusal
from graphpipe.runtime.shared_params import SharedParameterSync
from graphpipe.runtime.stages import LocalStage, StageModule
from graphpipe.runtime.sync_batchnorm import bind_sync_batchnorm
from graphpipe.sync import SyncMethod

__all__ = ["Connections", "GroupMaker", "Link", "check_backend"]

# The process groups of the last cleanly closed pipeline, kept until the next clean close or the
# interpreter's exit. Why: a collective's completion callback (torch's PowerSGD hook, the
# hierarchical hook's next phase) runs on a Gloo worker thread of the group and may still be
# unwinding, holding a reference to the group, when step() has returned and close() drops the
# pipeline's own. Were that reference the last, ~ProcessGroupGloo would run on its own worker
# thread and join it: std::terminate, "Resource deadlock avoided" (test_runtime_pipeline.py's
# test_close_parks_groups_and_the_exit_hook_closes_open_pipelines reproduces it).
_parked: list[Any] = []


#: The connections not closed yet, by id: a pipeline its user never closed still has its groups.
_live: weakref.WeakValueDictionary[int, Connections] = weakref.WeakValueDictionary()


@atexit.register
def _release_at_exit() -> None:
    """At the interpreter's exit, before its shutdown (a group whose handle outlives that can
    abort the process; graphpipe is imported after torch, so this runs before torch's own exit
    hooks): closes the pipelines never closed and releases the parked groups."""
    for conn in list(_live.values()):
        conn.close()
    _parked.clear()


def check_backend(device: torch.device, has_stage: bool, backend: str) -> None:
    """InputError for a stage on the CPU under NCCL, which moves GPU tensors only."""
    if device.type != "cuda" and has_stage and "nccl" in backend:
        raise InputError(
            "this rank's stage is on the CPU but the process group's backend is NCCL, which moves "
            "GPU tensors only: move the model to this rank's GPU (or pass device=), or use Gloo"
        )


@dataclass
class GroupMaker:
    """Makes the pipeline's process groups: ranks are the pipeline's, ``global_ranks`` maps
    them to the default group's."""

    global_ranks: list[int]
    whole_world: bool
    backend: str
    timeout: float
    board: FailureBoard

    def make(self, members: list[int], purpose: str) -> Any:
        """A group of ``members`` (pipeline ranks); None on a rank outside it."""
        return new_process_group([self.global_ranks[r] for r in members], list(members), self.whole_world,
                                 self.backend, self.timeout, self.board, purpose)


@dataclass
class Connections:
    """What :meth:`connect` made for this rank; :meth:`close` releases it."""

    pg: Any = None                      # the pipeline's own group, over all its ranks
    executor: Any = None                # graphpipe._C.Executor, running the schedule on ``pg``
    shared: SharedParameterSync | None = None
    replica_sync: ReplicaSync | None = None
    buckets: Any = None                 # the replicated stage's gradient buckets (gradient methods)
    my_replica_group: Any = None        # this rank's stage's replicas, when it has several
    replica_groups: list[Any] = field(default_factory=list)

    @classmethod
    def connect(cls, maker: GroupMaker, world_size: int, schedule: Any, local: LocalStage, method: SyncMethod,
                bucket_bytes: float, device: torch.device, memory_headroom: float) -> Connections:
        """Makes the groups, the executor and the replicas' sync for this rank's stages.
        ``memory_headroom``: what the plan leaves of its memory limit on this rank
        (``Plan.memory_headroom``), which bounds the receive buffers posted ahead."""
        rank = maker.board.rank
        self = cls()
        _live[id(self)] = self
        self.pg = maker.board.guard(lambda: maker.make(list(range(world_size)), "the pipeline"))
        maker.board.guard(lambda: self._wire(maker, rank, schedule, local, method, bucket_bytes, device,
                                             memory_headroom))
        return self

    def _wire(self, maker: GroupMaker, rank: int, schedule: Any, local: LocalStage, method: SyncMethod,
              bucket_bytes: float, device: torch.device, memory_headroom: float) -> None:
        cut, stage, module = local.cut, local.stage, local.module
        self.shared = SharedParameterSync(
            cut.shared_params, [st.ranks for st in cut.stages], [st.index for st in local.stages], module,
            lambda members: maker.make(members, "tied parameters"), maker.timeout,
            is_lead=stage is None or stage.ranks[0] == rank,
        )
        # Copies of tied parameters start as their first holder's (replica_agreement.py).
        self.shared.broadcast_from_first()
        self.executor = _C.Executor(schedule, rank, self.pg, maker.timeout)
        # What a split backward's W computes the gradients of (zero-bubble schedules), per stage.
        for st in local.stages:
            self.executor.set_parameters(st.index, [p for p in st.module.parameters() if p.requires_grad])
        if method.local_updates and cut.shared_params and any(len(st.ranks) > 1 for st in cut.stages):
            raise InputError(f"sync={method.describe()}: parameters tied across stages cannot be trained with "
                             "local updates on replicated stages (their replicas would drift apart from the other "
                             "stage's copy); use a gradient method (AllReduce, TopK, PowerSGD)")
        for st in cut.stages:
            if len(st.ranks) > 1:
                self._replicas(maker, rank, st, st is stage, module, method, bucket_bytes)
        if device.type == "cuda":
            # CUDA path: transfers on their own stream, ordered with events. NCCL moves GPU
            # memory itself; a CPU-only backend (Gloo) gets host-staged copies, which is what lets
            # several ranks share one GPU (NCCL refuses two ranks on one device).
            self.executor.use_cuda(device.index if device.index is not None else torch.cuda.current_device())
            if "nccl" not in maker.backend:
                self.executor.set_host_staging(True)
        elif "gloo" in maker.backend:
            # CPU stages over Gloo: every receive of a step posted at its start, so that no rendezvous
            # send waits for its sender's communication thread (runtime/executor.h, ReceivePosting);
            # the buffers are host memory, as many as fit what the plan leaves of its memory limit.
            # GPU stages keep one ahead: their buffers are GPU memory.
            self.executor.set_receive_posting(_C.ReceivePosting.whole_step, memory_headroom)

    def _replicas(self, maker: GroupMaker, rank: int, st: StageModule, mine: bool, module: nn.Module,
                  method: SyncMethod, bucket_bytes: float) -> None:
        """The group of replicated stage ``st``'s replicas (made by every rank, in stage order),
        for the sync method's communication (replica_sync.py); on its replicas, the sync."""
        sub = maker.make(list(st.ranks), f"the replicas of stage {st.index}")
        self.replica_groups.append(sub)
        hierarchy = self._hierarchy(maker, rank, st, method) if getattr(method, "hierarchical", False) else None
        if not mine:
            return
        # Replicas start equal, as DDP's do: the first replica's parameters and buffers.
        broadcast_from_first_replica(module, sub)
        self.my_replica_group = sub
        bind_sync_batchnorm(module, sub)
        params = [p for p in module.parameters() if p.requires_grad]
        self.replica_sync = ReplicaSync(method, params, sub, maker.timeout, bucket_bytes, hierarchy)
        if method.local_updates:
            self.executor.set_local_updates(True)
        else:
            self.buckets = self.replica_sync.buckets
            self.executor.set_gradient_buckets(self.buckets)

    def _hierarchy(self, maker: GroupMaker, rank: int, st: StageModule, method: Any) -> tuple[Any, Any] | None:
        """AllReduce(hierarchical=True): the groups of stage ``st``'s replicas on one node, and of
        its replicas with the same index on each node; every rank makes every group, in stage then
        node order. Returns this rank's two groups, None for a stage on one node. A node is
        ``ranks_per_node`` consecutive global ranks (torchrun numbers them so)."""
        per_node = method.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", len(maker.global_ranks)))
        nodes: dict[int, list[int]] = {}
        for r in st.ranks:
            nodes.setdefault(maker.global_ranks[r] // per_node, []).append(r)
        if len(nodes) < 2:
            return None
        sizes = {len(v) for v in nodes.values()}
        if len(sizes) != 1:
            raise InputError(f"AllReduce(hierarchical=True): stage {st.index}'s replicas are spread unevenly over "
                             f"nodes ({ {n: len(v) for n, v in nodes.items()} }); a hierarchical sum needs as many "
                             "replicas on every node")
        mine: list[Any] = [None, None]
        made = [(list(v), 0) for v in nodes.values()]
        made += [([v[i] for v in nodes.values()], 1) for i in range(sizes.pop())]
        for members, level in made:
            g = maker.make(members, f"stage {st.index}'s replicas {'inside a node' if level == 0 else 'across nodes'}")
            self.replica_groups.append(g)
            if rank in members:
                mine[level] = g
        return (mine[0], mine[1]) if rank in st.ranks else None

    def close(self, failing: bool = False) -> None:
        """Releases the executor and destroys the pipeline's groups. Idempotent.

        ``failing``: the handles go at once, so that Gloo closes this rank's connections and the
        peers blocked on them wake (failure.py). Otherwise they are parked until the next clean
        close or the interpreter's exit (see ``_parked``)."""
        _live.pop(id(self), None)
        if failing and self.executor is not None:
            self.executor.disconnect()  # a kept exception's frames may still hold the executor
        self.executor = None
        self.shared = None
        self.buckets = None
        self.replica_sync = None
        self.my_replica_group = None
        for sub in self.replica_groups:
            if sub is not None:
                try:
                    dist.destroy_process_group(sub)
                except Exception:
                    pass
        groups, self.replica_groups = [g for g in self.replica_groups if g is not None], []
        if self.pg is not None:
            pg, self.pg = self.pg, None
            try:
                dist.destroy_process_group(pg)
            except Exception:
                pass
            groups.append(pg)
        if failing:
            del groups
            gc.collect()  # the group closes its connections when its last handle goes
        else:
            _parked[:] = groups  # releases, on this (the main) thread, the groups parked before


class Link:
    """A pipeline's connections as its collectives use them (a step, an evaluation, a checkpoint,
    every exchange of verdicts): the executor and the group of a usable pipeline, and the one way
    to fail together (``Failures.collective``), which closes these connections.

    ``failures`` is made here over ``board``; ``conn`` (empty until :meth:`connect`) and
    ``flight`` come once the pipeline is connected."""

    def __init__(self, board: FailureBoard, timeout: float) -> None:
        self.conn = Connections()  # nothing to release until connected
        self.failures = Failures(board, timeout, self._close_failing)

    def _close_failing(self) -> None:
        self.conn.close(failing=True)

    def connect(self, conn: Connections, flight: Any) -> None:
        """Takes the connections made for the pipeline, and its flight recording (flight.py),
        which watches the executor's recorder."""
        self.conn = conn
        flight.attach(conn.executor.flight_recorder)
        self.failures.flight = flight

    @property
    def rank(self) -> int:
        return self.failures.board.rank

    @property
    def flight(self) -> Any:
        """The pipeline's flight recording (None before it is connected)."""
        return self.failures.flight

    def executor(self) -> Any:
        """The executor of a usable pipeline: InputError after a failure or a close."""
        return self.failures.usable(self.conn.executor)

    def group(self) -> Any:
        """The pipeline's process group for collectives outside the executor (a usable
        pipeline's: InputError after a failure or a close)."""
        self.executor()
        return self.conn.pg

    def collective(self, what: str) -> Collective:
        """``Failures.collective``: any error inside fails the pipeline on every rank."""
        return self.failures.collective(what)

    def activity(self, what: str, peers: list[int] | None = None) -> Any:
        """What this rank does outside the executor, waiting for ``peers`` (flight.py)."""
        return self.failures.activity(what, peers)

    def waiting(self, what: str) -> Any:
        """:meth:`activity` waiting for every other rank."""
        return self.failures.waiting(what)

    def gather(self, local: Any, during: str) -> list[Any]:
        """``local`` from every rank, on every rank (``Failures.gather`` over :meth:`group`)."""
        return self.failures.gather(self.group, local, during)

    def agree(self, what: str, refusal: str | None) -> None:
        """Every rank's verdict on ``what`` (``Failures.agree`` over :meth:`group`): returns when
        none refused, else the same InputError on every rank."""
        self.failures.agree(self.group, what, refusal)

    def sync_state(self) -> dict[str, Any]:
        """This rank's replica sync state (empty without a replicated stage)."""
        sync = self.conn.replica_sync
        return sync.state_dict() if sync is not None else {}

    def load_sync_state(self, state: Mapping[str, Any], what: str) -> None:
        """Collective: restores :meth:`sync_state`'s state on every rank, or, if any rank's does
        not fit, on none (every rank raises InputError naming it)."""
        self.agree(what, sync_state_refusal(self.conn.replica_sync, state, self.rank))
        if self.conn.replica_sync is not None:
            self.conn.replica_sync.load_state_dict(dict(state))

    def close(self) -> None:
        """Releases the connections and stops the flight recording (a clean close)."""
        if self.failures.flight is not None:
            self.failures.flight.close()
        self.conn.close()
