"""graphpipe.wrap / Pipeline: trains a model's plan on torch.distributed ranks, one stage per rank
(or several: a replicated stage runs data parallel on each of its ranks).

Every rank calls ``wrap`` with the same model, example inputs and plan; each keeps only its own
stage module (and so its own parameters). ``step(inputs, targets)`` runs one training iteration:
the batch is cut into the plan's micro-batches, the rank's instruction list from the schedule is
executed in C++ (graphpipe._C.Executor: point-to-point transfers over the process group, the
backward through torch::autograd), and the full-batch loss is returned on every rank. The user's
optimizer over ``pipe.parameters()`` steps afterwards.

Replicated stages (a plan stage with several devices): each replica runs the stage's program on
its rows of every micro-batch (``_C.shard_rows``, schedule/shards.h), reading only those rows of
the inputs and targets. Its loss is scaled by its share of the micro-batch's rows, so that with a
mean-reduced loss every replica's gradients are exact shares of the single-process gradient; the
executor sums them over the stage's replicas (runtime/gradient_buckets.h) before the optimizer
steps, and the full-batch loss is the sum of every replica's part.

One currency: the plan is a C++ ``Plan`` on every rank, loaded and validated from the same JSON
text by the C++ loader, and the schedule is the C++ ``Schedule`` that ``graphpipe.schedule``
(and so ``graphpipe.simulate``) generates for it; the executor runs that object.
"""

from __future__ import annotations

import gc
from contextlib import nullcontext
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError, PlanningError
from graphpipe.export_capture import set_mode
from graphpipe.runtime import microbatch
from graphpipe.runtime.batch_check import BatchCheck
from graphpipe.runtime.failure import FailureBoard, describe, pipeline_store
from graphpipe.runtime.consensus import agree
from graphpipe.runtime.measure import SavedActivations
from graphpipe.runtime.nonfinite import StepGuard
from graphpipe.planning import plan as make_plan
from graphpipe.runtime.plan import check_runnable, load_plan, plan_json, stage_ranks
from graphpipe.runtime.process_group import new_process_group
from graphpipe.runtime.replica_agreement import (
    broadcast_buffers_from_first_replica,
    broadcast_from_first_replica,
    digests,
    first_disagreement,
)
from graphpipe.runtime.replica_sync import ReplicaSync
from graphpipe.runtime.shared_params import SharedParameterSync
from graphpipe.runtime.stages import (
    StageGraph,
    build_stages,
    flatten_values,
    hold_unused_state,
    meta_copy,
    propagate_layouts,
    unflatten_values,
)
from graphpipe.runtime.sync_batchnorm import StageSyncBatchNorm, adopt_sync_batchnorm, bind_sync_batchnorm
from graphpipe.simulation import schedule as generate_schedule
from graphpipe.sync import AllReduce, SyncMethod
from graphpipe.sync import parse as parse_sync
from graphpipe.trace import trace_module

__all__ = ["Pipeline", "wrap"]

#: Default timeout of every wait on a peer, in seconds.
DEFAULT_TIMEOUT = 300.0


