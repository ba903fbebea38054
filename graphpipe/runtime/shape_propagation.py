"""Shape propagation: the shapes and dtypes of the tensors that cross each stage edge at one
micro-batch size, under the precision the step runs in.

The executor allocates every receive buffer from these declarations (runtime/executor.h), so
they must be exactly what the sending stage produces. Under ``torch.autocast`` that is not what
the model's parameters say: a linear layer's output is bfloat16 under bf16 autocast, a layer norm's
stays float32. So the traced model runs once per (micro-batch size, autocast state) on fake
tensors (``FakeTensorMode``: real dtypes, real devices, no memory, no compute) inside whatever
autocast the caller is in; without autocast, on the meta copy alone (the dtypes are the model's
own there, and a process's first FakeTensorMode costs seconds). Fake rather than meta tensors because autocast dispatches by device:
it casts on CPU and CUDA tensors, and does nothing on meta ones, which would declare float32
where bfloat16 arrives.

It runs on a copy of the traced module whose state is on the meta device (so the hooks users
register on the stage modules afterwards do not run, and no data is copied); its parameters and
buffers are swapped for fake ones on the stage's device for the run
(``torch.func.functional_call``), so nothing is allocated and no buffer is written.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree

from graphpipe.errors import InputError
from graphpipe.runtime.stages import EdgeLayout, StageCut, edge_layouts

__all__ = ["AutocastState", "ShapePropagation", "autocast_state"]

#: The autocast settings in force in this thread: (device type, dtype) per enabled device type.
AutocastState = tuple[tuple[str, torch.dtype], ...]


def autocast_state() -> AutocastState:
    """The autocast settings in force in the calling thread (empty: none), the part of the
    precision that changes which dtypes cross the stage edges."""
    return tuple((kind, torch.get_autocast_dtype(kind)) for kind in ("cpu", "cuda")
                 if torch.is_autocast_enabled(kind))


class _Runner(torch.nn.Module):
    """Runs a traced module through an fx interpreter that keeps the values of ``needed`` nodes
    (functional_call swaps the state of this module's submodule ``traced``)."""

    def __init__(self, traced: fx.GraphModule) -> None:
        super().__init__()
        self.traced = traced

    def forward(self, needed: set[str], values: dict[str, Any], *inputs: Any) -> Any:
        class _Keep(fx.Interpreter):
            def run_node(self, n: fx.Node) -> Any:
                value = super().run_node(n)
                if n.name in needed:
                    values[n.name] = value
                return value

        return _Keep(self.traced).run(*inputs)


class ShapePropagation:
    """Runs one traced module on fake tensors to find the layout of every stage edge."""

    def __init__(self, traced: fx.GraphModule, device: torch.device) -> None:
        self._runner = _Runner(_meta_copy(traced))
        self._device = device
        # Made at the first propagation under autocast: a process's first FakeTensorMode costs
        # seconds of imports, which every rank of every pipeline without autocast would pay.
        self._mode: FakeTensorMode | None = None
        self._state: dict[str, torch.Tensor] = {}

    def _fake_state(self) -> tuple[FakeTensorMode, dict[str, torch.Tensor]]:
        if self._mode is None:
            self._mode = FakeTensorMode()
            with self._mode:
                # Fake state on the stage's device (the device autocast dispatches by), made
                # once. One entry per tensor: functional_call ties the other names of a tied
                # parameter (GPT-2's embedding and LM head) to it, as they are tied in the model.
                self._state = {
                    name: self._fake(t)
                    for name, t in [*self._runner.named_parameters(), *self._runner.named_buffers()]
                }
        return self._mode, self._state

    def _fake(self, t: torch.Tensor) -> torch.Tensor:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=self._device)
        return torch.nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else fake

    def layouts(self, cut: StageCut, num_edges: int, placeholder_values: dict[str, Any]) -> tuple[list[EdgeLayout], Any]:
        """The layout of each of the plan's ``num_edges`` stage edges for one micro-batch whose
        model inputs are ``placeholder_values``, under the caller's autocast; and the model
        output (fake) for its structure and dtype."""
        needed = {name for st in cut.stages for vals in st.out_values.values() for name in vals}
        values: dict[str, Any] = {}
        # Without autocast the dtypes are the model's own, and the meta copy's run gives them
        # for free; under autocast only fake tensors on the stage's device see its casts.
        fake = bool(autocast_state())
        mode, state = self._fake_state() if fake else (None, {})
        inputs: list[Any] = []
        with mode if mode is not None else contextlib.nullcontext():
            for n in self._runner.traced.graph.nodes:
                if n.op == "placeholder":
                    value = pytree.tree_map(_fake_input if fake else _meta_input, placeholder_values[n.name])
                    if str(n.target).startswith("*"):
                        inputs.extend(value)
                    else:
                        inputs.append(value)
        try:
            with mode if mode is not None else contextlib.nullcontext(), torch.no_grad():
                if fake:
                    output = torch.func.functional_call(self._runner, state, (needed, values, *inputs))
                else:
                    output = self._runner(needed, values, *inputs)
        except Exception as exc:
            raise InputError(
                f"shape propagation of the model on fake tensors failed: {exc}. graphpipe needs "
                "the shapes of the tensors that cross stages; a model with data-dependent shapes is "
                "not supported by the runtime"
            ) from exc
        return edge_layouts(cut, num_edges, values), output


def _meta_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` whose parameters and buffers are on the meta device, made without copying
    their data. A copy, because the run must not call the hooks users register on the stage
    modules after wrap (the stage modules hold the traced module's submodules)."""
    memo: dict[int, Any] = {}
    for t in [*gm.parameters(), *gm.buffers()]:
        meta = t.detach().to("meta")
        memo[id(t)] = torch.nn.Parameter(meta, requires_grad=t.requires_grad) if isinstance(
            t, torch.nn.Parameter) else meta
    return copy.deepcopy(gm, memo)


def _meta_input(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def _fake_input(value: Any) -> Any:
    """A model input's fake twin (inside the mode); other values as they are."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
