"""Fault-tolerant training across pipeline replicas: a lost replica costs a step, not the job.

R replicas of one graph pipeline train together; each replica is an ordinary graphpipe
:class:`~graphpipe.runtime.pipeline.Pipeline` on its own process group (its own ``torchrun``),
and the stages' gradients are averaged across the replicas. When any rank of a replica dies,
hangs past the timeout or raises, that replica's ranks fail together (graphpipe's own failure
propagation), its launcher restarts them, and the other replicas redo the step without it and go
on: nothing stops, no checkpoint is read. The restarted replica joins at a step boundary and
receives every stage's parameters, buffers and optimizer state from a live replica, over the
network, stage by stage.

What is torchft's (PyPI ``torchft``, used unchanged) and what is written here:

- torchft: the lighthouse and the quorum (who is alive, who must heal, from whom), the
  reconfigurable cross-replica Gloo group of each pipeline rank (the same rank of every replica),
  the gradient average over the replicas that take part (``Manager.allreduce``, which never
  raises: a failed collective marks the step errored), the commit vote of every rank of a
  replica (``Manager.should_commit``) and the state transfer to a healing replica (its HTTP
  checkpoint transport, rank to rank).
- here: one ``Manager`` per pipeline rank (``rank``/``world_size`` are the pipeline's), the
  store that the replica's Manager servers meet on (a fresh one per launch attempt, its address
  passed through the pipeline's own store), the step (pipeline step, then the gradients and the
  loss and the floating-point buffers averaged across replicas, then the optimizer only on a
  committed step whose averaged gradients are finite, the forward's buffer updates undone on a
  step that does not land), the state a healing stage receives
  (stage module, optimizer, step count, and the plan's fingerprint, checked) and the refusal to
  start from scratch when no replica is left to heal from.

Semantics of a step in which a replica fails: it is not committed on any replica; the survivors
redo it (the same step number, so the same batches) with the replicas still alive, and the
average is over those replicas' samples only (``loss`` and gradients are each replica's
full-batch means, averaged over the ``participants``).

A rank's death inside one replica fails that whole replica (its launcher must restart every
rank of it: ``torchrun`` does): torchft heals whole replica groups only, and a half-dead
replica whose rank 0 still answers the lighthouse would block the others' quorum
(docs/torchft_findings.md §3.3).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import GraphpipeError, InputError
from graphpipe.runtime.nonfinite import StepGuard
from graphpipe.runtime.pipeline import Pipeline, wrap
from graphpipe.runtime.plan import plan_fingerprint
from graphpipe.sync import AllReduce

__all__ = ["FaultTolerantPipeline", "NoReplicaToHealFrom", "StepResult", "StepSeconds", "fault_tolerant"]

#: How often a starting replica asks the lighthouse whether the others have joined.
_JOIN_POLL_SECONDS = 0.1
#: Key, in the pipeline's store, of the address of this launch attempt's Manager store.
_STORE_KEY = "graphpipe/fault_tolerance/manager_store"


class NoReplicaToHealFrom(GraphpipeError):
    """A replica restarted by its launcher found no live replica with a trained state to heal
    from: every replica was lost. Training from the initial parameters would silently restart
    the job; resume from the last checkpoint instead (``Pipeline.load``)."""


@dataclass(frozen=True)
class StepResult:
    """What one :meth:`FaultTolerantPipeline.step` did.

    ``committed``: this replica's commit vote passed and its step landed (False: a replica failed
    during the step; the same step number comes again). The vote is torchft's, inside one
    replica; a failure breaks the cross-replica all-reduce of every live replica, so they all
    vote no, and a replica that committed a step the others did not is healed at the next
    quorum. ``loss``: the full-batch loss averaged over the replicas that took part (this
    replica's own when not committed). ``participants``: how many replicas took part. ``step``:
    the step number whose batches were trained (read after the quorum: a replica that healed
    there has its source's). ``healed``: this replica received its state from a live replica at
    the start of the step. ``skipped``: committed, but the averaged gradients held a NaN or an
    infinity on some stage, so no replica stepped its optimizer (``wrap(skip_nonfinite=False)``
    turns the check off). ``seconds``: where this rank's step went (:class:`StepSeconds`)."""

    committed: bool
    loss: float
    participants: int
    step: int
    healed: bool
    skipped: bool = False
    seconds: StepSeconds | None = None


@dataclass(frozen=True)
class StepSeconds:
    """Wall-clock seconds of one rank's fault-tolerant step, phase by phase: what
    ``graphpipe.simulate(..., cross_replica=...)`` predicts, to compare with (the bench does).

    ``quorum``: torchft's quorum (healing included); ``pipeline``: the pipeline step;
    ``average``: the cross-replica all-reduces of the gradients, buffers and loss; ``agreement``:
    the commit vote and the finiteness check; ``optimizer``: the optimizer step (0 when the step
    did not land). Host times: on a GPU, a phase's kernels may still run in the next phase.
    What ``batch_for`` takes is in none of them."""

    quorum: float
    pipeline: float
    average: float
    agreement: float
    optimizer: float

    @property
    def coordination(self) -> float:
        """What ``CrossReplica.coordination_seconds`` stands for: the quorum and the agreement."""
        return self.quorum + self.agreement


def _manager_store(pipe: Pipeline, replica: int) -> tuple[str, int, Any]:
    """The TCPStore this replica's Managers meet on, hosted by pipeline rank 0 (a fresh one on
    a free port per launch attempt, so a restarted replica never reads its previous attempt's
    Manager address), and its address; the address reaches the other ranks through the
    pipeline's own store, which graphpipe.init_distributed already namespaces per attempt."""
    pipeline_store = dist.distributed_c10d._get_default_store()
    # Per replica (replicas that share a default store do not read each other's) and per launch
    # attempt (a store that outlives an attempt, torchrun's agent's, keeps the old address).
    key = f"{_STORE_KEY}/{replica}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if pipe.rank == 0:
        host = socket.gethostname()
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=pipe.timeout))
        pipeline_store.set(key, f"{host}:{store.port}")
        return host, store.port, store
    address = pipeline_store.get(key).decode()
    host, port = address.rsplit(":", 1)
    return host, int(port), None