class Pipeline:
    """One rank's share of a pipelined model. Build it with :func:`wrap`."""

    def __init__(
        self,
        model: nn.Module,
        example_inputs: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        *,
        group: Any = None,
        partitioner: str = "graphpipe",
        schedule: str = "1f1b",
        micro_batches: int | None = None,
        plan: Any = None,
        timeout: float = DEFAULT_TIMEOUT,
        devices: Any = None,
        device: Any = None,
        leaf_modules: Any = (),
        bucket_bytes: float | None = None,
        sync: SyncMethod | str | None = None,
        skip_nonfinite: bool = True,
        check_replicas_every: int | None = None,
        capture: str = "auto",
        **plan_options: Any,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise InputError(
                "graphpipe.wrap needs an initialised torch.distributed process group: run under "
                "torchrun or call torch.distributed.init_process_group first"
            )
        self.group = group if group is not None else dist.distributed_c10d._get_default_group()
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.loss_fn = loss_fn
        self.timeout = float(timeout)
        self._bucket_bytes = float(bucket_bytes) if bucket_bytes is not None else float(_C.default_bucket_bytes)
        if not self._bucket_bytes > 0:
            raise InputError(f"graphpipe.wrap: bucket_bytes must be positive, got {bucket_bytes!r}")
        self._buckets: Any = None
        self.sync_method = parse_sync(sync)
        self.skip_nonfinite = bool(skip_nonfinite)
        if check_replicas_every is not None and (not isinstance(check_replicas_every, int) or check_replicas_every < 1):
            raise InputError(f"graphpipe.wrap: check_replicas_every must be a positive int or None, got "
                             f"{check_replicas_every!r}")
        self.check_replicas_every = check_replicas_every
        self._guard = StepGuard()
        self._replica_sync: ReplicaSync | None = None
        self._replica_groups: list[Any] = []
        self._my_replica_group: Any = None  # this rank's stage's replicas, when it has several
        self._global_ranks = [self._global(r) for r in range(self.world_size)]
        self._board = FailureBoard(pipeline_store(self._global_ranks), self.rank, self.world_size, self.timeout)
        self._failure: str | None = None
        #: Training steps this pipeline completed (restored by :meth:`load`).
        self.step_count = 0
        self.executor: Any = None
        self._pg: Any = None
        # Everything rank-local is guarded: a rank that fails publishes its cause, and the others,
        # polling the store in the exchanges below, raise naming it instead of waiting.
        traced = self._board.guard(lambda: self._trace(model, example_inputs, leaf_modules, capture))
        if plan is None:
            # The planner plans for the schedule that will run (zb_graph's shorter bubbles).
            # ... and for the sync method its replicated stages will use (the default needs no say).
            options = dict(plan_options, partitioner=partitioner, devices=devices, micro_batches=micro_batches,
                           schedule=schedule)
            if self.sync_method != AllReduce():
                options["sync"] = self.sync_method
            planning = _describe_options(options)
            plan = self._partition_on_rank0(options)
        elif plan_options or devices is not None or partitioner != "graphpipe":
            given = sorted(plan_options) + (["devices"] if devices is not None else []) + (
                ["partitioner"] if partitioner != "graphpipe" else [])
            raise InputError(f"graphpipe.wrap: plan= was given, so the planning options {given} would be ignored; "
                             "pass either a plan or the options to make one")
        else:
            planning = {}
        plan_text = self._board.guard(lambda: plan_json(plan, traced.graph))
        # Agreement first, so that a rank with another model is named as such rather than
        # failing to read a plan made for a graph it does not have.
        self._agree(traced, model, plan_text, schedule, micro_batches, planning)
        # Every rank reads the plan text through the C++ loader, which validates it against
        # this rank's trace: a bad plan raises the loader's own error here, on every rank.
        self.plan = self._board.guard(lambda: self._load_plan(plan_text, traced.graph, micro_batches))
        self._board.guard(lambda: self._build(traced, model, schedule, device))
        # The pipeline's own process group: its failure handling destroys it (closing this
        # rank's connections is what wakes peers blocked on it), never the user's group. Every
        # collective on it has the deadline.
        backend = str(dist.get_backend(self.group)).lower()
        whole_world = self.world_size == dist.get_world_size()
        self._whole_world = whole_world
        self._pg = self._board.guard(
            lambda: new_process_group(self._global_ranks, list(range(self.world_size)), whole_world, backend,
                                      self.timeout, self._board, "the pipeline")
        )
        self._board.guard(lambda: self._connect(backend))

    def _trace(self, model: nn.Module, example_inputs: Any, leaf_modules: Any, capture: str) -> Any:
        args, kwargs = _call_inputs(example_inputs)
        # The trace runs the model once: example inputs go where its parameters are (a model on
        # a GPU may be given CPU example inputs, as step() may be given CPU batches).
        home = next((p.device for p in model.parameters()), torch.device("cpu"))
        if home.type != "cpu":
            args, kwargs = _to_device((args, kwargs), home)
        # SyncBatchNorm runs on CPU and over the stage's replicas (sync_batchnorm.py): one operator.
        if adopt_sync_batchnorm(model):
            leaf_modules = (*leaf_modules, StageSyncBatchNorm)
        # trace_module leaves the model's buffers (BatchNorm statistics) as they were.
        traced = trace_module(model, args, kwargs, leaf_modules=leaf_modules, capture=capture)
        self.graph = traced.graph
        self._example_args = (args, kwargs)
        return traced

    def _load_plan(self, plan_text: str, graph: Any, micro_batches: int | None) -> Any:
        loaded = load_plan(plan_text, graph)
        check_runnable(loaded, self.world_size, micro_batches)
        return loaded

    def _build(self, traced: Any, model: nn.Module, schedule: str, device: Any) -> None:
        self.num_micro_batches = int(self.plan.num_micro_batches)
        self.schedule_kind = schedule
        # The very call graphpipe.simulate makes: the executor runs the schedule it predicts.
        self.schedule = generate_schedule(self.plan, schedule)
        stages: StageGraph = build_stages(traced.module, self.plan, traced.graph)
        hold_unused_state(stages, model)
        self.edges = stages.edges
        self.placeholders = stages.placeholders
        self.output_ranks = list(stages.stages[stages.output_stage].ranks)
        self.output_rank = self.output_ranks[0]
        self._stage = next((st for st in stages.stages if self.rank in st.ranks), None)
        self.module: nn.Module = self._stage.module if self._stage is not None else nn.Module()
        for st in stages.stages:  # keep only this rank's stage module (and so its parameters)
            if st is not self._stage:
                st.module = None
        self._stages = stages
        self.device = self._pick_device(device)
        backend = str(dist.get_backend(self.group)).lower()
        if self.device.type != "cuda" and self._stage is not None and "nccl" in backend:
            raise InputError(
                "this rank's stage is on the CPU but the process group's backend is NCCL, which moves "
                "GPU tensors only: move the model to this rank's GPU (or pass device=), or use Gloo"
            )
        self._meta = meta_copy(traced.module)
        self._input_values = traced.input_values
        self._captured_training = traced.captured_training
        self._eval_problem = traced.eval_problem
        self._static_batch = traced.static_batch
        self._model_name = type(model).__name__
        if not any(True for _ in self.module.parameters()):
            # A stage without parameters (or a rank without a stage): one empty, frozen
            # placeholder, so that torch's optimizers, which refuse an empty list, can be built
            # over pipe.parameters() on every rank (it never gets a gradient, so never changes).
            self.module.register_parameter(_NO_PARAMETERS, nn.Parameter(torch.empty(0), requires_grad=False))
        self._state_keys = list(model.state_dict().keys())
        self._aliases = _state_aliases(model)
        self._input_check = BatchCheck(self._model_name, self._placeholder_values(*self._example_args))
        self._layouts: dict[int, Any] = {}
        self._specs_for: int | None = None
        self.last_timings: list[Any] = []
        self._saved: SavedActivations | None = None

    def _agree(
        self, traced: Any, model: nn.Module, plan_text: str, schedule: str, micro_batches: int | None,
        planning: dict[str, str],
    ) -> None:
        """Every rank must run the same model, plan and options: each shares a description and
        compares it with every other rank's, so a rank that differs fails here, on every rank,
        naming the first difference, instead of desynchronising (or aborting) in a step."""
        mine = {
            "model operators": (traced.graph.num_nodes, traced.graph.fingerprint()),
            "parameters": [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()],
            "example inputs": [(tuple(t.shape), str(t.dtype)) for t in flatten_values(list(traced.placeholder_values))],
            "operator output bytes": [traced.graph.node(i).output_bytes for i in range(traced.graph.num_nodes)],
            # Before the plan: rank 0 alone plans, so another rank's options would otherwise be
            # ignored without a word.
            "planning options": planning,
            "plan": plan_text,
            "schedule": schedule,
            "micro_batches": micro_batches,
            "timeout": self.timeout,
            "sync method": repr(self.sync_method),
            "skip_nonfinite": self.skip_nonfinite,
            "check_replicas_every": self.check_replicas_every,
        }
        self._board.share("agreement", mine)
        everyone = self._board.collect("agreement", what="model description")
        for r, theirs in sorted(everyone.items()):
            for field_name, value in mine.items():
                if theirs.get(field_name) != value:
                    raise InputError(
                        f"graphpipe.wrap: rank {r} differs from rank {self.rank} in its {field_name}: "
                        f"{_first_difference(theirs.get(field_name), value)}. Every rank must pass the "
                        "same model, example inputs and options"
                    )

    def _connect(self, backend: str) -> None:
        def tied_group(member_ranks: list[int]) -> Any:
            return new_process_group([self._global_ranks[r] for r in member_ranks], member_ranks,
                                     self._whole_world, backend, self.timeout, self._board, "tied parameters")

        self._shared = SharedParameterSync(
            self._stages.shared_params, [st.ranks for st in self._stages.stages], self.stage, self.module,
            tied_group, self.timeout, is_lead=self._stage is None or self._stage.ranks[0] == self.rank,
        )
        # Copies of tied parameters start as their first holder's (replica_agreement.py).
        self._shared.broadcast_from_first()
        self.executor = _C.Executor(self.schedule, self.rank, self._pg, self.timeout)
        # What a split backward's W computes the gradients of (zero-bubble schedules).
        self.executor.set_parameters([p for p in self.module.parameters() if p.requires_grad])
        # Replicated stages: one process group per stage's replicas, made by every rank in stage
        # order (torch names groups by the order they are made, process_group.py), for the sync
        # method's communication (replica_sync.py).
        method = self.sync_method
        if method.local_updates and self._stages.shared_params and any(len(st.ranks) > 1 for st in self._stages.stages):
            raise InputError(f"sync={method.describe()}: parameters tied across stages cannot be trained with "
                             "local updates on replicated stages (their replicas would drift apart from the other "
                             "stage's copy); use a gradient method (AllReduce, TopK, PowerSGD)")
        for st in self._stages.stages:
            if len(st.ranks) < 2:
                continue
            sub = new_process_group([self._global_ranks[r] for r in st.ranks], list(st.ranks), self._whole_world,
                                    backend, self.timeout, self._board, f"the replicas of stage {st.index}")
            self._replica_groups.append(sub)
            hierarchy = self._hierarchy_groups(st, backend) if getattr(method, "hierarchical", False) else None
            if st is self._stage:
                # Replicas start equal, as DDP's do: the first replica's parameters and buffers.
                broadcast_from_first_replica(self.module, sub)
                self._my_replica_group = sub
                bind_sync_batchnorm(self.module, sub)
                params = [p for p in self.module.parameters() if p.requires_grad]
                self._replica_sync = ReplicaSync(method, params, sub, self.timeout, self._bucket_bytes, hierarchy)
                if method.local_updates:
                    self.executor.set_local_updates(True)
                else:
                    self._buckets = self._replica_sync.buckets
                    self.executor.set_gradient_buckets(self._buckets)
        if self.device.type == "cuda":
            # CUDA path: transfers on their own stream, ordered with events. NCCL moves GPU
            # memory itself; a CPU-only backend (Gloo) gets host-staged copies, which is what lets
            # several ranks share one GPU (NCCL refuses two ranks on one device).
            self.executor.use_cuda(self.device.index if self.device.index is not None else torch.cuda.current_device())
            if "nccl" not in backend:
                self.executor.set_host_staging(True)

    def _hierarchy_groups(self, st: Any, backend: str) -> tuple[Any, Any] | None:
        """AllReduce(hierarchical=True): the groups of stage ``st``'s replicas on one node, and of
        its replicas with the same index on each node; every rank makes every group, in stage then
        node order (process_group.py). Returns this rank's two groups, None for a stage on one
        node. A node is ``ranks_per_node`` consecutive global ranks (torchrun numbers them so)."""
        import os

        per_node = self.sync_method.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        nodes: dict[int, list[int]] = {}
        for r in st.ranks:
            nodes.setdefault(self._global_ranks[r] // per_node, []).append(r)
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
            g = new_process_group([self._global_ranks[r] for r in members], members, self._whole_world, backend,
                                  self.timeout, self._board,
                                  f"stage {st.index}'s replicas {'inside a node' if level == 0 else 'across nodes'}")
            self._replica_groups.append(g)
            if self.rank in members:
                mine[level] = g
        return (mine[0], mine[1]) if self.rank in st.ranks else None

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Releases the C++ executor and the pipeline's own process group (and, on GPUs, its
        transfer stream). Call it, or leave a ``with`` block, before
        ``torch.distributed.destroy_process_group()``: a process group that outlives the
        interpreter's shutdown through a leftover handle can abort the process. Idempotent;
        the pipeline cannot step afterwards, its parameters and state dicts stay readable."""
        self.executor = None
        self._shared = None
        self._buckets = None
        self._replica_sync = None
        self._my_replica_group = None
        for sub in self._replica_groups:
            if sub is not None:
                try:
                    dist.destroy_process_group(sub)
                except Exception:  # noqa: BLE001 - already gone with the default group
                    pass
        self._replica_groups = []
        if self._pg is not None:
            pg, self._pg = self._pg, None
            try:
                dist.destroy_process_group(pg)
            except Exception:  # noqa: BLE001 - already gone with the default group
                pass
            gc.collect()  # the group closes its connections when its last handle goes

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.executor is None

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _executor(self) -> Any:
        if self._failure is not None:
            raise InputError(
                f"this pipeline stopped after a failure ({self._failure}); its ranks can no longer "
                "be in step: build a new one with graphpipe.wrap"
            )
        if self.executor is None:
            raise InputError("this pipeline was closed (Pipeline.close); wrap the model again to train it")
        return self.executor

    def _live_group(self) -> Any:
        """The pipeline's process group, for collectives outside a step (refuses a pipeline
        that failed or was closed)."""
        self._executor()
        return self._pg

    def _fail(self, exc: BaseException, during: str) -> BaseException:
        """After an error inside a collective part of the pipeline: records the first failure
        in the store, closes this rank's pipeline group (which wakes every peer blocked on this
        rank), and returns what to raise: the error itself on the rank it started on, a
        PeerError naming that rank and its cause elsewhere."""
        if isinstance(exc, RuntimeError) and not isinstance(exc, _C.GraphpipeError):
            exc = _collective_error(exc, self.rank, self.timeout, during)
        cause = self._board.publish(exc)
        self._failure = cause
        self.close()
        if cause.startswith(f"rank {self.rank}: "):
            return exc
        error_type = _C.PipelineTimeout if isinstance(exc, _C.PipelineTimeout) else _C.PeerError
        return error_type(f"rank {self.rank}: the pipeline failed on {cause} (seen here {during}: {describe(exc)})")

    def _pick_device(self, device: Any) -> torch.device:
        if device is not None:
            return torch.device(device)
        for p in self.module.parameters():
            return p.device
        return torch.device("cpu")

    def _partition_on_rank0(self, options: dict[str, Any]) -> str:
        """Rank 0 plans through :func:`graphpipe.plan` (the one front door to the partitioners,
        with every option it takes; ``devices`` defaults to one per rank of the group) and
        shares the plan's JSON text through the store, so every rank runs the same one (and a
        planning error reaches every rank instead of leaving the others waiting). Each rank then
        loads the text through the C++ loader."""
        if self.rank == 0:
            try:
                if options.get("devices") is None:
                    options["devices"] = self.world_size
                made = make_plan(self.graph, **options)
                value = ("ok", made.to_json(self.graph))
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                value = ("error", f"{type(exc).__name__}: {exc}")
            self._board.share("plan", value)
        status, value = self._board.collect("plan", ranks=[0], what="plan")[0]
        if status != "ok":
            raise PlanningError(f"partitioning on rank 0 failed: {value}")
        return value

    # ---- parameters and modes ------------------------------------------------------------
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """This rank's parameters (its stage's), the ones its optimizer must step. A rank whose
        stage has none gets one empty frozen placeholder, so ``torch.optim.SGD(pipe.parameters())``
        works on every rank (torch refuses an empty list) and steps nothing there."""
        return self.module.parameters(recurse)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the original model's names (not the placeholder)."""
        return ((n, p) for n, p in self.module.named_parameters() if n != _NO_PARAMETERS)

    def train(self, mode: bool = True) -> Pipeline:
        """Puts this rank's stage in training (or eval) mode. A torch.export capture switches its
        dropout, attention dropout and batch norm operators (docs/capture.md); InputError where
        the capture cannot run the mode (captured in eval, or branching on self.training)."""
        if self._captured_training is False and mode:
            raise InputError(
                f"{self._model_name} was captured by torch.export in eval mode, which has no training values for "
                "its dropout, batch norm and branches on self.training; call model.train() before graphpipe.wrap"
            )
        if self._captured_training and not mode and self._eval_problem is not None:
            raise InputError(f"{self._eval_problem}; call model.eval() before graphpipe.wrap to run it in eval mode")
        if self._captured_training:  # the exported operators' mode (export_capture.set_mode)
            set_mode(self.module, bool(mode))
        self.module.train(mode)
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    @property
    def stage_ranks(self) -> list[int]:
        """The ranks that run this rank's stage, its first replica first ([] when it holds none)."""
        return [int(r) for r in self._stage.ranks] if self._stage is not None else []

    @property
    def model_keys(self) -> list[str]:
        """The plain model's ``state_dict`` keys, in its order (aliases included)."""
        return list(self._state_keys)

    @property
    def stage(self) -> int:
        """Index of the stage this rank runs (-1 when it holds none)."""
        return self._stage.index if self._stage is not None else -1

    def schedule_table(self) -> str:
        """The schedule as a table (one row per rank)."""
        return self._executor().schedule_table()

    # ---- running -------------------------------------------------------------------------
    def _placeholder_values(self, args: tuple, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._input_values(args, kwargs)

    def _prepare(self, inputs: Any) -> tuple[list[dict[str, Any]], int]:
        """Checks and splits a batch. Runs before anything is posted and raises the same
        InputError on every rank for a bad batch (every rank has the whole batch), so the
        pipeline stays in step and usable."""
        self._executor()  # refuses a closed or failed pipeline
        call = _call_inputs(inputs)
        self._input_check.check_inputs(self._placeholder_values(*call))
        if self.device.type != "cpu":
            call = _to_device(call, self.device)
        chunks = microbatch.split(call, self.num_micro_batches, "inputs")
        if self._stages.copies_inputs:
            # Micro-batches are views of one batch and share its version counter: a model that
            # writes into its inputs would invalidate what autograd saved for the others.
            chunks = [microbatch.copy(c) for c in chunks]
        values = [self._placeholder_values(*c) for c in chunks]
        mbs = microbatch.batch_size(call) // self.num_micro_batches
        if self._static_batch is not None and mbs != self._static_batch:
            raise InputError(
                f"{self._model_name} was captured by torch.export at a fixed batch of {self._static_batch} (its code "
                f"depends on the batch size), but a micro-batch here holds {mbs}: pass batches of "
                f"{self.num_micro_batches} x {self._static_batch} samples, or trace with another example batch"
            )
        if mbs not in self._layouts:
            self._layouts[mbs] = propagate_layouts(self._meta, self._stages, values[0])
        if self._specs_for != mbs:
            self._executor().set_edge_specs([layout.specs for layout in self._layouts[mbs][0]], mbs)
            self._specs_for = mbs
        if self._stage is not None and len(self._stage.ranks) > 1:
            # A replica reads only its rows of the model inputs (schedule/shards.h).
            begin, end = self._executor().my_rows(mbs)
            values = [{k: microbatch.rows(v, begin, end) for k, v in vals.items()} for vals in values]
        return values, mbs

    def _forward_fn(
        self, values: list[dict[str, Any]], mbs: int, on_output: Callable[[int, Any], torch.Tensor | None]
    ) -> Callable[[int, list[list[torch.Tensor]]], tuple[list[list[torch.Tensor]], Any]]:
        st = self._stage
        layouts = self._layouts[mbs][0]
        # Every stage edge touching the stage, in edge order (the executor's order); an edge that
        # carries only model inputs (which every rank has) transfers no tensor.
        in_edges = [e for e, (_, b) in enumerate(self.edges) if st is not None and b == st.index]
        recompute = st is not None and bool(self.plan.stages[st.index].recompute)
        out_edges = [e for e, (a, _) in enumerate(self.edges) if st is not None and a == st.index]

        def forward(m: int, received: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
            args = [values[m][name] for name in st.placeholders]
            for e, tensors in zip(in_edges, received):
                if st.copies_received:
                    # A received activation is an autograd leaf, which may not be written in
                    # place; its copy may, and the copy's gradient still reaches the leaf.
                    tensors = [t.clone() if t.requires_grad else t for t in tensors]
                args.extend(unflatten_values(layouts[e], tensors))
            # The stage switches grad mode where the model has no_grad blocks: restore the
            # caller's mode even when the stage raises.
            saved = self._saved.hooks() if self._saved is not None and torch.is_grad_enabled() else nullcontext()
            with torch.set_grad_enabled(torch.is_grad_enabled()), saved:
                if recompute and torch.is_grad_enabled():
                    # Activation recomputation (the planner's choice for a stage that does not
                    # fit otherwise): torch's non-reentrant checkpoint keeps only the inputs and
                    # runs the stage forward again when the backward (B or I) first needs it,
                    # with the random state of the first run.
                    result = torch.utils.checkpoint.checkpoint(st.module, *args, use_reentrant=False)
                else:
                    result = st.module(*args)
            outs, pos = [], 0
            for e in out_edges:
                n = len(st.out_values.get(e, ()))
                outs.append(flatten_values(list(result[pos : pos + n])))
                pos += n
            loss = on_output(m, result[-1]) if st.is_output else None
            return outs, loss

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
        values, mbs = self._prepare(inputs)
        self._input_check.check_targets(targets)
        if self.device.type != "cpu":
            targets = _to_device(targets, self.device)
        targets_mb = microbatch.split(targets, self.num_micro_batches, "targets")
        if microbatch.batch_size(targets, "targets") != mbs * self.num_micro_batches:
            raise InputError("targets and inputs have different batch sizes")
        M = self.num_micro_batches
        losses: list[torch.Tensor] = []
        # A replica of the loss stage computes the loss of its rows only: scaled by its share of
        # the micro-batch, the replicas' losses (and gradients) add up to the micro-batch's.
        share = 1.0
        if self.rank in self.output_ranks and len(self.output_ranks) > 1:
            begin, end = self._executor().my_rows(mbs)
            targets_mb = [microbatch.rows(t, begin, end) for t in targets_mb]
            share = (end - begin) / mbs

        def on_output(m: int, output: Any) -> torch.Tensor:
            loss = self.loss_fn(output, targets_mb[m])
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise InputError("loss_fn must return a scalar tensor")
            scaled = loss * share / M if share != 1.0 else loss / M
            losses.append(scaled.detach())
            return scaler.scale(scaled) if scaler is not None else scaled

        self._saved = SavedActivations(self.module.parameters()) if record else None
        fn = self._forward_fn(values, mbs, on_output) if self._stage is not None else _no_stage
        replicas = self._replica_sync
        if replicas is not None:
            replicas.before_step(optimizer)
        # Whether the optimizer waits for every rank's verdict on its gradients (nonfinite.py).
        guarded = optimizer is not None and (self.skip_nonfinite or scaler is not None)
        StepGuard.prime(scaler, self.device)
        saved_buffers = StepGuard.save_buffers(self.module) if guarded else []
        during = "in the pipelined forward and backward"
        try:
            self.last_timings = self._executor().run(fn, True, record)
            during = "summing tied parameters' gradients"
            if self._shared.active:
                self._shared.all_reduce()
            if replicas is not None:
                begin, end = self._executor().my_rows(mbs)
                replicas.after_backward((end - begin) / mbs)
            total = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
            # One closing all-reduce (sum) of [this rank's part of the loss, its non-finite flag]:
            # the loss stage's ranks add their parts, every other rank adds 0. Every rank sends
            # float64 (exact for any float loss): a rank without the output does not know the
            # loss's dtype, and a size mismatch aborts gloo.
            flag = StepGuard.local_flag(self.module.parameters(), optimizer, scaler) if guarded else 0.0
            buf = torch.stack([total.detach().to(torch.float64).reshape(()).cpu(),
                               torch.tensor(flag, dtype=torch.float64)]).to(self.device)
            if optimizer is not None and not guarded:  # local work first: the all-reduce waits for peers
                during = "in the optimizer step"
                optimizer.step()
                optimizer.zero_grad()
            during = (f"in the loss sum from rank {self.output_rank}" if len(self.output_ranks) == 1
                      else f"in the loss sum over the loss stage's ranks {self.output_ranks}")
            dist.all_reduce(buf, group=self._pg)
            if guarded:
                during = "in the optimizer step"
                self._guard.finish(bool(buf[1].item() > 0), optimizer, scaler, self.rank, self.module, saved_buffers)
            if replicas is not None:
                during = f"synchronising the replicas of stage {self.stage} ({self.sync_method.describe()})"
                replicas.after_optimizer_step()
                broadcast_buffers_from_first_replica(self.module, self._my_replica_group)
        except BaseException as exc:
            raise self._fail(exc, during) from exc
        self.step_count += 1
        if self.check_replicas_every is not None and self.step_count % self.check_replicas_every == 0:
            self.check_replicas()
        return buf[0].to(self._loss_dtype(mbs))

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped on every rank because some stage's gradients were NaN or
        infinite (see :meth:`step`)."""
        return self._guard.skipped_steps

    def check_replicas(self) -> None:
        """Collective: raises ``InputError`` on every rank when the replicas of some replicated
        stage hold different parameters or buffers (a hash of each one's bytes, compared between
        replicas), naming the stage, the rank and the first differing entry."""
        mine = digests(self.module) if self._stage is not None and len(self._stage.ranks) > 1 else []
        everyone: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(everyone, mine, group=self._live_group())
        except BaseException as exc:
            raise self._fail(exc, "comparing the replicas") from exc
        problem = first_disagreement([st.ranks for st in self._stages.stages], dict(enumerate(everyone)))
        if problem is not None:
            raise InputError(f"Pipeline.check_replicas: {problem}")

    def _loss_dtype(self, mbs: int) -> torch.dtype:
        """The dtype step() returns the loss in: the model output's floating dtype (which every
        rank knows from shape propagation), float32 if it has none."""
        output = self._layouts[mbs][1]
        for t in flatten_values([output]):
            if t.is_floating_point():
                return t.dtype
        return torch.float32

    def eval_forward(self, inputs: Any) -> Any:
        """Runs the model forward on a batch (no gradients); the merged output on every rank."""
        values, mbs = self._prepare(inputs)
        outputs: dict[int, Any] = {}

        def on_output(m: int, output: Any) -> None:
            outputs[m] = output
            return None

        fn = self._forward_fn(values, mbs, on_output) if self._stage is not None else _no_stage
        try:
            with torch.no_grad():
                self._executor().run(fn, False, False)
            mine = [outputs[m] for m in range(self.num_micro_batches)] if outputs else None
            if len(self.output_ranks) == 1:
                box = [microbatch.merge(mine) if mine is not None else None]
                dist.broadcast_object_list(box, src=self._global(self.output_rank), group=self._pg)
                return box[0]
            # A replicated output stage: every replica holds its rows of each micro-batch.
            parts: list[Any] = [None] * self.world_size
            dist.all_gather_object(parts, mine, group=self._pg)
        except BaseException as exc:
            raise self._fail(exc, "in eval_forward") from exc
        return microbatch.merge([parts[r][m] for m in range(self.num_micro_batches) for r in self.output_ranks])

    def _global(self, group_rank: int) -> int:
        if self.group is dist.distributed_c10d._get_default_group():
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    @property
    def peak_saved_activation_bytes(self) -> int:
        """The most bytes autograd held for this rank's backward at any time during the last
        ``step(..., record=True)`` (its stashed activations; parameters not counted)."""
        return self._saved.peak if self._saved is not None else 0

    def measured_tasks(self, gather: bool = True) -> list[dict[str, Any]]:
        """The last ``step(..., record=True)`` as graphpipe.viz task dicts: this rank's, or
        (``gather=True``, a collective) every rank's merged, on every rank."""
        from graphpipe.runtime.measure import tasks_from_timings

        ranks = stage_ranks(self.plan)
        local = tasks_from_timings(self.last_timings, self.rank, self.edges, ranks)
        if not gather:
            return local
        everyone: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(everyone, local, group=self._live_group())
        except BaseException as exc:
            raise self._fail(exc, "gathering measured tasks") from exc
        return [t for tasks in everyone for t in (tasks or [])]

    # ---- replicas' sync -------------------------------------------------------------------
    @property
    def sync_stats(self) -> dict[str, Any]:
        """This rank's replica sync so far: the method, steps, synchronisations and the bytes
        it handed to the replicas' collectives (measured); empty unless the rank holds a
        replicated stage."""
        return self._replica_sync.stats() if self._replica_sync is not None else {}

    def sync_state_dict(self) -> dict[str, Any]:
        """This rank's sync state (local SGD's step and QSR's round, top-k's residuals,
        PowerSGD's error feedback and factors), for a checkpoint: save it with the parameters and
        the optimizer's state, and a resumed run continues exactly as an uninterrupted one."""
        return self._replica_sync.state_dict() if self._replica_sync is not None else {}

    def load_sync_state_dict(self, state: Mapping[str, Any]) -> None:
        """Collective: restores :meth:`sync_state_dict`'s state (of the same rank and sync
        method), on every rank or, if any rank's state does not fit, on none (every rank raises
        ``InputError`` naming it)."""
        if self._replica_sync is None:
            refusal = f"rank {self.rank} holds no replicated stage, but was given sync state" if state else None
        else:
            refusal = self._replica_sync.state_refusal(state)
        self._agree_on("Pipeline.load_sync_state_dict", refusal)
        if self._replica_sync is not None:
            self._replica_sync.load_state_dict(dict(state))

    def _agree_on(self, what: str, refusal: str | None) -> None:
        """consensus.agree over the pipeline's group: an InputError (every rank refuses) keeps
        the pipeline usable; a failure of the exchange itself fails the pipeline."""
        try:
            agree(self._live_group(), refusal, what)
        except InputError:
            raise
        except BaseException as exc:
            raise self._fail(exc, f"agreeing on {what}") from exc

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self, path: str, optimizer: Any = None, extra: Mapping[str, Any] | None = None) -> None:
        """Collective: writes a torch.distributed.checkpoint (DCP) checkpoint to the folder
        ``path`` (graphpipe/runtime/checkpoint.py): each rank its stage's parameters, buffers and
        ``optimizer``'s state under the plain model's names, its sync state, the step count and
        ``extra``."""
        from graphpipe.runtime.checkpoint import save

        save(self, path, optimizer=optimizer, extra=extra)

    def load(self, path: str, optimizer: Any = None) -> dict[str, Any]:
        """Collective: restores a checkpoint written by :meth:`save`, under this plan or
        another one, on every rank or on none; returns the ``extra`` it was saved with."""
        from graphpipe.runtime.checkpoint import load

        return load(self, path, optimizer=optimizer)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shard: its stage's parameters and buffers under the original names (the
        entries of the original model's ``state_dict`` that this stage holds)."""
        wanted = set(self._state_keys)
        own = {k: v for k, v in self.module.state_dict().items() if k in wanted}
        # A tensor the model registers under several names (``self.p1 = self.p0``, a module
        # assigned to two attributes) has one name in the stage module: the others are added.
        for name in list(own):
            for alias in self._aliases.get(name, ()):
                own.setdefault(alias, own[name])
        return {k: own[k] for k in self._state_keys if k in own}

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict gathered from every rank (on every rank), in the
        original model's key order."""
        shards: list[Any] = [None] * self.world_size
        local = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        try:
            dist.all_gather_object(shards, local, group=self._live_group())
        except BaseException as exc:
            raise self._fail(exc, "gathering the state dict") from exc
        merged: dict[str, torch.Tensor] = {}
        for shard in shards:
            merged.update(shard or {})
        return {k: merged[k] for k in self._state_keys if k in merged}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Collective: loads this rank's entries from a shard or a full state dict (original
        names). Every rank checks every entry it would take (present, a tensor, the same shape,
        a dtype ``torch.can_cast`` allows) before copying any, and the ranks agree: if any rank's
        check fails, every rank raises ``InputError`` naming that rank and entry, and no rank has
        changed anything."""
        own = self.state_dict()
        self._agree_on("Pipeline.load_state_dict", _load_refusal(own, state, strict, self.rank))
        self.module.load_state_dict({k: state[k] for k in own if k in state}, strict=False)


def _collective_error(exc: RuntimeError, rank: int, timeout: float, during: str) -> BaseException:
    """A raw torch.distributed error as graphpipe's: PipelineTimeout for a deadline, PeerError
    for a peer that went away."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return _C.PipelineTimeout(f"rank {rank}: timed out after {timeout:g} s {during}: {text}")
    if "connection" in text.lower() or "closed" in text.lower() or "peer" in text.lower():
        return _C.PeerError(f"rank {rank}: a peer left {during}: {text}")
    return exc


