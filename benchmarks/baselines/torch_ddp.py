"""Baseline: plain data parallelism with ``torch.nn.parallel.DistributedDataParallel``.

Every rank holds the whole model and trains on its share of each global batch (contiguous
rows, sizes differing by at most one, as ``torch.tensor_split`` cuts them); DDP all-reduces
(averages) the gradients in buckets while the backward runs. Each rank's loss is its shard's
mean loss weighted by ``world * shard / batch``, so the averaged gradient is exactly the
gradient of the global batch's mean loss: the parameters follow single-process training on the
same batches (``tests/python/test_baseline_ddp.py`` checks this in float64), and a pipeline
compared with this baseline trains the same thing.

``make_stepper`` returns one rank's training step (DDP forward and backward, SGD step, the
global mean loss by an all-reduce of one number, so every rank returns it, as graphpipe's
runtime does). ``emulated_model`` is the emulated counterpart used by ``compare.py --emulate``:
the model's compute replaced by waits, gradients by zeros, DDP's all-reduces left real.

    python benchmarks/baselines/torch_ddp.py mmt --world 2 --steps 3    # self-check vs one process
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from graphpipe._ext import _C

__all__ = ["DDPEmulation", "EmulatedDDPModel", "emulation_segments", "make_stepper", "shard", "shard_inputs",
           "train_rank"]


def shard(batch: int, rank: int, world: int) -> tuple[int, int]:
    """(start, length) of ``rank``'s rows of a ``batch``-row global batch: contiguous, the first
    ``batch % world`` ranks one row more (``torch.tensor_split``'s cut). The rule is the C++
    one the pipeline's replicas use (``_C.shard_rows``, schedule/shards.h), so DDP's ranks and a
    replicated stage's replicas take the same rows."""
    if batch < world:
        raise ValueError(f"data parallelism over {world} ranks needs a batch of at least {world} rows, got {batch}")
    begin, end = _C.shard_rows(batch, world, rank)
    return begin, end - begin


def shard_inputs(values: Sequence[torch.Tensor], rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """``rank``'s rows of every batched tensor in ``values`` (0-d tensors pass unchanged)."""
    batch = next(v.shape[0] for v in values if v.dim() > 0)
    start, length = shard(batch, rank, world)
    return tuple(v.narrow(0, start, length) if v.dim() > 0 else v for v in values)


# ---- emulation -----------------------------------------------------------------------------

@dataclass
class DDPEmulation:
    """What an emulated DDP rank waits for, per parameter segment in forward order: the
    parameter names and the segment's forward and backward seconds (at the rank's shard), plus
    the optimizer step of the whole model."""

    segments: list[tuple[list[str], float, float]]
    optimizer_seconds: float

    @property
    def forward_seconds(self) -> float:
        return sum(f for _, f, _ in self.segments)

    @property
    def backward_seconds(self) -> float:
        return sum(b for _, _, b in self.segments)


def emulation_segments(graph: Any, shard_batch: int, forward_seconds: float, backward_seconds: float,
                       optimizer_seconds: float) -> DDPEmulation:
    """Splits a whole-model forward/backward time (the cost model's, for one device at
    ``shard_batch`` rows) over the model's parameter-owning operators.

    The operators of the profiled ``graph`` (``graphpipe.OpGraph``) are walked in topological
    order; a segment closes at each operator that owns parameters and holds it and the
    parameter-free operators before it (the tail goes to the last segment). Each segment's share
    of the totals is its operators' profiled share at the profiled batch size nearest below
    ``shard_batch``. The emulated backward then releases the segments' (zero) gradients in
    reverse order with these waits in between, so DDP's bucketed all-reduces overlap the rest
    of the backward as they do in real training."""
    segments: list[tuple[list[str], float, float]] = []
    names: list[str] = []
    fwd = bwd = 0.0
    for node_id in graph.topological_order():
        node = graph.node(node_id)
        samples = sorted(node.profile, key=lambda s: s.batch_size)
        if samples:
            at = bisect.bisect_right([s.batch_size for s in samples], shard_batch) - 1
            sample = samples[max(0, at)]
            fwd += sample.forward_seconds
            bwd += sample.backward_seconds
        names.extend(node.params)
        if node.params:
            segments.append((names, fwd, bwd))
            names, fwd, bwd = [], 0.0, 0.0
    if not segments:
        raise ValueError("the model has no parameters: nothing for data parallelism to all-reduce")
    last_names, last_fwd, last_bwd = segments[-1]
    segments[-1] = (last_names + names, last_fwd + fwd, last_bwd + bwd)
    total_f = sum(f for _, f, _ in segments) or 1.0
    total_b = sum(b for _, _, b in segments) or 1.0
    scaled = [(n, forward_seconds * f / total_f, backward_seconds * b / total_b) for n, f, b in segments]
    return DDPEmulation(scaled, optimizer_seconds)


class _Segment(torch.autograd.Function):
    """Forward: waits, passes the running token on. Backward: waits, then zero gradients for the
    segment's parameters (which DDP's hooks then all-reduce)."""

    @staticmethod
    def forward(ctx: Any, forward_seconds: float, backward_seconds: float, token: torch.Tensor,
                *params: torch.Tensor) -> torch.Tensor:
        from graphpipe.emulation import wait

        wait(forward_seconds)
        ctx.backward_seconds = backward_seconds
        ctx.specs = [(p.shape, p.dtype, p.device) for p in params]
        return token.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        from graphpipe.emulation import wait

        wait(ctx.backward_seconds)
        return (None, None, grad, *[torch.zeros(s, dtype=d, device=dev) for s, d, dev in ctx.specs])


class EmulatedDDPModel(nn.Module):
    """The model under emulation: holds the real model (so DDP sees the same parameters, in the
    same buckets) but its forward is a chain of waits, one per parameter segment, returning
    zeros shaped like the real output; its backward gives every parameter a zero gradient."""

    def __init__(self, real: nn.Module, emulation: DDPEmulation, output_shape: torch.Size,
                 output_dtype: torch.dtype) -> None:
        super().__init__()
        self.real = real
        params = dict(real.named_parameters())
        listed = [n for names, _, _ in emulation.segments for n in names]
        unknown = [n for n in listed if n not in params]
        if unknown:
            raise ValueError(f"emulation segments name parameters the model lacks: {unknown[:5]}")
        missing = [n for n in params if n not in set(listed)]
        self._segments = [([params[n] for n in names], f, b) for names, f, b in emulation.segments]
        if missing:  # parameters the graph did not list: released first in the backward
            last, f, b = self._segments[-1]
            self._segments[-1] = (last + [params[n] for n in missing], f, b)
        self._output_shape = tuple(output_shape)
        self._output_dtype = output_dtype

    def forward(self, *inputs: Any) -> torch.Tensor:
        token = torch.zeros((), dtype=self._output_dtype)
        for params, fwd, bwd in self._segments:
            token = _Segment.apply(fwd, bwd, token, *params)
        return torch.zeros(self._output_shape, dtype=self._output_dtype) + token


def emulated_model(model: nn.Module, shard_inputs_: Sequence[torch.Tensor], emulation: DDPEmulation,
                   scale: float = 1.0, kind: type[nn.Module] | None = None) -> nn.Module:
    """``model`` emulated for one data-parallel rank whose shard looks like ``shard_inputs_``
    (the real model runs once on it, without gradients, for the output's shape); waits times
    ``scale``. ``kind``: the emulating class, ``EmulatedDDPModel`` unless given (FSDP2's
    baseline passes its own, whose segments are modules ``fully_shard`` can wrap)."""
    with torch.no_grad():
        out = model(*shard_inputs_)
    scaled = DDPEmulation([(n, scale * f, scale * b) for n, f, b in emulation.segments],
                          scale * emulation.optimizer_seconds)
    return (kind or EmulatedDDPModel)(model, scaled, out.shape, out.dtype)


# ---- training ------------------------------------------------------------------------------

def make_stepper(
    model: nn.Module,
    rank: int,
    world: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    lr: float = 0.01,
    device: torch.device | None = None,
    group: Any = None,
    optimizer_wait: float | None = None,
) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor], float]:
    """This rank's DDP training step: ``step(inputs, target)`` takes the *global* batch, trains
    on this rank's shard (forward, backward with DDP's gradient all-reduce, SGD step) and
    returns the global batch's mean loss (an all-reduce of one number), on every rank.

    ``optimizer_wait``: emulation; instead of a real SGD step (its zero gradients would make it
    a no-op in effect but not in cost) the rank waits this many seconds, the simulated step."""
    device = device or torch.device("cpu")
    model = model.to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                              process_group=group)
    params = [p for p in ddp.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr) if optimizer_wait is None else None

    def step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        batch = target.shape[0]
        _, rows = shard(batch, rank, world)
        mine = tuple(t.to(device) for t in shard_inputs(inputs, rank, world))
        (target_rows,) = shard_inputs((target,), rank, world)
        for p in params:
            p.grad = None
        # DDP averages gradients over ranks: weighting each shard's mean by world * rows / batch
        # makes the average the gradient of the global mean loss, whatever the shard sizes.
        local = loss_fn(ddp(*mine), target_rows.to(device))
        (local * (world * rows / batch)).backward()
        if optimizer is not None:
            optimizer.step()
        else:
            from graphpipe.emulation import wait

            wait(optimizer_wait or 0.0)
        total = (local.detach() * (rows / batch)).reshape(1)
        dist.all_reduce(total, group=group)
        return float(total.item())

    return step