class FaultTolerantPipeline:
    """One rank of one replica of a fault-tolerant graph pipeline (build it with
    :func:`fault_tolerant`). Train with ``while ft.current_step < steps: ft.step(batch_for)``, where
    ``batch_for(step)`` gives this replica's batch of that step, so a redone step reads the same
    one."""

    def __init__(self, pipe: Pipeline, optimizer: torch.optim.Optimizer | None, replica: int, lighthouse: str,
                 min_replicas: int = 1, timeout: float = 30.0, quorum_timeout: float = 120.0,
                 checkpoint_hint: str | None = None, start_replicas: int = 1, join_timeout: float = 60.0,
                 max_redos: int = 20) -> None:
        try:
            from torchft import Manager, ProcessGroupGloo
        except ImportError as exc:  # an optional dependency: only this module needs it
            raise InputError("graphpipe.fault_tolerant needs torchft (pip install torchft)") from exc
        if not isinstance(pipe.sync_method, AllReduce):
            raise InputError(f"graphpipe.fault_tolerant: sync={pipe.sync_method.describe()} keeps state between "
                             "steps that a healing replica would not receive; use the default sync='allreduce'")
        if replica < 0:
            raise InputError(f"graphpipe.fault_tolerant: replica must be >= 0, got {replica}")
        self.pipe, self.optimizer, self.replica = pipe, optimizer, replica
        self._checkpoint_hint = checkpoint_hint
        self._start_replicas, self._join_timeout = start_replicas, join_timeout
        # a healing stage checks it against its source's: the state of another plan's stage is wrong here
        self._fingerprint = plan_fingerprint(pipe.plan, pipe.graph)[:16]
        self._params = [p for p in pipe.parameters() if p.requires_grad]
        # Floating-point buffers (BatchNorm's running statistics) are averaged with the gradients:
        # each replica's forward updates them from its own batch.
        self._buffers = [b for b in pipe.module.buffers() if b.is_floating_point()]
        #: Committed steps whose averaged gradients were not finite (no optimizer step anywhere).
        self.skipped_steps = 0
        self._healed = False
        self._first_quorum = True
        host, port, self._store = _manager_store(pipe, replica)
        deadline = timedelta(seconds=timeout)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=deadline), load_state_dict=self._load_state, state_dict=self._state,
            min_replica_size=min_replicas, use_async_quorum=False, timeout=deadline,
            quorum_timeout=timedelta(seconds=quorum_timeout), connect_timeout=deadline,
            rank=pipe.rank, world_size=pipe.world_size, store_addr=host, store_port=port,
            lighthouse_addr=lighthouse, replica_id=f"graphpipe_replica_{replica}", max_retries=max_redos,
        )

    @property
    def current_step(self) -> int:
        """Steps committed so far (by this replica, or by the replica it healed from)."""
        return int(self.manager.current_step())

    def _state(self) -> dict[str, Any]:
        """What a healing replica's same pipeline rank receives from this one."""
        # A copy: torchft's HTTP transport serves it while this replica's next forward updates
        # its buffers in place. (The parameters and the optimizer's state stay still until the
        # commit vote, which waits for the transfers.)
        module = {k: v.detach().clone() for k, v in self.pipe.module.state_dict().items()}
        return {"plan": self._fingerprint, "module": module,
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "step_count": self.pipe.step_count}

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["plan"] != self._fingerprint:
            raise InputError(f"graphpipe.fault_tolerant: replica {self.replica} rank {self.pipe.rank} runs plan "
                             f"{self._fingerprint}, the replica it heals from runs {state['plan']}: every replica "
                             "must plan alike (pass the same plan= or a deterministic partitioner)")
        self.pipe.module.load_state_dict(state["module"])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        self.pipe.step_count = int(state["step_count"])
        self._healed = True

    def _quorum(self) -> bool:
        """Joins the step's quorum (healing this replica first when it is behind); True when it
        healed."""
        self._healed = False
        self.manager.start_quorum()
        if self._first_quorum:
            self._first_quorum = False
            attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
            if attempt == 0 and self.current_step == 0:  # a job's start, not a replica joining a run
                self._await_replicas()
            if attempt > 0 and self.current_step == 0:
                where = f" ({self._checkpoint_hint})" if self._checkpoint_hint else ""
                raise NoReplicaToHealFrom(
                    f"graphpipe.fault_tolerant: replica {self.replica} restarted (attempt {attempt}) and no live "
                    f"replica has a trained state to heal from: every replica was lost (or the others finished "
                    f"the run before this one started); resume from the last "
                    f"checkpoint{where} with Pipeline.load instead of training from the initial parameters")
        return self._healed

    def _await_replicas(self) -> None:
        """At a job's start, asks for quorums until ``start_replicas`` replicas are in one (or
        ``join_timeout`` passes): the lighthouse forms a quorum of whoever asks first, and a
        replica that plans sooner would otherwise train alone until the next one heals from it.
        The number of tries, not a clock, bounds it, so every rank of a replica, which all see
        the same quorums, stops after the same one."""
        tries = int(self._join_timeout / _JOIN_POLL_SECONDS)
        while self.manager.num_participants() < self._start_replicas and tries > 0:
            tries -= 1
            time.sleep(_JOIN_POLL_SECONDS)
            self.manager.start_quorum()

    def _average(self, loss: torch.Tensor) -> tuple[bool, float]:
        """Averages this rank's gradients, floating-point buffers and the loss over the replicas
        taking part (torchft's allreduce: it divides by the participants and never raises);
        False when it failed."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        loss_buffer = loss.detach().to(torch.float64).reshape(1).clone()
        flats = [(tensors, torch._utils._flatten_dense_tensors(tensors)) for tensors in (grads, self._buffers) if tensors]
        works = [self.manager.allreduce(loss_buffer)] + [self.manager.allreduce(flat) for _, flat in flats]
        ok = all([work.wait() for work in works])
        if ok:
            averaged = {id(t): a for tensors, flat in flats
                        for t, a in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors))}
            with torch.no_grad():
                for p, g in zip(self._params, grads):
                    if p.grad is None:
                        p.grad = averaged[id(g)]
                    else:
                        p.grad.copy_(averaged[id(g)])
                for b in self._buffers:
                    b.copy_(averaged[id(b)])
        return ok, float(loss_buffer[0])

    def _nonfinite(self) -> bool:
        """Whether the averaged gradients hold a NaN or an infinity on any rank of this replica
        (the same on every replica: their averages are equal), by the non-finite guard's own
        check (runtime/nonfinite.py), agreed over the pipeline's group."""
        flag = torch.tensor([StepGuard.local_flag(self._params, None, None)])
        dist.all_reduce(flag, group=self.pipe.group)
        return bool(flag.item() > 0)

    def step(self, batch_for: Callable[[int], tuple[Any, Any]]) -> StepResult:
        """One fault-tolerant training step. ``batch_for(step)`` returns this replica's
        ``(inputs, targets)`` of a step number; it is called after the step's quorum, because a
        replica that heals there jumps to the step of the replica it heals from."""
        clock = [time.perf_counter()]

        def lap() -> float:
            clock.append(time.perf_counter())
            return clock[-1] - clock[-2]

        healed = self._quorum()
        quorum = lap()
        step = self.current_step
        inputs, targets = batch_for(step)
        lap()  # the batch is the caller's
        if self.optimizer is not None:
            self.optimizer.zero_grad()
        saved_buffers = StepGuard.save_buffers(self.pipe.module)
        loss = self.pipe.step(inputs, targets)
        pipeline = lap()
        ok, averaged = self._average(loss)
        average = lap()
        committed = bool(self.manager.should_commit()) and ok
        skipped = committed and self.pipe.skip_nonfinite and self._nonfinite()
        agreement = lap()
        if committed and not skipped:
            if self.optimizer is not None:
                self.optimizer.step()
        else:  # redone, or skipped: the forward's buffer updates must not count
            StepGuard.restore_buffers(self.pipe.module, saved_buffers)
        self.skipped_steps += int(skipped)
        if self.optimizer is not None:
            self.optimizer.zero_grad()
        # The pipeline counts its tries; a checkpoint, a healed replica and GRAPHPIPE_FAULT read
        # the steps that landed.
        self.pipe.step_count = self.current_step
        seconds = StepSeconds(quorum, pipeline, average, agreement, lap())
        return StepResult(committed, averaged if committed else float(loss), int(self.manager.num_participants()),
                          step, healed, skipped, seconds)

    def close(self) -> None:
        """Leaves the quorum and releases the pipeline."""
        self.manager.shutdown(wait=False)
        self.pipe.close()