def _state_aliases(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """For every state-dict name of a tensor the model registers under several names, the other
    names (parameters and buffers, found by identity as ``named_parameters(remove_duplicate=False)``
    lists them)."""
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    return {n: tuple(m for m in group if m != n) for group in names.values() if len(group) > 1 for n in group}


def _load_refusal(own: Mapping[str, torch.Tensor], state: Mapping[str, Any], strict: bool, rank: int) -> str | None:
    """Why ``state`` cannot be loaded into a stage holding ``own`` (None: it can)."""
    missing = [k for k in own if k not in state]
    if strict and missing:
        return (f"the state dict lacks {len(missing)} entries of rank {rank}'s stage, e.g. {missing[:3]}; pass this "
                "rank's shard (state_dict()) or the full state dict")
    for k, mine in own.items():
        if k not in state:
            continue
        given = state[k]
        if not isinstance(given, torch.Tensor):
            return f"entry {k!r} for rank {rank} is a {type(given).__name__}, not a tensor"
        if given.shape != mine.shape:
            return f"entry {k!r} for rank {rank} has shape {tuple(given.shape)}, the model's has {tuple(mine.shape)}"
        if not torch.can_cast(given.dtype, mine.dtype):
            return f"entry {k!r} for rank {rank} has dtype {given.dtype}, which does not cast to the model's {mine.dtype}"
    return None


def _describe_options(options: Mapping[str, Any]) -> dict[str, str]:
    """The planning options as comparable text (a Devices description by its JSON, not its
    address), for wrap's agreement check."""
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


def _to_device(value: Any, device: torch.device) -> Any:
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, value)