def train_rank(rank: int, world: int, spec: str, steps: int, lr: float, dtype: str = "float64") -> dict:
    """Runs ``steps`` DDP iterations of a ``graphpipe.models`` spec (the seeded model and
    batches of ``graphpipe.testing.seeded_batches``) in ``dtype`` on this rank of an
    initialised process group: {"losses", "parameters"} (parameters as a name -> tensor dict)."""
    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches

    model, _, batches = seeded_batches(spec, steps)
    dt = getattr(torch, dtype)
    model = model.to(dt)
    step = make_stepper(model, rank, world, default_loss(spec), lr=lr)
    losses = [step(_floats(x, dt), _floats((y,), dt)[0]) for x, y in batches]
    return {"losses": losses, "parameters": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _floats(values: Sequence[torch.Tensor], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(v.to(dtype) if v.is_floating_point() else v for v in values)


def main() -> None:
    """Self-check: DDP on N ranks against single-process training, float64 (max parameter error)."""
    import argparse
    import json

    from graphpipe.models import default_loss
    from graphpipe.testing import reference_training, run_ranks, seeded_batches

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model", help="model spec, e.g. mmt:branches=2 or candle_uno:batch=7")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, _, batches = seeded_batches(args.model, args.steps)
    model = model.double()
    reference = reference_training(model, [(_floats(x, torch.float64), _floats((y,), torch.float64)[0])
                                           for x, y in batches], default_loss(args.model), args.lr)
    results = run_ranks(train_rank, args.world, args.model, args.steps, args.lr, timeout=300)
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"rank {failed[0].rank}: {failed[0].error_type}: {failed[0].message}")
    ref = {n: p.detach() for n, p in model.named_parameters()}
    error = max(float((p - ref[n]).abs().max()) for r in results for n, p in r.value["parameters"].items())
    print(json.dumps({"reference": reference, "ddp": results[0].value["losses"], "max_parameter_error": error}))


if __name__ == "__main__":
    main()
