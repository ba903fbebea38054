"""graphpipe.wrap / Pipeline: trains a model's plan on torch.distributed ranks, one stage per rank.

Every rank calls ``wrap`` with the same model, example inputs and plan; each keeps only its own
stage module (and so its own parameters). ``step(inputs, targets)`` runs one training iteration:
the batch is cut into the plan's micro-batches, the rank's instruction list from the schedule is
executed in C++ (graphpipe._C.Executor: point-to-point transfers over the process group, the
backward through torch::autograd), and the full-batch loss is returned on every rank. The user's
optimizer over ``pipe.parameters()`` steps afterwards.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError, PlanningError
from graphpipe.runtime import microbatch
from graphpipe.runtime.plan import partition_plan, resolve_plan, stage_devices
from graphpipe.runtime.stages import (
    StageGraph,
    build_stages,
    flatten_values,
    meta_copy,
    propagate_layouts,
    unflatten_values,
)
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
        args = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        # The trace runs the model once: example inputs go where its parameters are (a model on
        # a GPU may be given CPU example inputs, as step() may be given CPU batches).
        home = next((p.device for p in model.parameters()), torch.device("cpu"))
        if home.type != "cpu":
            args = _to_device(tuple(args), home)
        # trace_module leaves the model's buffers (BatchNorm statistics) as they were.
        traced = trace_module(model, tuple(args), leaf_modules=leaf_modules)
        self.graph = traced.graph
        if plan is None:
            plan = self._partition_on_rank0(partitioner, micro_batches, devices)
        self.plan = resolve_plan(plan, traced.graph, self.world_size, partitioner, micro_batches)
        self.num_micro_batches = int(self.plan["num_micro_batches"])
        self.schedule_kind = schedule
        stages: StageGraph = build_stages(traced.module, self.plan)
        self.edges = stages.edges
        self.placeholders = stages.placeholders
        self.output_rank = stages.stages[stages.output_stage].rank
        self._stage = next((st for st in stages.stages if st.rank == self.rank), None)
        self.module: nn.Module = self._stage.module if self._stage is not None else nn.Module()
        for st in stages.stages:  # keep only this rank's stage module (and so its parameters)
            if st is not self._stage:
                st.module = None
        self._stages = stages
        fwd = [float(st.get("forward_seconds", 1.0) or 1.0) for st in self.plan["stages"]]
        bwd = [float(st.get("backward_seconds", 2.0) or 2.0) for st in self.plan["stages"]]
        self.schedule_json = _C.runtime_schedule(
            stage_devices(self.plan),
            self.edges,
            self.num_micro_batches,
            int(self.plan.get("micro_batch_size", 1) or 1),
            schedule,
            fwd,
            bwd,
            int(self.plan.get("num_devices", 0) or 0),
        )
        self.executor = _C.Executor(self.schedule_json, self.rank, self.group, self.timeout)
        self.device = self._pick_device(device)
        backend = str(dist.get_backend(self.group)).lower()
        if self.device.type == "cuda":
            # CUDA path: transfers on their own stream, ordered with events. NCCL moves GPU
            # memory itself; a CPU-only backend (Gloo) gets host-staged copies, which is what lets
            # several ranks share one GPU (NCCL refuses two ranks on one device).
            self.executor.use_cuda(self.device.index if self.device.index is not None else torch.cuda.current_device())
            if "nccl" not in backend:
                self.executor.set_host_staging(True)
        elif self._stage is not None and self.device.type == "cpu" and "nccl" in backend:
            raise InputError(
                "this rank's stage is on the CPU but the process group's backend is NCCL, which moves "
                "GPU tensors only: move the model to this rank's GPU (or pass device=), or use Gloo"
            )
        self._meta = meta_copy(traced.module)
        self._signature = inspect.signature(model.forward)
        self._model_name = type(model).__name__
        self._state_keys = list(model.state_dict().keys())
        self._layouts: dict[int, Any] = {}
        self._specs_for: int | None = None
        self.last_timings: list[Any] = []
        # Every rank must have built the same wiring: compare a digest once, so that a rank with
        # another plan or model fails here with a clear message instead of hanging later.
        digest = repr((self.plan["stages"], self.edges, schedule, self.num_micro_batches))
        digests: list[Any] = [None] * self.world_size
        dist.all_gather_object(digests, hashlib.sha256(digest.encode()).hexdigest(), group=self.group)
        if len(set(digests)) != 1:
            raise InputError(
                "graphpipe.wrap was called with different plans, models or schedules on different "
                "ranks; every rank must pass the same model, example inputs and options"
            )

    # ---- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Releases the C++ executor, and with it this pipeline's handle on the process group
        (and, on GPUs, its transfer stream). Call it, or leave a ``with`` block, before
        ``torch.distributed.destroy_process_group()``: a process group that outlives the
        interpreter's shutdown through a leftover handle can abort the process. Idempotent;
        the pipeline cannot step afterwards, its parameters and state dicts stay readable."""
        self.executor = None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.executor is None

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _executor(self) -> Any:
        if self.executor is None:
            raise InputError("this pipeline was closed (Pipeline.close); wrap the model again to train it")
        return self.executor

    def _pick_device(self, device: Any) -> torch.device:
        if device is not None:
            return torch.device(device)
        for p in self.module.parameters():
            return p.device
        return torch.device("cpu")

    def _partition_on_rank0(self, partitioner: str, micro_batches: int | None, devices: Any) -> dict[str, Any]:
        """Rank 0 partitions and broadcasts the plan, so every rank runs the same one (and a
        planning error reaches every rank instead of leaving the others waiting)."""
        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box[0] = ("ok", partition_plan(self.graph, self.world_size, partitioner, micro_batches, devices))
            except Exception as exc:  # noqa: BLE001 - re-raised on every rank below
                box[0] = ("error", f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=self._global(0), group=self.group)
        status, value = box[0]
        if status != "ok":
            raise PlanningError(f"partitioning on rank 0 failed: {value}")
        return value

    # ---- parameters and modes ------------------------------------------------------------
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """This rank's parameters (its stage's), the ones its optimizer must step."""
        return self.module.parameters(recurse)

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the original model's names."""
        return self.module.named_parameters()

    def train(self, mode: bool = True) -> Pipeline:
        self.module.train(mode)
        return self

    def eval(self) -> Pipeline:
        return self.train(False)

    @property
    def stage(self) -> int:
        """Index of the stage this rank runs (-1 when it holds none)."""
        return self._stage.index if self._stage is not None else -1

    def schedule_table(self) -> str:
        """The schedule as a table (one row per rank)."""
        return self._executor().schedule_table()

    # ---- running -------------------------------------------------------------------------
    def _placeholder_values(self, args: tuple) -> dict[str, Any]:
        try:
            bound = self._signature.bind(*args)
        except TypeError as exc:
            raise InputError(f"inputs do not match {self._model_name}.forward: {exc}") from exc
        bound.apply_defaults()
        values: list[Any] = []
        for name, param in self._signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                values.append(tuple(bound.arguments.get(name, ())))
            elif param.kind is not inspect.Parameter.VAR_KEYWORD:
                values.append(bound.arguments.get(name))
        return dict(zip(self.placeholders, values))

    def _prepare(self, inputs: Any) -> tuple[list[dict[str, Any]], int]:
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        if self.device.type != "cpu":
            args = _to_device(args, self.device)
        chunks = microbatch.split(args, self.num_micro_batches, "inputs")
        values = [self._placeholder_values(c) for c in chunks]
        mbs = microbatch.batch_size(args) // self.num_micro_batches
        if mbs not in self._layouts:
            self._layouts[mbs] = propagate_layouts(self._meta, self._stages, values[0])
        if self._specs_for != mbs:
            self._executor().set_edge_specs([layout.specs for layout in self._layouts[mbs][0]])
            self._specs_for = mbs
        return values, mbs

    def _forward_fn(
        self, values: list[dict[str, Any]], mbs: int, on_output: Callable[[int, Any], torch.Tensor | None]
    ) -> Callable[[int, list[list[torch.Tensor]]], tuple[list[list[torch.Tensor]], Any]]:
        st = self._stage
        layouts = self._layouts[mbs][0]
        # Every stage edge touching the stage, in edge order (the executor's order); an edge that
        # carries only model inputs (which every rank has) transfers no tensor.
        in_edges = [e for e, (_, b) in enumerate(self.edges) if st is not None and b == st.index]
        out_edges = [e for e, (a, _) in enumerate(self.edges) if st is not None and a == st.index]

        def forward(m: int, received: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
            args = [values[m][name] for name in st.placeholders]
            for e, tensors in zip(in_edges, received):
                args.extend(unflatten_values(layouts[e], tensors))
            result = st.module(*args)
            outs, pos = [], 0
            for e in out_edges:
                n = len(st.out_values.get(e, ()))
                outs.append(flatten_values(list(result[pos : pos + n])))
                pos += n
            loss = on_output(m, result[-1]) if st.is_output else None
            return outs, loss

        return forward

    def step(self, inputs: Any, targets: Any, *, optimizer: Any = None, record: bool = False) -> torch.Tensor:
        """One training iteration over a batch; returns the full-batch loss (on every rank).

        Gradients accumulate into this rank's parameters (``.grad``), as if ``loss_fn`` had been
        applied to the whole batch; zero them and step your optimizer as in ordinary training,
        or pass ``optimizer`` (over ``pipe.parameters()``): it is stepped and zeroed as soon as
        this rank's part of the iteration is done, before the loss is broadcast. That is faster:
        the broadcast waits for the rank that computes the loss, so an optimizer stepped after
        ``step`` returns cannot overlap the other ranks' remaining backward work (the simulator
        assumes it does). ``record=True`` keeps per-instruction timestamps (``measured_tasks``).
        """
        values, mbs = self._prepare(inputs)
        if self.device.type != "cpu":
            targets = _to_device(targets, self.device)
        targets_mb = microbatch.split(targets, self.num_micro_batches, "targets")
        if microbatch.batch_size(targets, "targets") != mbs * self.num_micro_batches:
            raise InputError("targets and inputs have different batch sizes")
        M = self.num_micro_batches
        losses: list[torch.Tensor] = []

        def on_output(m: int, output: Any) -> torch.Tensor:
            loss = self.loss_fn(output, targets_mb[m])
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise InputError("loss_fn must return a scalar tensor")
            scaled = loss / M
            losses.append(scaled.detach())
            return scaled

        fn = self._forward_fn(values, mbs, on_output) if self._stage is not None else _no_stage
        self.last_timings = self._executor().run(fn, True, record)
        total = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        total = total.to(torch.float32) if not total.is_floating_point() else total
        buf = total.clone().reshape(1)
        if optimizer is not None:  # local work: before the broadcast, which may wait for peers
            optimizer.step()
            optimizer.zero_grad()
        dist.broadcast(buf, src=self._global(self.output_rank), group=self.group)
        return buf[0]

    def eval_forward(self, inputs: Any) -> Any:
        """Runs the model forward on a batch (no gradients); the merged output on every rank."""
        values, mbs = self._prepare(inputs)
        outputs: dict[int, Any] = {}

        def on_output(m: int, output: Any) -> None:
            outputs[m] = output
            return None

        fn = self._forward_fn(values, mbs, on_output) if self._stage is not None else _no_stage
        with torch.no_grad():
            self._executor().run(fn, False, False)
        box = [microbatch.merge([outputs[m] for m in range(self.num_micro_batches)]) if outputs else None]
        dist.broadcast_object_list(box, src=self._global(self.output_rank), group=self.group)
        return box[0]

    def _global(self, group_rank: int) -> int:
        if self.group is dist.distributed_c10d._get_default_group():
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def measured_tasks(self, gather: bool = True) -> list[dict[str, Any]]:
        """The last ``step(..., record=True)`` as graphpipe.viz task dicts: this rank's, or
        (``gather=True``, a collective) every rank's merged, on every rank."""
        from graphpipe.runtime.measure import tasks_from_timings

        ranks = [devs[0] for devs in stage_devices(self.plan)]
        local = tasks_from_timings(self.last_timings, self.rank, self.edges, ranks)
        if not gather:
            return local
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, local, group=self.group)
        return [t for tasks in everyone for t in (tasks or [])]

    # ---- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shard: its stage's parameters and buffers under the original names."""
        return dict(self.module.state_dict())

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict gathered from every rank (on every rank), in the
        original model's key order."""
        shards: list[Any] = [None] * self.world_size
        local = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        dist.all_gather_object(shards, local, group=self.group)
        merged: dict[str, torch.Tensor] = {}
        for shard in shards:
            merged.update(shard or {})
        return {k: merged[k] for k in self._state_keys if k in merged}

    def load_state_dict(self, state: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Loads this rank's entries from a shard or a full state dict (original names)."""
        own = self.module.state_dict()
        missing = [k for k in own if k not in state]
        if strict and missing:
            raise InputError(
                f"state dict lacks {len(missing)} entries of rank {self.rank}'s stage, e.g. {missing[:3]}; "
                "pass this rank's shard (state_dict()) or the full state dict"
            )
        self.module.load_state_dict({k: state[k] for k in own if k in state}, strict=strict)


def _to_device(value: Any, device: torch.device) -> Any:
    from torch.utils import _pytree as pytree

    return pytree.tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, value)


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
    **kwargs: Any,
) -> Pipeline:
    """Wraps ``model`` for graph pipeline training on the ranks of ``group`` (default: the
    default process group). Every rank calls it with the same arguments.

    Args:
        model, example_inputs: the model and a batch it accepts (traced with torch.fx).
        loss_fn: ``loss_fn(output, targets)`` -> scalar; mean-reduced losses give full-batch
            gradients (each micro-batch's loss is scaled by 1/micro_batches).
        partitioner: "graphpipe", "metis" or "sequential" (rank 0 runs it); ignored with plan=.
        schedule: "1f1b", "fill_drain" or "1f1b_greedy".
        micro_batches: number of micro-batches per step (default: the partitioner's choice).
        plan: a Plan, plan JSON text or file, or dict (graphpipe.runtime.manual_plan).
        timeout: seconds every wait on a peer may take before PipelineTimeout.
        devices: the partitioner's Devices (default: world CPU ranks, documented constants).
        device: where this rank's stage runs (default: where its parameters are).
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
        **kwargs,
    )