#: The name of a parameter-free stage's placeholder parameter (Pipeline.parameters).
_NO_PARAMETERS = "graphpipe_no_parameters"


def _call_inputs(inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` of a batch: a dict (any mapping, a tokenizer's ``BatchEncoding``
    too) holds keyword inputs, a tuple or list positional ones, anything else is the one
    positional input (a forward that takes one dict positionally gets ``(d,)``)."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}


def _no_stage(m: int, received: list[list[torch.Tensor]]) -> tuple[list, None]:
    return [], None


def wrap(
    model: nn.Module,
    example_inputs: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    group: Any = None,
    partitioner: str = "graphpipe",
    schedule: str = "1f1b",
    micro_batches: int | None = None,
    plan: Any = None,
    timeout: float = DEFAULT_TIMEOUT,
    devices: Any = None,
    device: Any = None,
    bucket_bytes: float | None = None,
    sync: SyncMethod | str | None = None,
    skip_nonfinite: bool = True,
    check_replicas_every: int | None = None,
    **options: Any,
) -> Pipeline:
    """Wraps ``model`` for graph pipeline training on the ranks of ``group`` (default: the
    default process group). Every rank calls it with the same arguments.

    Args:
        model, example_inputs: the model and a batch it accepts: a tensor, a tuple of positional
            inputs, or a dict of keyword inputs (``step`` takes batches in the same form).
            Captured with torch.fx, or torch.export where fx cannot follow the model
            (``capture=`` forces one, see :func:`graphpipe.trace`).
        loss_fn: ``loss_fn(output, targets)`` -> scalar; mean-reduced losses give full-batch
            gradients (each micro-batch's loss is scaled by 1/micro_batches).
        partitioner: a name from ``graphpipe.PARTITIONERS`` (rank 0 plans with
            :func:`graphpipe.plan`).
        schedule: a name from ``graphpipe.SCHEDULES``.
        micro_batches: number of micro-batches per step (default: the partitioner's choice).
        plan: a Plan (graphpipe.plan, graphpipe.runtime.manual_plan), plan JSON text or file, or
            the JSON form as a dict; read and validated by the C++ loader (Plan.from_json) on
            every rank, so a bad plan raises the loader's FormatError or PlanningError.
        timeout: seconds every wait on a peer may take before PipelineTimeout.
        devices: what :func:`graphpipe.plan` takes: a ``Devices`` description or a device count
            described by ``device_kind`` (default: one CPU rank per rank of the group, documented
            constants).
        device: where this rank's stage runs (default: where its parameters are).
        bucket_bytes: size of the buckets in which a replicated stage's gradients are summed
            over its replicas, each starting as soon as the last backward has produced its
            gradients (default ``graphpipe._C.default_bucket_bytes``, 1 MiB).
        sync: how replicated stages synchronise (graphpipe/sync.py): ``"allreduce"`` (default,
            exact), ``graphpipe.sync.AllReduce(hierarchical=True)``, ``LocalSGD(period)``,
            ``QSR(base_period, alpha)``, ``TopK(ratio)`` or ``PowerSGD(rank)``. The planner plans
            for it. Local methods need ``step(..., optimizer=...)``.
        skip_nonfinite: with ``step(..., optimizer=...)``, skip the optimizer step on every rank
            when any stage's gradients hold a NaN or an infinity (default True).
        check_replicas_every: run :meth:`Pipeline.check_replicas` after every N-th step (default
            never). Replicas always start equal: ``wrap`` broadcasts each replicated stage's
            parameters and buffers from its first replica, and tied parameters from their first
            holder.
        options: ``leaf_modules`` (modules traced as one operator), and every other keyword of
            :func:`graphpipe.plan` (``memory_limit``, ``micro_batch_size``, ``optimizer``,
            ``manual``, ``device_kind``, ``seed``), passed to it unchanged. With ``plan=``,
            planning options raise ``InputError`` (they would be ignored).
    """
    return Pipeline(
        model,
        example_inputs,
        loss_fn,
        group=group,
        partitioner=partitioner,
        schedule=schedule,
        micro_batches=micro_batches,
        plan=plan,
        timeout=timeout,
        devices=devices,
        device=device,
        bucket_bytes=bucket_bytes,
        sync=sync,
        skip_nonfinite=skip_nonfinite,
        check_replicas_every=check_replicas_every,
        **options,
    )
