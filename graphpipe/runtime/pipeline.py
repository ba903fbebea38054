"""graphpipe.wrap / Pipeline: trains a model's plan on torch.distributed ranks, one stage per rank
(or several: a replicated stage runs data parallel on each of its ranks, each on its rows of
every micro-batch, ``_C.shard_rows``).

Every rank calls ``wrap`` with the same model, example inputs and options; each keeps only its
own stage module (and so its own parameters). ``step(inputs, targets)`` runs one training
iteration: the batch is cut into the plan's micro-batches, the rank's instruction list from the
schedule is executed in C++ (graphpipe._C.Executor: point-to-point transfers over the process
group, the backward through torch::autograd), and the full-batch loss is returned on every rank.
The plan is a C++ ``Plan`` on every rank, loaded from the same JSON text by the C++ loader, and
the schedule is the C++ ``Schedule`` that ``graphpipe.simulate`` predicts.

This module is the facade; each concern has its module in graphpipe/runtime/ (docs/design.md
§7.6), and none of them reaches back into ``Pipeline``: ``options.py`` (WrapOptions, declared
once), ``rendezvous.py`` (trace, plan on rank 0, agreement across ranks, plan loading),
``process_group.py`` (``Ranks``, the pipeline's groups), ``stages.py`` (the traced model cut
into the plan's stages, ``LocalStage``), ``state_dicts.py`` (``ModelFacts``, state dicts),
``connections.py`` (process groups, executor, replicas' sync; ``Link``, those as collectives
use them), ``failure.py`` (failing together, one way), ``batch_prep.py`` (batch checks,
micro-batches, wire layouts), ``stage_call.py`` (the callback the executor calls for F),
``steps.py`` (the collective part of a step: ``Steps``, with ``nonfinite.py``'s guard,
``faults.py``'s injector and ``replica_check.py``), ``checkpoint.py`` (DCP checkpoints, from a
``checkpoint.Parts``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe.errors import InputError
from graphpipe.runtime import faults
from graphpipe.runtime.batch_prep import BatchPrep
from graphpipe.runtime.connections import Connections, GroupMaker, Link, check_backend
from graphpipe.runtime.failure import FailureBoard, pipeline_store
from graphpipe.runtime.flight import Flight, dump_dir, enable_nccl_flight_recorder
from graphpipe.runtime.measure import SavedActivations, tasks_from_timings
from graphpipe.runtime.nonfinite import StepGuard
from graphpipe.runtime.options import DEFAULT_TIMEOUT, WrapOptions
from graphpipe.runtime.plan import stage_ranks
from graphpipe.runtime.process_group import Ranks
from graphpipe.runtime.rendezvous import Agreed, rendezvous
from graphpipe.runtime.replica_check import ReplicaCheck
from graphpipe.runtime.stage_call import StageFn, stage_call
from graphpipe.runtime.stages import NO_PARAMETERS, LocalStage, build_stages, stage_device
from graphpipe.runtime.state_dicts import ModelFacts, load_refusal
from graphpipe.runtime.steps import Steps, loss_callback
from graphpipe.simulation import schedule_for
from graphpipe.sync import SyncMethod
from graphpipe.sync import parse as parse_sync

if TYPE_CHECKING:  # checkpoint.py is imported on first use: torch.distributed.checkpoint is slow to import
    from graphpipe.runtime.checkpoint import Parts

__all__ = ["DEFAULT_TIMEOUT", "WrapOptions", "Pipeline", "wrap"]

class Pipeline:
    """One rank's share of a pipelined model. Build it with :func:`wrap` (which takes the same
    arguments): ``options`` a :class:`WrapOptions`, or its fields as keywords.

    What it holds, each for one thing: ``options``, ``group`` and where this rank sits
    (``_ranks``); the plan, its graph and schedule; the facts kept from the trace (``_facts``,
    the model's names and capture); this rank's stage (``_local``); the batch preparation
    (``_batches``); the link (``_link``: connections, executor and failing together); and the
    collective part of a step (``_steps``, which holds the step guard, the fault injector and the
    replica check). Values derived from the options are read from ``options``."""

    def __init__(self, model: nn.Module, example_inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                 options: WrapOptions | None = None, **keywords: Any) -> None:
        options = WrapOptions.from_keywords(options, **keywords)
        if not dist.is_available() or not dist.is_initialized():
            raise InputError(
                "graphpipe.wrap needs an initialised torch.distributed process group: run under "
                "torchrun or call torch.distributed.init_process_group first"
            )
        self.options = options
        self.group = options.group if options.group is not None else dist.distributed_c10d._get_default_group()
        self._ranks = ranks = Ranks.of(self.group)
        self.loss_fn = loss_fn
        # Checked here, before anything is exchanged (each raises InputError naming its option).
        bucket_bytes = options.bucket_size()
        sync_method = parse_sync(options.sync)
        options.check_every()
        # Everything rank-local is guarded: a rank that fails publishes its cause, and the others,
        # polling the store in the exchanges, raise naming it instead of waiting.
        board = FailureBoard(pipeline_store(list(ranks.global_ranks)), ranks.rank, ranks.world_size, self.timeout)
        self._link = Link(board, self.timeout)
        # GRAPHPIPE_FAULT, parsed once: a bad value fails wrap on every rank, naming it.
        injector = faults.Injector(board.guard(faults.from_environment), ranks.rank, self.timeout,
                                   self._link.activity)
        #: Training steps this pipeline completed (restored by :meth:`load`).
        self.step_count = 0
        self.last_timings: list[Any] = []
        agreed = rendezvous(board, ranks.rank, ranks.world_size, model, example_inputs, options, sync_method)
        self.graph = agreed.traced.graph
        self.plan = agreed.plan
        board.guard(lambda: self._build(agreed, model))
        backend = str(dist.get_backend(self.group)).lower()
        folder = dump_dir(options.flight_recorder_dir)
        if backend == "nccl":  # torch's own flight recorder, read when its group is made
            enable_nccl_flight_recorder(folder)
        maker = GroupMaker(list(ranks.global_ranks), ranks.world_size == dist.get_world_size(), backend,
                           self.timeout, board)
        conn = Connections.connect(maker, ranks.world_size, self.schedule, self._local, sync_method, bucket_bytes,
                                   self.device, self.plan.memory_headroom(ranks.rank))
        self._link.connect(conn, Flight(board.store, ranks.rank, ranks.world_size, self.timeout, folder,
                                        [(int(e.src), int(e.dst)) for e in self.plan.edges]))
        del conn
        replicas = ReplicaCheck(options.check_every(), bool(getattr(sync_method, "local_updates", False)),
                                self._link, self._local)
        self._steps = Steps(self._link, self._local, ranks, self.device, sync_method, bool(options.skip_nonfinite),
                            StepGuard(), injector, replicas)

    def _build(self, agreed: Agreed, model: nn.Module) -> None:
        """Cuts the traced model into the plan's stages and keeps this rank's."""
        traced = agreed.traced
        # The very call graphpipe.simulate makes: the executor runs the schedule it predicts.
        self.schedule = schedule_for(self.plan, self.options.schedule_for(self.plan))
        cut = build_stages(traced.module, self.plan, traced.graph)
        self._local = LocalStage.keep(cut, model, self.rank)
        self.device = stage_device(self._local.module, self.options.device)
        check_backend(self.device, bool(self._local.stages), str(dist.get_backend(self.group)).lower())
        self._facts = ModelFacts.of(model, traced)
        self._batches = BatchPrep(traced, agreed.example_args, cut, len(self.plan.edges), self.num_micro_batches,
                                  self.device, self._facts.name)

    # ---- where it runs, and what the options say ----------------------------------------------
    @property
    def rank(self) -> int:
        """This rank in the pipeline's group."""
        return self._ranks.rank

    @property
    def world_size(self) -> int:
        """The number of ranks in the pipeline's group."""
        return self._ranks.world_size

    @property
    def timeout(self) -> float:
        """Seconds any wait of the pipeline may take (``wrap(timeout=)``)."""
        return float(self.options.timeout)

    @property
    def sync_method(self) -> SyncMethod:
        """How replicated stages synchronise (``wrap(sync=)`` as a method)."""
        return self._steps.sync_method

    @property
    def skip_nonfinite(self) -> bool:
        """Whether a step with non-finite gradients on some stage is skipped on every rank."""
        return bool(self.options.skip_nonfinite)

    @property
    def check_replicas_every(self) -> int | None:
        """``wrap(check_replicas_every=)``: every how many steps the replicas are compared."""
        return self.options.check_every()

    @property
    def num_micro_batches(self) -> int:
        """The plan's number of micro-batches per step."""
        return int(self.plan.num_micro_batches)

    @property
    def schedule_kind(self) -> str:
        """The name of the schedule this pipeline runs (``self.schedule.kind``): the one asked
        for, the one the plan was made for, or a given ``Schedule``'s kind."""
        return str(self.schedule.kind)

    @property
    def module(self) -> nn.Module:
        """The module this rank runs: its stage's (a placeholder without one)."""
        return self._local.module

    @property
    def output_ranks(self) -> list[int]:
        """The ranks of the stage that computes the model output (and the loss)."""
        return self._local.output_ranks

    # ---- lifetime and failure --------------------------------------------------------------
    def close(self) -> None:
        """Releases the C++ executor and the pipeline's own process groups (and, on GPUs, its
        transfer stream). Call it, or leave a ``with`` block, before
        ``torch.distributed.destroy_process_group()``: a process group that outlives the
        interpreter's shutdown through a leftover handle can abort the process. Idempotent;
        the pipeline cannot step afterwards, its parameters and state dicts stay readable."""
        self._link.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.executor is None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def executor(self) -> Any:
        """This rank's ``graphpipe._C.Executor`` (None once closed)."""
        return self._link.conn.executor

    @property
    def gradient_buckets(self) -> Any:
        """This rank's replicated stage's ``_C.GradientBuckets`` (None without one, or with a
        local sync method)."""
        return self._link.conn.buckets

    # ---- parameters, modes and the stage ---------------------------------------------------
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """This rank's parameters (its stage's), the ones its optimizer must step. A rank whose
        stage has none gets one empty frozen placeholder, so ``torch.optim.SGD(pipe.parameters())``
        works on every rank (torch refuses an empty list) and steps nothing there."""
        return self.module.parameters(recurse)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the original model's names (not the placeholder)."""
        return ((n, p) for n, p in self.module.named_parameters() if n != NO_PARAMETERS)

    def train(self, mode: bool = True) -> Pipeline:
        """Puts this rank's stage in training (or eval) mode, as its capture front end switches
        it (a torch.export capture switches its dropout, attention dropout and batch norm
        operators, docs/capture.md); InputError where the capture cannot run the mode (captured
        in eval, or branching on self.training)."""
        modes = self._facts.modes
        modes.check(self._facts.name, bool(mode))
        # Each stage's own module: with several stages on this rank, self.module only holds their
        # state, and the operators a capture switches are in the stages' graphs.
        for st in self._local.stages:
            modes.switch(st.module, bool(mode))
            st.module.train(mode)
        self.module.train(mode)
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    @property
    def stage(self) -> int:
        """Index of the stage this rank runs, the first of them when it runs several (-1 when it
        holds none)."""
        return self._local.index

    @property
    def stages(self) -> list[int]:
        """Indices of every stage this rank runs (several where the plan puts several stages on
        its device)."""
        return [st.index for st in self._local.stages]

    @property
    def stage_ranks(self) -> list[int]:
        """The ranks that run this rank's stage, its first replica first ([] when it holds none)."""
        return self._local.ranks

    @property
    def output_rank(self) -> int:
        """The first rank of the stage that computes the model output (and the loss)."""
        return self.output_ranks[0]

    @property
    def model_keys(self) -> list[str]:
        """The plain model's ``state_dict`` keys, in its order (aliases included)."""
        return list(self._facts.state_keys)

    def schedule_table(self) -> str:
        """The schedule as a table (one row per rank)."""
        return self._link.executor().schedule_table()

    def swap_stage_module(self, make: Callable[[nn.Module], nn.Module],
                          weights: Callable[[nn.Module], Iterable[nn.Parameter]] | None = None,
                          stage: int | None = None) -> None:
        """Replaces the module of this rank's ``stage`` (default: its only one) by
        ``make(module)`` (nothing on a rank without a stage): the seam for tools that stand in
        for a stage's compute, such as ``graphpipe.emulation.emulate_stage``. The new module must take
        and return what the old one did. ``weights(new_module)``: what a split backward's W
        computes the gradients of (default: the new module's trainable parameters). On a rank
        with several stages, :attr:`module` then holds the stages' modules by index."""
        if not self._local.stages:
            return
        if stage is None and len(self._local.stages) > 1:
            raise InputError(f"swap_stage_module: rank {self.rank} runs stages {self.stages}; name the one to "
                             "replace (stage=)")
        index = self._local.swap(make(self._local.stage_module(stage)), stage)
        if self.executor is not None:
            new = self._local.stage_module(index)
            chosen = weights(new) if weights is not None else (p for p in new.parameters() if p.requires_grad)
            self.executor.set_parameters(index, list(chosen))

    # ---- running -----------------------------------------------------------------------------
    def _stage_fn(self, values: list[dict[str, Any]], on_output: Callable[[int, Any], torch.Tensor | None]) -> StageFn:
        """The executor's F callback for this rank (stage_call.py), for the batch prepared last,
        under ``wrap(autocast=)``."""
        fn = stage_call(self._local.stages, self._link.executor(), self._batches.layouts(),
                        lambda s: bool(self.plan.stages[s].recompute), self._steps.saved, values, on_output)
        if self.options.autocast is None:
            return fn

        def forward(stage: int, m: int, received: list[list[torch.Tensor]]) -> Any:
            with self.options.autocast_context(self.device):
                return fn(stage, m, received)

        return forward

    def step(self, inputs: Any, targets: Any, *, optimizer: Any = None, scaler: Any = None,
             record: bool = False) -> torch.Tensor:
        """One training iteration over a batch; returns the full-batch loss (on every rank).

        Gradients accumulate into this rank's parameters (``.grad``), as if ``loss_fn`` had been
        applied to the whole batch; zero them and step your optimizer as in ordinary training,
        or pass ``optimizer`` (over ``pipe.parameters()``): it is stepped and zeroed inside
        ``step``. With ``wrap(skip_nonfinite=False)`` that happens as soon as this rank's part of
        the iteration is done, before the closing loss sum, which waits for the rank that
        computes the loss (so the step overlaps the other ranks' remaining backward work, as the
        simulator assumes); by default it happens after that sum, which carries every rank's
        non-finite flag. ``record=True`` keeps per-instruction timestamps (``measured_tasks``) and counts the
        activations autograd stashes (``peak_saved_activation_bytes``).

        With ``optimizer``, a step whose gradients are NaN or infinite on any stage is skipped on
        every rank (``skipped_steps``; ``wrap(skip_nonfinite=False)`` turns that off): the
        ranks' flags travel with the loss in the step's closing all-reduce, so every rank
        decides alike (runtime/nonfinite.py). ``scaler``, a ``torch.amp.GradScaler``, scales
        the loss, and its ``found_inf`` is that combined flag, so its step and its scale
        update are the same on every stage.
        """
        StepGuard.check_arguments(optimizer, scaler)
        executor = self._link.executor()
        # wrap(autocast=): the shape propagation and every stage forward (they run in this
        # thread, the executor's forward callback too) see it; the optimizer step does not.
        with self.options.autocast_context(self.device):
            values, mbs = self._batches.inputs(executor, inputs, self._local.replicated)
            replicated_loss = self.rank in self.output_ranks and len(self.output_ranks) > 1
            targets_mb, share = self._batches.targets(executor, targets, mbs, replicated_loss)
            losses: list[torch.Tensor] = []
            on_output = loss_callback(self.loss_fn, targets_mb, share, self.num_micro_batches, scaler, losses)
            self._steps.saved = SavedActivations(self.module.parameters()) if record else None
            stage_fn = self._stage_fn(values, on_output)
        del executor
        total = self._steps.run(stage_fn, losses, mbs, optimizer, scaler, record, self.step_count, self.last_timings)
        self.step_count += 1
        if self._steps.replicas.due(self.step_count, after_step=True):
            self.check_replicas()
        return total.to(self._batches.loss_dtype(mbs))

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped on every rank because some stage's gradients were NaN or
        infinite (see :meth:`step`)."""
        return self._steps.guard.skipped_steps

    def eval_forward(self, inputs: Any) -> Any:
        """Runs the model forward on a batch (no gradients); the merged output on every rank."""
        with self.options.autocast_context(self.device):
            values, _ = self._batches.inputs(self._link.executor(), inputs, self._local.replicated)
        return self._steps.eval(lambda on_output: self._stage_fn(values, on_output), self.num_micro_batches)

    # ---- measurements and replicas ---------------------------------------------------------
    @property
    def peak_saved_activation_bytes(self) -> int:
        """The most bytes autograd held for this rank's backward at any time during the last
        ``step(..., record=True)`` (its stashed activations; parameters not counted)."""
        saved = self._steps.saved
        return saved.peak if saved is not None else 0

    def measured_tasks(self, gather: bool = True) -> list[dict[str, Any]]:
        """The last ``step(..., record=True)`` as graphpipe.viz task dicts: this rank's, or
        (``gather=True``, a collective) every rank's merged, on every rank."""
        edges = [(int(e.src), int(e.dst)) for e in self.plan.edges]
        local = tasks_from_timings(self.last_timings, self.rank, edges, stage_ranks(self.plan))
        if not gather:
            return local
        everyone = self._link.gather(local, "gathering measured tasks")
        return [t for tasks in everyone for t in (tasks or [])]

    def check_replicas(self) -> None:
        """Collective: raises ``InputError`` on every rank when the replicas of some replicated
        stage hold different parameters or buffers (a checksum of each one's bytes, compared
        between replicas), naming the stage, the rank and the first differing entry."""
        self._steps.replicas.check()

    @property
    def sync_stats(self) -> dict[str, Any]:
        """This rank's replica sync so far: the method, steps, synchronisations and the bytes
        it handed to the replicas' collectives (measured); empty unless the rank holds a
        replicated stage."""
        sync = self._link.conn.replica_sync
        return sync.stats() if sync is not None else {}

    def sync_state_dict(self) -> dict[str, Any]:
        """This rank's sync state (local SGD's step and QSR's round, top-k's residuals,
        PowerSGD's error feedback and factors), for a checkpoint: save it with the parameters and
        the optimizer's state, and a resumed run continues exactly as an uninterrupted one."""
        return self._link.sync_state()

    def load_sync_state_dict(self, state: Mapping[str, Any]) -> None:
        """Collective: restores :meth:`sync_state_dict`'s state (of the same rank and sync
        method), on every rank or, if any rank's state does not fit, on none (every rank raises
        ``InputError`` naming it)."""
        self._link.load_sync_state(state, "Pipeline.load_sync_state_dict")

    # ---- state dicts and checkpoints (state_dicts.py, checkpoint.py) -----------------------
    def _checkpoint_parts(self) -> Parts:
        """What checkpoint.py writes and restores of this rank, and what it runs on."""
        from graphpipe.runtime.checkpoint import Parts

        return Parts(self._link, self._local, self._facts, self._ranks, self.plan, self.graph,
                                self.sync_method, self._steps.faults, self.step_count)

    def save(self, path: str, optimizer: Any = None, extra: Mapping[str, Any] | None = None) -> None:
        """Collective: writes a torch.distributed.checkpoint (DCP) checkpoint to the folder
        ``path`` (graphpipe/runtime/checkpoint.py): each rank its stage's parameters, buffers and
        ``optimizer``'s state under the plain model's names, its sync state, the step count and
        ``extra``."""
        from graphpipe.runtime.checkpoint import save

        save(self._checkpoint_parts(), path, optimizer=optimizer, extra=extra)

    def load(self, path: str, optimizer: Any = None) -> dict[str, Any]:
        """Collective: restores a checkpoint written by :meth:`save`, under this plan or
        another one, on every rank or on none; returns the ``extra`` it was saved with."""
        from graphpipe.runtime.checkpoint import load

        extra, self.step_count = load(self._checkpoint_parts(), path, optimizer=optimizer)
        return extra

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shard: its stage's parameters and buffers under the original names (the
        entries of the original model's ``state_dict`` that this stage holds)."""
        return self._facts.state_dict(self.module)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict gathered from every rank (on every rank), in the
        original model's key order."""
        local = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        merged: dict[str, torch.Tensor] = {}
        for shard in self._link.gather(local, "gathering the state dict"):
            merged.update(shard or {})
        return {k: merged[k] for k in self._facts.state_keys if k in merged}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Collective: loads this rank's entries from a shard or a full state dict (original
        names). Every rank checks every entry it would take (present, a tensor, the same shape,
        a dtype ``torch.can_cast`` allows) before copying any, and the ranks agree: if any rank's
        check fails, every rank raises ``InputError`` naming that rank and entry, and no rank has
        changed anything."""
        own = self.state_dict()
        self._link.agree("Pipeline.load_state_dict", load_refusal(own, state, strict, self.rank))
        self.module.load_state_dict({k: state[k] for k in own if k in state}, strict=False)


def wrap(model: nn.Module, example_inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
         options: WrapOptions | None = None, **keywords: Any) -> Pipeline:
    """Wraps ``model`` for graph pipeline training on the ranks of a process group (default:
    the default process group). Every rank calls it with the same arguments.

    Args:
        model, example_inputs: the model and a batch it accepts: a tensor, a tuple of positional
            inputs, or a dict of keyword inputs (``step`` takes batches in the same form).
            Captured with torch.fx, or torch.export where fx cannot follow the model
            (``capture=`` forces one, see :func:`graphpipe.trace`).
        loss_fn: ``loss_fn(output, targets)`` -> scalar; mean-reduced losses give full-batch
            gradients (each micro-batch's loss is scaled by 1/micro_batches).
        options: a :class:`WrapOptions` (graphpipe.runtime.options), whose fields are documented
            there: ``group``, ``partitioner``, ``schedule``, ``micro_batches``, ``plan``,
            ``timeout``, ``devices``, ``device``, ``leaf_modules``, ``bucket_bytes``, ``sync``,
            ``skip_nonfinite``, ``check_replicas_every``, ``capture``.
        keywords: the same fields by name (replacing those of ``options``), and every other
            keyword of :func:`graphpipe.plan` (``memory_limit``, ``micro_batch_size``,
            ``optimizer``, ``manual``, ``device_kind``, ``seed``), passed to it unchanged.
    """
    return Pipeline(model, example_inputs, loss_fn, options, **keywords)
