"""The stage call: the Python callback the C++ Executor calls for each forward (F) of this
rank's stages (one, or several that each run on it alone; the executor names the stage). It turns the tensors received on the stage's incoming edges back into values,
runs the stage module (with activation recomputation where the plan asks for it), and flattens
the values for each outgoing edge; the output stage also computes the micro-batch's loss.

The executor passes received tensors in ``Executor.in_edges(stage)`` order and expects outputs in
``Executor.out_edges(stage)`` order (both the C++ schedule's edge order): the stage's topology comes
from there, not from a Python copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

from graphpipe.runtime.measure import SavedActivations
from graphpipe.runtime.stages import EdgeLayout, StageModule, flatten_values, unflatten_values

__all__ = ["StageFn", "stage_call"]

#: ``fn(stage, micro_batch, received tensors per incoming edge) -> (tensors per outgoing edge, loss)``.
StageFn = Callable[[int, int, list[list[torch.Tensor]]], tuple[list[list[torch.Tensor]], Any]]
#: One stage's call: ``fn(micro_batch, received) -> (outputs, loss)``.
OneStageFn = Callable[[int, list[list[torch.Tensor]]], tuple[list[list[torch.Tensor]], Any]]


def stage_call(
    stages: list[StageModule],
    executor: Any,
    layouts: list[EdgeLayout],
    recompute: Callable[[int], bool],
    saved: SavedActivations | None,
    values: list[dict[str, Any]],
    on_output: Callable[[int, Any], torch.Tensor | None],
) -> StageFn:
    """The executor's F callback for this rank's ``stages`` over the micro-batches' input
    ``values``; ``recompute(stage)``: whether the plan recomputes that stage's activations;
    ``on_output(m, output)`` gets the model output of micro-batch ``m`` on the output stage and
    returns the loss to differentiate (None: no backward). On a rank without a stage the
    executor never runs an F."""
    calls = {st.index: _one_stage(st, executor, layouts, recompute(st.index), saved, values, on_output)
             for st in stages}

    def forward(stage: int, m: int, received: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
        return calls[stage](m, received)

    return forward


def _one_stage(
    stage: StageModule,
    executor: Any,
    layouts: list[EdgeLayout],
    recompute: bool,
    saved: SavedActivations | None,
    values: list[dict[str, Any]],
    on_output: Callable[[int, Any], torch.Tensor | None],
) -> OneStageFn:
    """The call of one stage (see :func:`stage_call`)."""
    in_edges = list(executor.in_edges(stage.index))
    out_edges = list(executor.out_edges(stage.index))
    # Per incoming edge, whether every value it carries is one tensor (the usual case): then the
    # received tensors are the values and the pytree unflatten per micro-batch is skipped.
    plain_in = [_plain(layouts[e]) for e in in_edges]
    out_counts = [len(stage.out_values.get(e, ())) for e in out_edges]
    placeholders = list(stage.placeholders)
    copies = stage.copies_received
    is_output = stage.is_output

    def forward(m: int, received: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
        given = values[m]
        args = [given[name] for name in placeholders]
        for e, plain, tensors in zip(in_edges, plain_in, received):
            if copies:
                # A received activation is an autograd leaf, which may not be written in place;
                # its copy may, and the copy's gradient still reaches the leaf.
                tensors = [t.clone() if t.requires_grad else t for t in tensors]
            args.extend(tensors if plain else unflatten_values(layouts[e], tensors))
        result = _run(stage, args, recompute, saved)
        outs, pos = [], 0
        for n in out_counts:  # an edge that carries only model inputs transfers no tensor
            part = result[pos : pos + n]
            outs.append(list(part) if all(isinstance(v, torch.Tensor) for v in part) else flatten_values(list(part)))
            pos += n
        loss = on_output(m, result[-1]) if is_output else None
        return outs, loss

    return forward


def _plain(layout: EdgeLayout) -> bool:
    """Whether each value of the edge is one tensor: every value's tree is a single leaf and
    there are as many tensors on the wire as values (so every leaf is a tensor's slot)."""
    return len(layout.specs) == len(layout.trees) and all(spec.is_leaf() for spec, _ in layout.trees)


def _run(stage: StageModule, args: list[Any], recompute: bool, saved: SavedActivations | None) -> Any:
    # The stage switches grad mode where the model has no_grad blocks: restore the caller's
    # mode even when the stage raises (a plain restore: cheaper than a context manager per call).
    grad = torch.is_grad_enabled()
    try:
        if saved is not None and grad:
            with saved.hooks():
                return _call(stage, args, recompute and grad)
        return _call(stage, args, recompute and grad)
    finally:
        if torch.is_grad_enabled() != grad:
            torch.set_grad_enabled(grad)


def _call(stage: StageModule, args: list[Any], recompute: bool) -> Any:
    if recompute:
        # Activation recomputation (the planner's choice for a stage that does not fit
        # otherwise): torch's non-reentrant checkpoint keeps only the inputs and runs the
        # stage forward again when the backward (B or I) first needs it, with the random
        # state of the first run.
        return torch.utils.checkpoint.checkpoint(stage.module, *args, use_reentrant=False)
    return stage.module(*args)
