"""The stage call: the Python callback the C++ Executor calls for each forward (F) of this
rank's stage. It turns the tensors received on the stage's incoming edges back into values,
runs the stage module (with activation recomputation where the plan asks for it), and flattens
the values for each outgoing edge; the output stage also computes the micro-batch's loss.

The executor passes received tensors in ``Executor.in_edges`` order and expects outputs in
``Executor.out_edges`` order (both the C++ schedule's edge order): the stage's topology comes
from there, not from a Python copy."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.utils.checkpoint

from graphpipe.runtime.measure import SavedActivations
from graphpipe.runtime.stages import EdgeLayout, StageModule, flatten_values, unflatten_values

__all__ = ["StageFn", "no_stage", "stage_call"]

#: ``fn(micro_batch, received tensors per incoming edge) -> (tensors per outgoing edge, loss)``.
StageFn = Callable[[int, list[list[torch.Tensor]]], tuple[list[list[torch.Tensor]], Any]]


def no_stage(m: int, received: list[list[torch.Tensor]]) -> tuple[list, None]:
    """The call of a rank that holds no stage (the executor never runs an F there)."""
    return [], None


def stage_call(
    stage: StageModule,
    executor: Any,
    layouts: list[EdgeLayout],
    recompute: bool,
    saved: SavedActivations | None,
    values: list[dict[str, Any]],
    on_output: Callable[[int, Any], torch.Tensor | None],
) -> StageFn:
    """The executor's F callback for ``stage`` over the micro-batches' input ``values``;
    ``on_output(m, output)`` gets the model output of micro-batch ``m`` on the output stage
    and returns the loss to differentiate (None: no backward)."""
    in_edges = list(executor.in_edges)
    out_edges = list(executor.out_edges)

    def forward(m: int, received: list[list[torch.Tensor]]) -> tuple[list[list[torch.Tensor]], Any]:
        args = [values[m][name] for name in stage.placeholders]
        for e, tensors in zip(in_edges, received):
            if stage.copies_received:
                # A received activation is an autograd leaf, which may not be written in place;
                # its copy may, and the copy's gradient still reaches the leaf.
                tensors = [t.clone() if t.requires_grad else t for t in tensors]
            args.extend(unflatten_values(layouts[e], tensors))
        result = _run(stage, args, recompute, saved)
        outs, pos = [], 0
        for e in out_edges:  # an edge that carries only model inputs transfers no tensor
            n = len(stage.out_values.get(e, ()))
            outs.append(flatten_values(list(result[pos : pos + n])))
            pos += n
        loss = on_output(m, result[-1]) if stage.is_output else None
        return outs, loss

    return forward


def _run(stage: StageModule, args: list[Any], recompute: bool, saved: SavedActivations | None) -> Any:
    # The stage switches grad mode where the model has no_grad blocks: restore the caller's
    # mode even when the stage raises.
    counting = saved.hooks() if saved is not None and torch.is_grad_enabled() else nullcontext()
    with torch.set_grad_enabled(torch.is_grad_enabled()), counting:
        if recompute and torch.is_grad_enabled():
            # Activation recomputation (the planner's choice for a stage that does not fit
            # otherwise): torch's non-reentrant checkpoint keeps only the inputs and runs the
            # stage forward again when the backward (B or I) first needs it, with the random
            # state of the first run.
            return torch.utils.checkpoint.checkpoint(stage.module, *args, use_reentrant=False)
        return stage.module(*args)
