"""Baseline: fully sharded data parallelism with FSDP2 (``torch.distributed.fsdp.fully_shard``).

The documented form: ``fully_shard`` on every layer (each child of the model's ``ModuleList`` /
``Sequential`` containers), then on the root. Every rank holds 1/world of each parameter,
gradient and optimizer state; a layer's parameters are all-gathered just before its forward
(and again before its backward) and its gradients reduce-scattered after its backward. Each
rank trains on its share of each global batch with the same loss weighting as the DDP baseline
(``baselines.torch_ddp``), so the parameters follow single-process training
(``tests/python/test_baseline_fsdp2.py`` checks this in float64).

``make_stepper`` returns one rank's training step; ``emulated_model`` is the emulated
counterpart for ``compare.py --emulate``: every layer's compute replaced by the cost model's
waits and its gradients by zeros, FSDP2's all-gathers and reduce-scatters left real.
``memory_bytes`` is the cost model's figure for one rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from baselines.torch_ddp import DDPEmulation, _Segment, shard_inputs
from baselines.torch_ddp import emulated_model as ddp_emulated_model

__all__ = ["EmulatedFSDPModel", "emulated_model", "layer_names", "make_stepper", "memory_bytes", "shard_layers"]


def layer_names(model: nn.Module) -> list[str]:
    """The modules FSDP2 shards one by one: every child of a ``ModuleList`` / ``Sequential``
    that holds parameters, at the outermost such level (MMT: each branch's blocks)."""
    out: list[str] = []

    def visit(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if isinstance(module, (nn.ModuleList, nn.Sequential)) and any(True for _ in child.parameters()):
                if not isinstance(child, (nn.ModuleList, nn.Sequential)):
                    out.append(full)
                    continue
            visit(full + ".", child)

    visit("", model)
    return out


def shard_layers(model: nn.Module, **kwargs: Any) -> nn.Module:
    """FSDP2 as documented: ``fully_shard`` each layer, then the root."""
    from torch.distributed.fsdp import fully_shard

    for name in layer_names(model):
        fully_shard(model.get_submodule(name), **kwargs)
    fully_shard(model, **kwargs)
    return model


def memory_bytes(static_bytes: float, activation_bytes: float, largest_layer_bytes: float, world: int) -> float:
    """One FSDP2 rank's training state in the cost model's terms: the whole model's parameters,
    gradients and optimizer state (``static_bytes``, as the planner counts them for one device)
    divided over ``world``, the whole model's activations at one micro-batch of the rank's shard
    (``activation_bytes``), and the largest layer unsharded (its parameters and gradients,
    during its backward)."""
    return static_bytes / world + activation_bytes + 2 * largest_layer_bytes


class _Layer(nn.Module):
    """An emulated layer: the real layer's parameters (the same tensors), and a forward of the
    cost model's waits, one ``_Segment`` per parameter-owning operator."""

    def __init__(self, params: list[tuple[str, nn.Parameter]], waits: list[tuple[list[str], float, float]]) -> None:
        super().__init__()
        self._keys = {}
        for i, (name, p) in enumerate(params):
            self.register_parameter(f"p{i}", p)
            self._keys[name] = f"p{i}"
        self._waits = waits

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        for names, fwd, bwd in self._waits:
            token = _Segment.apply(fwd, bwd, token, *[getattr(self, self._keys[n]) for n in names])
        return token


class EmulatedFSDPModel(nn.Module):
    """The model under emulation for FSDP2: one emulated layer per real layer (the real
    parameters, so FSDP2 shards, gathers and reduces the same bytes), returning zeros shaped like
    the real output."""

    def __init__(self, real: nn.Module, emulation: DDPEmulation, output_shape: torch.Size,
                 output_dtype: torch.dtype) -> None:
        super().__init__()
        layers = layer_names(real)
        params = dict(real.named_parameters())

        def layer_of(name: str) -> str:
            return next((layer for layer in layers if name.startswith(layer + ".")), "")

        groups: dict[str, list[tuple[list[str], float, float]]] = {}
        for names, fwd, bwd in emulation.segments:  # a segment goes to its first parameter's layer
            groups.setdefault(layer_of(names[0]), []).append((names, fwd, bwd))
        listed = {n for names, _, _ in emulation.segments for n in names}
        missing = [n for n in params if n not in listed]
        if missing:
            raise ValueError(f"emulation segments miss parameters of the model: {missing[:5]}")
        self.layers = nn.ModuleList(
            _Layer([(n, params[n]) for names, _, _ in waits for n in names], waits) for waits in groups.values())
        self._output_shape = tuple(output_shape)
        self._output_dtype = output_dtype

    def forward(self, *inputs: Any) -> torch.Tensor:
        token = torch.zeros((), dtype=self._output_dtype)
        for layer in self.layers:
            token = layer(token)
        return torch.zeros(self._output_shape, dtype=self._output_dtype) + token


def emulated_model(model: nn.Module, shard_inputs_: Any, emulation: DDPEmulation, scale: float = 1.0) -> nn.Module:
    """``model`` emulated for one FSDP2 rank whose shard looks like ``shard_inputs_``."""
    return ddp_emulated_model(model, shard_inputs_, emulation, scale, kind=EmulatedFSDPModel)


def make_stepper(
    model: nn.Module,
    rank: int,
    world: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    lr: float = 0.01,
    device: torch.device | None = None,
    optimizer_wait: float | None = None,
    micro_batches: int = 1,
) -> Callable[[tuple[torch.Tensor, ...], torch.Tensor], float]:
    """This rank's FSDP2 training step: ``step(inputs, target)`` takes the *global* batch, trains
    on this rank's shard (forward and backward with FSDP2's all-gathers and reduce-scatters, SGD
    on the local shards) and returns the global batch's mean loss, on every rank.
    ``micro_batches``: gradient accumulation, the shard in that many pieces (FSDP2's default:
    each piece's backward reduce-scatters its gradients into the sharded ones), which bounds the
    activations a rank holds to one piece's.
    ``optimizer_wait``: emulation, a wait instead of the SGD step. ``model`` is sharded in place
    (``shard_layers``) unless it is an ``EmulatedFSDPModel``, whose layers are sharded instead."""
    device = device or torch.device("cpu")
    model = shard_layers(model.to(device)) if not isinstance(model, EmulatedFSDPModel) else _shard_emulated(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr) if optimizer_wait is None else None

    def step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        batch = target.shape[0]
        mine = tuple(t.to(device) for t in shard_inputs(inputs, rank, world))
        (target_rows,) = shard_inputs((target,), rank, world)
        for p in params:
            p.grad = None
        total: Any = 0.0
        pieces = zip(*(torch.tensor_split(t, micro_batches) for t in (*mine, target_rows.to(device))))
        for *piece, piece_target in pieces:
            rows = piece_target.shape[0]
            # FSDP2 averages the reduce-scattered gradients over ranks, as DDP does: weighting each
            # piece's mean by world * rows / batch makes the sum the global mean loss's gradient.
            local = loss_fn(model(*piece), piece_target)
            (local * (world * rows / batch)).backward()
            total = total + local.detach().reshape(1) * (rows / batch)
        if optimizer is not None:
            optimizer.step()
        else:
            from graphpipe.emulation import wait

            wait(optimizer_wait or 0.0)
        dist.all_reduce(total)
        return float(total.item())

    return step


def _shard_emulated(model: EmulatedFSDPModel) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def train_rank(rank: int, world: int, spec: str, steps: int, lr: float, dtype: str = "float64",
               micro_batches: int = 1) -> dict:
    """``steps`` FSDP2 iterations of a ``graphpipe.models`` spec in ``dtype`` on this rank:
    {"losses", "parameters"} (the full parameters, gathered, as a name -> tensor dict)."""
    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches

    model, _, batches = seeded_batches(spec, steps)
    dt = getattr(torch, dtype)
    model = model.to(dt)
    step = make_stepper(model, rank, world, default_loss(spec), lr=lr, micro_batches=micro_batches)

    def cast(values: Any) -> tuple:
        return tuple(v.to(dt) if v.is_floating_point() else v for v in values)

    losses = [step(cast(x), cast((y,))[0]) for x, y in batches]
    return {"losses": losses,
            "parameters": {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}}
