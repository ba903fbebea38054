"""Baseline: PyTorch's own ``torch.distributed.pipelining`` (Schedule1F1B / ScheduleGPipe).

This is the peer a user would pick today. It pipelines a *chain* of stages: stage i receives
only from stage i-1. A multi-branch model is therefore cut along one topological order (the
cut points of graphpipe's ``sequential`` plan), and every tensor that skips over a stage is
forwarded through the stages in between, exactly as docs/design.md §1 describes for chain
pipelines. All model inputs enter at stage 0 and the loss is computed on the last stage.

``chain_stage_modules`` builds the per-stage modules from a traced ``fx.GraphModule`` and a
node -> stage labelling (``torch.fx.passes.split_module`` does the cutting); ``make_stepper``
returns one rank's training step and ``train_rank`` runs training iterations, on one rank of an
initialised Gloo/NCCL process group.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch import nn
from torch.fx.passes.split_module import split_module
from torch.utils import _pytree as pytree


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward returns a contiguous gradient.

    Gloo's point-to-point needs contiguous tensors, and the gradient of a stage input can be a
    strided view (the gradient of one slice of a concatenation); torch.distributed.pipelining
    sends such gradients as they are, so the stage makes them contiguous itself.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def _contiguous_grad(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return _ContiguousGrad.apply(value)
    return value


# torch.distributed.pipelining (2.13) corrupts integer tensors at stage boundaries (pytorch
# issue #183024: its receive path treats every activation as differentiable). Integer tensors
# (DLRM's embedding indices) therefore cross stages as float64, exact below 2**53, and turn
# back into int64 on arrival; the models here use no float64 of their own.
_CARRIER = torch.float64


def _to_carrier(value: torch.Tensor) -> torch.Tensor:
    return value.to(_CARRIER) if not value.is_floating_point() else value


def _from_carrier(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == _CARRIER:
        return value.detach().long()
    return value


class ChainStage(nn.Module):
    """One stage of a chain: runs its slice of the split graph and forwards skip tensors.

    ``forward(*live_in)`` takes the values alive at the stage's entry (in ``live_in`` order) and
    returns the values alive at its exit (``live_out`` order), or the model output for the last
    stage.
    """

    def __init__(
        self,
        body: nn.Module,
        nodes: list[fx.Node],
        live_in: list[str],
        live_out: list[str],
        output: Any,
        varargs: bool = False,
        constants: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._varargs = varargs
        self._constants = constants or {}
        self.body = body
        self._nodes = [(n.name, n.op, n.target, n.args) for n in nodes]
        self._live_in = live_in
        self._live_out = live_out
        self._output = output  # fx argument structure of the model output (last stage only)

    def forward(self, *values: torch.Tensor) -> Any:
        values = tuple(_contiguous_grad(_from_carrier(v)) for v in values)
        if self._varargs:
            # Stage 0 of a model with forward(*inputs): the inputs arrive as one tuple.
            env = {self._live_in[0]: tuple(values)}
        else:
            env = dict(zip(self._live_in, values))

        def load(arg: Any) -> Any:
            return fx.node.map_arg(arg, lambda n: env[n.name])

        for name, op, target, args in self._nodes:
            if op == "get_attr":
                env[name] = self._constants[name]
            elif op == "call_module":
                env[name] = self.body(*load(args))
            elif op == "call_function" and target is operator.getitem:
                env[name] = operator.getitem(*load(args))
            else:  # pragma: no cover - split_module emits only these at the top level
                raise RuntimeError(f"unexpected top-level node {name} ({op})")
        if self._output is not None:
            return load(self._output)
        # Point-to-point sends need contiguous tensors (views such as transposes are not). A
        # tensor forwarded unchanged is cloned: pipelining mishandles an output that is the very
        # tensor object it received (integer index tensors arrived as garbage otherwise).
        received = {id(v) for v in values}
        return tuple(
            _to_carrier(env[n].clone() if id(env[n]) in received else env[n].contiguous())
            for n in self._live_out
        )


def pin_integer_consumers(gm: fx.GraphModule, stage_of: dict[str, int], example_values: Sequence[Any]) -> dict[str, int]:
    """Moves operators that read an integer tensor made on an earlier stage onto that stage.

    torch.distributed.pipelining (2.13) delivers integer tensors (DLRM's embedding indices)
    as garbage across stage boundaries on Gloo, even carried as float64 (pytorch #183024 is the
    upstream report of its non-float handling). A user of that library must keep such tensors
    inside one stage; this does it for the baseline, so only float activations cross. Returns
    the adjusted labelling (still a chain).
    """
    from torch.fx.passes.shape_prop import ShapeProp

    ShapeProp(gm).propagate(*example_values)

    def is_integer(node: fx.Node) -> bool:
        meta = node.meta.get("tensor_meta")
        return meta is not None and hasattr(meta, "dtype") and not meta.dtype.is_floating_point

    labels = dict(stage_of)
    order = [n for n in gm.graph.nodes if n.name in labels]
    for node in order:
        # All model inputs enter the chain at stage 0.
        sources = [0 if a.op == "placeholder" else labels.get(a.name, 0)
                   for a in node.all_input_nodes if is_integer(a)]
        if sources and min(sources) < labels[node.name]:
            labels[node.name] = min(sources)
    for node in order:  # keep the labelling monotone along edges
        earlier = [labels[a.name] for a in node.all_input_nodes if a.name in labels]
        if earlier and max(earlier) > labels[node.name]:
            labels[node.name] = max(earlier)
    return labels


def chain_stage_modules(
    gm: fx.GraphModule, stage_of: dict[str, int], num_stages: int
) -> list[ChainStage]:
    """Cuts ``gm`` into ``num_stages`` chain stages given each operator node's stage.

    ``stage_of`` maps fx node names (the OpGraph node names) to stage indices; the labelling
    must be monotone along the graph's edges (a chain plan is).
    """
    for node in gm.graph.nodes:
        if node.op in ("call_module", "call_function", "call_method"):
            if node.name not in stage_of:
                raise ValueError(f"node {node.name} has no stage")
            for arg in node.all_input_nodes:
                if arg.name in stage_of and stage_of[arg.name] > stage_of[node.name]:
                    raise ValueError(f"labelling is not a chain: {arg.name} -> {node.name} goes backwards")
    # get_attr nodes go with their first user. Elements taken out of a varargs input (the
    # `*inputs` tuple) are taken on stage 0: only tensors, not the tuple, can cross stages.
    labels: dict[str, int] = dict(stage_of)
    varargs = {n.name for n in gm.graph.nodes if n.op == "placeholder" and str(n.target).startswith("*")}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            labels[node.name] = min(labels[u.name] for u in node.users if u.name in labels)
        if node.op == "call_function" and node.target is operator.getitem and node.args[0].name in varargs:
            labels[node.name] = 0
    split = split_module(gm, gm, lambda n: labels[n.name], keep_original_order=True)

    top = list(split.graph.nodes)
    placeholders = [n.name for n in top if n.op == "placeholder"]
    output_node = next(n for n in top if n.op == "output")
    owner: dict[str, int] = {}
    bodies: dict[int, nn.Module] = {}
    for n in top:
        if n.op == "call_module":
            owner[n.name] = int(str(n.target).split("_")[-1])
            bodies[owner[n.name]] = split.get_submodule(str(n.target))
        elif n.op == "call_function" and n.target is operator.getitem:
            owner[n.name] = owner[n.args[0].name]
    # Constants left at the top level by split_module live on the stage of their first user.
    constants: dict[int, dict[str, Any]] = {}
    for n in top:
        if n.op == "get_attr":
            owner[n.name] = min(owner[u.name] for u in n.users)
            value: Any = split
            for atom in str(n.target).split("."):
                value = getattr(value, atom)
            constants.setdefault(owner[n.name], {})[n.name] = value
    stage_nodes: list[list[fx.Node]] = [[] for _ in range(num_stages)]
    for n in top:
        if n.name in owner:
            stage_nodes[owner[n.name]].append(n)
    missing = [i for i in range(num_stages) if i not in bodies]
    if missing:
        raise ValueError(f"stages {missing} have no operators")

    def defined_before(name: str, stage: int) -> bool:
        return name in placeholders or owner.get(name, num_stages) < stage

    def used_from(name: str, stage: int) -> bool:
        node = next(n for n in top if n.name == name)
        return any(
            (u.op == "output") or (u.name in owner and owner[u.name] >= stage) for u in node.users
        )

    live: list[list[str]] = []
    for stage in range(num_stages + 1):
        live.append(
            [n.name for n in top if n.op != "output" and defined_before(n.name, stage) and used_from(n.name, stage)]
        )
    live[0] = placeholders
    stages = []
    for i in range(num_stages):
        last = i == num_stages - 1
        stages.append(
            ChainStage(
                bodies[i], stage_nodes[i], live[i], live[i + 1], output_node.args[0] if last else None,
                varargs=(i == 0 and bool(varargs)), constants=constants.get(i),
            )
        )
    return stages


def stage_examples(stages: list[nn.Module], inputs: tuple[torch.Tensor, ...], micro_batches: int) -> list[tuple[tuple, Any]]:
    """(input_args, output_args) of every chain stage for one micro-batch of ``inputs``: the
    stages run in order in this process (buffers and random generators put back; gradients are
    recorded so that the examples say which outputs require grad, which torch needs to know).

    Why: given no example, torch.distributed.pipelining infers each stage's shapes by running it
    on received metadata materialised with ``torch.empty``; integer index tensors then hold
    whatever the allocator returned, and an embedding lookup on them failed at random
    ("index -9223372036854775808 is out of bounds"). With every stage's input and output
    examples, torch takes the shapes as given (its static mode)."""
    mb = tuple(t.narrow(0, 0, t.shape[0] // micro_batches) if t.dim() > 0 else t for t in inputs)
    saved = [(b, b.detach().clone()) for st in stages for b in st.buffers()]
    examples = []
    try:
        with torch.random.fork_rng(devices=[]):
            args: Any = mb
            for st in stages:
                out = _detached(st(*args))
                examples.append((tuple(args), out))
                args = out if isinstance(out, tuple) else (out,)
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)
    return examples


def _detached(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_detached(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    return value


class GradsAsExample(nn.Module):
    """Wraps a stage so that its outputs require grad exactly where its example outputs do.

    In static mode (``PipelineStage(..., input_args=, output_args=)``) torch takes the examples'
    ``requires_grad`` flags as the truth: the next stage treats an input whose example needs no
    gradient as a constant and sends back ``None`` for it. If this stage then produces that
    output *with* a gradient history, its backward passes the ``None`` to
    ``torch.autograd.backward`` for a non-scalar tensor and fails ("Failed to run stage
    backward"). An emulated stage (:class:`graphpipe.emulation.EmulatedStage`) does just
    that: every float output of its waiting autograd function requires grad, including the
    ones that the real stage passes through without a history (model inputs relayed down the
    chain, integer indices carried as float64). Detaching those outputs makes the stage keep the
    promise of its examples; on a real stage it changes nothing (the examples come from it).
    """

    def __init__(self, inner: nn.Module, example_output: Any) -> None:
        super().__init__()
        self.inner = inner
        leaves, _ = pytree.tree_flatten(example_output)
        self._needs_grad = [bool(leaf.requires_grad) if isinstance(leaf, torch.Tensor) else None for leaf in leaves]

    def forward(self, *args: Any) -> Any:
        leaves, spec = pytree.tree_flatten(self.inner(*args))
        if len(leaves) != len(self._needs_grad):
            raise RuntimeError(f"stage returned {len(leaves)} values, its example {len(self._needs_grad)}")
        leaves = [leaf.detach() if isinstance(leaf, torch.Tensor) and need is False and leaf.requires_grad else leaf
                  for leaf, need in zip(leaves, self._needs_grad)]
        return pytree.tree_unflatten(leaves, spec)


def make_stepper(
    stage_module: nn.Module,
    rank: int,
    world: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    micro_batches: int,
    schedule: str = "1f1b",
    lr: float = 0.01,
    device: torch.device | None = None,
    group: Any = None,
    example: tuple[tuple, Any] | None = None,
) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor], float]:
    """This rank's training step under torch.distributed.pipelining: ``step(inputs, target)``
    runs one iteration (schedule + SGD update) and returns the mean loss, known on the last
    rank only (NaN elsewhere, as in torch's API). Every rank of ``group`` (default: all) calls
    it in step. ``example``: this stage's (input_args, output_args) from :func:`stage_examples`
    (recommended: without it torch infers shapes on uninitialised tensors)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    device = device or torch.device("cpu")
    stage_module = stage_module.to(device)
    if example is not None:
        def _move(value: Any) -> Any:
            if isinstance(value, tuple):
                return tuple(_move(v) for v in value)
            return value.to(device) if isinstance(value, torch.Tensor) else value

        # The stage's outputs need grad where the example's do (an emulated stage's would all).
        stage_module = GradsAsExample(stage_module, example[1])
        stage = PipelineStage(stage_module, rank, world, device, input_args=_move(example[0]),
                              output_args=_move(example[1]), group=group)
    else:
        stage = PipelineStage(stage_module, rank, world, device, group=group)
    kind = {"1f1b": Schedule1F1B, "fill_drain": ScheduleGPipe, "gpipe": ScheduleGPipe}[schedule]
    sched = kind(stage, micro_batches, loss_fn=loss_fn)
    params = [p for p in stage_module.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr) if params else None

    def step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        return schedule_step(sched, optimizer, rank == 0, rank == world - 1, inputs, target, device)

    return step


def schedule_step(schedule: Any, optimizer: torch.optim.Optimizer | None, first: bool, last: bool,
                  inputs: tuple[torch.Tensor, ...], target: torch.Tensor, device: torch.device) -> float:
    """One training iteration of a torch pipelining ``schedule`` on this rank, as torch's API
    splits it: the inputs go to the rank holding the first stage (``first``), the target to the
    one holding the last (``last``), which returns the micro-batches' mean loss (NaN on the other
    ranks); then this rank's optimizer step."""
    if optimizer:
        optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []
    args = tuple(t.to(device) for t in inputs) if first else ()
    kwargs = {"target": target.to(device), "losses": losses} if last else {}
    schedule.step(*args, **kwargs)
    if optimizer:
        optimizer.step()
    return float(torch.stack(losses).detach().mean()) if losses else float("nan")


def train_rank(
    stage_module: nn.Module,
    rank: int,
    world: int,
    batches: Sequence[tuple[tuple[torch.Tensor, ...], torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    micro_batches: int,
    schedule: str = "1f1b",
    lr: float = 0.01,
    device: torch.device | None = None,
    group: Any = None,
    example: tuple[tuple, Any] | None = None,
) -> tuple[list[float], list[float]]:
    """Trains this rank's stage on ``batches``; returns (losses, seconds) per iteration.

    ``group`` holds the pipeline's ranks (default: all); iterations are timed between barriers
    of the default group, so ranks outside the pipeline can idle in step. Losses are known on
    the last rank only (others return NaN), as in torch's API.
    """
    step = make_stepper(stage_module, rank, world, loss_fn, micro_batches, schedule, lr, device, group, example)
    losses, seconds = [], []
    for inputs, target in batches:
        dist.barrier()
        start = time.perf_counter()
        losses.append(step(inputs, target))
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return losses, seconds


def balanced_chain_labels(graph: Any, num_stages: int) -> dict[str, int]:
    """A chain labelling by forward FLOPs along the topological order (for self-checks only;
    benchmarks use the cut points of graphpipe's ``sequential`` plan)."""
    order = graph.topological_order()
    weights = [graph.node(i).forward_flops + 1.0 for i in order]
    total, acc, labels = sum(weights), 0.0, {}
    for node_id, weight in zip(order, weights):
        labels[graph.node(node_id).name] = min(num_stages - 1, int(acc * num_stages / total))
        acc += weight
    return labels


def _check_worker(rank: int, world: int, store_path: str, spec: str, schedule: str,
                  micro_batches: int, steps: int, out_path: str, emulate: float | None = None) -> None:
    import json

    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches
    from graphpipe.trace import trace_module

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        model, inputs, batches = seeded_batches(spec, steps)
        traced = trace_module(model, inputs)
        labels = pin_integer_consumers(traced.module, balanced_chain_labels(traced.graph, world),
                                       traced.placeholder_values)
        stages = chain_stage_modules(traced.module, labels, world)
        example = stage_examples(stages, tuple(inputs), micro_batches)[rank]
        stage: nn.Module = stages[rank]
        if emulate is not None:  # as compare.py --emulate does: waits and zeros instead of compute
            from graphpipe.emulation import EmulatedStage

            stage = EmulatedStage(stage, emulate, 2 * emulate)
        losses, _ = train_rank(stage, rank, world, batches, default_loss(spec), micro_batches, schedule,
                               example=example)
        if rank == world - 1:
            with open(out_path, "w") as f:
                json.dump(losses, f)
    finally:
        dist.destroy_process_group()


def main() -> None:
    """Self-check: N ranks of torch.distributed.pipelining vs single-process training (losses).

    With ``--emulate SECONDS`` every stage is a graphpipe ``EmulatedStage`` (forward waits
    SECONDS, backward twice that, zero tensors out), as in ``compare.py --emulate``: the losses
    are then meaningless, the check is that every step runs."""
    import argparse
    import json
    import os
    import tempfile

    import torch.multiprocessing as mp

    from graphpipe.models import default_loss
    from graphpipe.testing import reference_training, seeded_batches

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model", help="model spec, e.g. dlrm or mmt:branches=2")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b", choices=["1f1b", "fill_drain"])
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--emulate", type=float, default=None, metavar="SECONDS",
                        help="emulated stages: forward waits SECONDS, backward 2x (losses meaningless)")
    args = parser.parse_args()

    model, _, batches = seeded_batches(args.model, args.steps)
    reference = reference_training(model, batches, default_loss(args.model), lr=0.01)
    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "losses.json")
        mp.spawn(_check_worker, nprocs=args.world, join=True,
                 args=(args.world, store, args.model, args.schedule, args.micro_batches, args.steps, out,
                       args.emulate))
        with open(out) as f:
            pipelined = json.load(f)
    print(json.dumps({"reference": reference, "pipelined": pipelined}))


if __name__ == "__main__":
    main()