def _plans_here(wrap_keywords: dict[str, Any]) -> bool:
    """Whether ``wrap`` will plan, and the replicas are left to the default price: no plan given,
    no ``cross_replica`` among the options' planning options, and a pipeline of two ranks or more
    (one device describes no link to price the replicas by, and all its candidates hold every
    parameter alike, so pricing would not change its plan)."""
    options = wrap_keywords.get("options")
    if wrap_keywords.get("plan") is not None or (options is not None and options.plan is not None):
        return False
    if options is not None and "cross_replica" in options.plan_options:
        return False
    group = wrap_keywords.get("group", options.group if options is not None else None)
    return dist.get_world_size(group) > 1


def fault_tolerant(model: nn.Module, example_inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                   make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None, *,
                   replica: int, lighthouse: str | None = None, min_replicas: int = 1, ft_timeout: float = 30.0,
                   quorum_timeout: float = 120.0, checkpoint_hint: str | None = None, start_replicas: int = 1,
                   join_timeout: float = 60.0, max_redos: int = 20, cross_replica: Any = None,
                   **wrap_keywords: Any) -> FaultTolerantPipeline:
    """Wraps ``model`` as one replica of a fault-tolerant graph pipeline. Every rank of replica
    ``replica`` (0, 1, ...; its default process group holds that replica's ranks only, e.g. one
    ``torchrun`` per replica with ``--max-restarts``) calls it alike.

    Args:
        model, example_inputs, loss_fn, wrap_keywords: as for :func:`graphpipe.wrap`; every
            replica must get the same plan (a ``plan=``, or a partitioner that does not measure).
        make_optimizer: builds this rank's optimizer from its stage's parameters (None: no
            optimizer, e.g. on a rank without parameters).
        replica: this replica's index, the same on all its ranks and kept across restarts.
        lighthouse: the torchft lighthouse's address (default: ``TORCHFT_LIGHTHOUSE``).
        min_replicas: a step commits only with at least this many replicas.
        ft_timeout: seconds a cross-replica collective or Manager call may take (a hung replica
            costs this much once).
        quorum_timeout: seconds a quorum may take.
        checkpoint_hint: named in :class:`NoReplicaToHealFrom` when every replica is lost.
        start_replicas: the first step of a job (not of a replica that joins a run) waits (up to
            ``join_timeout`` seconds) until this many replicas are in the quorum: a job's replicas
            start together.
        max_redos: how many times in a row a step may fail to commit (e.g. fewer than
            ``min_replicas`` alive) before torchft raises ``RuntimeError``.
        cross_replica: what the planner prices the replicas by (a ``graphpipe.CrossReplica``:
            their count, the link between them, the per-step coordination); default
            ``CrossReplica(replicas=start_replicas)`` on the devices' own link, for a pipeline of
            two ranks or more that ``wrap`` plans. Every candidate plan is simulated with its
            ranks' average across the replicas, so a rank pays for the parameters it holds.
            Given beside ``plan=``, ``wrap`` refuses it (a plan given runs as it is).
    """
    address = lighthouse or os.environ.get("TORCHFT_LIGHTHOUSE")
    if not address:
        raise InputError("graphpipe.fault_tolerant: no lighthouse address: pass lighthouse= or set "
                         "TORCHFT_LIGHTHOUSE (start one with torchft_lighthouse --min_replicas 1)")
    if cross_replica is not None:  # passed on as given: wrap refuses it beside a plan=
        wrap_keywords["cross_replica"] = cross_replica
    elif _plans_here(wrap_keywords):
        wrap_keywords["cross_replica"] = _C.CrossReplica(replicas=max(1, start_replicas))
    pipe = wrap(model, example_inputs, loss_fn, **wrap_keywords)
    params = [p for p in pipe.parameters() if p.requires_grad]
    optimizer = make_optimizer(params) if make_optimizer is not None and params else None
    return FaultTolerantPipeline(pipe, optimizer, replica, address, min_replicas, ft_timeout, quorum_timeout,
                                 checkpoint_hint, start_replicas, join_timeout, max_redos)
