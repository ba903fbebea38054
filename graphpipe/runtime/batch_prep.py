"""Batch preparation: checks a batch against the example ``wrap`` traced and cuts it into the
values each micro-batch's stage call reads (a replica: only its rows), and tells the executor
the shapes and dtypes that cross each stage edge at this micro-batch size and under the
autocast the step runs in (shape_propagation.py).

Everything here runs before anything is posted, and every rank has the whole batch, so a bad
batch raises the same InputError on every rank and the pipeline stays in step and usable."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from graphpipe.errors import InputError
from graphpipe.runtime import microbatch
from graphpipe.runtime.batch_check import BatchCheck
from graphpipe.runtime.shape_propagation import AutocastState, ShapePropagation, autocast_state
from graphpipe.runtime.stages import EdgeLayout, StageCut, flatten_values

__all__ = ["BatchPrep"]


class BatchPrep:
    """One pipeline's batch preparation (its layouts are cached per micro-batch size)."""

    def __init__(self, traced: Any, example_args: tuple, cut: StageCut, num_edges: int, num_micro_batches: int,
                 device: torch.device, model_name: str) -> None:
        self._input_values = traced.input_values
        self._check = BatchCheck(model_name, traced.input_values(*example_args))
        self._shapes = ShapePropagation(traced.module, device)
        self._static_batch = traced.static_batch
        self._model_name = model_name
        self._cut = cut
        self._num_edges = num_edges
        self.num_micro_batches = num_micro_batches
        self.device = device
        # Per (micro-batch size, autocast state): the edges' layouts and the model output.
        self._layouts: dict[tuple[int, AutocastState], tuple[list[EdgeLayout], Any]] = {}
        self._specs_for: tuple[int, AutocastState] | None = None
        self._loss_dtypes: dict[int, torch.dtype] = {}

    def inputs(self, executor: Any, inputs: Any, replicated: bool) -> tuple[list[dict[str, Any]], int]:
        """Per micro-batch, the value of every model input; and the micro-batch size."""
        # The forward's signature is bound once per step, for the whole batch: each
        # micro-batch's values are the batch's values cut along dim 0 (the same tensors that
        # cutting the call's arguments and binding each cut would give).
        whole = self._input_values(*microbatch.call_inputs(inputs))
        self._check.check_inputs(whole)
        if self.device.type != "cpu":
            whole = microbatch.to_device(whole, self.device)
        values = microbatch.split(whole, self.num_micro_batches, "inputs")
        if self._cut.copies_inputs:
            # Micro-batches are views of one batch and share its version counter: a model that
            # writes into its inputs would invalidate what autograd saved for the others.
            values = [microbatch.copy(c) for c in values]
        mbs = microbatch.batch_size(whole) // self.num_micro_batches
        if self._static_batch is not None and mbs != self._static_batch:
            raise InputError(
                f"{self._model_name} was captured by torch.export at a fixed batch of {self._static_batch} (its code "
                f"depends on the batch size), but a micro-batch here holds {mbs}: pass batches of "
                f"{self.num_micro_batches} x {self._static_batch} samples, or trace with another example batch"
            )
        key = (mbs, autocast_state())
        if key not in self._layouts:
            self._layouts[key] = self._shapes.layouts(self._cut, self._num_edges, values[0])
            if mbs not in self._loss_dtypes:
                self._loss_dtypes[mbs] = self._output_dtype(key, values[0])
        if self._specs_for != key:
            executor.set_edge_specs([layout.specs for layout in self._layouts[key][0]], mbs)
            self._specs_for = key
        if replicated:
            # A replica reads only its rows of the model inputs (schedule/shards.h).
            begin, end = executor.my_rows(mbs)
            values = [{k: microbatch.rows(v, begin, end) for k, v in vals.items()} for vals in values]
        return values, mbs

    def targets(self, executor: Any, targets: Any, mbs: int, replicated_loss: bool) -> tuple[list[Any], float]:
        """Per micro-batch, the targets this rank's loss reads; and its share of the
        micro-batch's rows. A replica of the loss stage computes the loss of its rows only:
        scaled by its share, the replicas' losses (and gradients) add up to the micro-batch's."""
        self._check.check_targets(targets)
        if self.device.type != "cpu":
            targets = microbatch.to_device(targets, self.device)
        targets_mb = microbatch.split(targets, self.num_micro_batches, "targets")
        if microbatch.batch_size(targets, "targets") != mbs * self.num_micro_batches:
            raise InputError("targets and inputs have different batch sizes")
        if not replicated_loss:
            return targets_mb, 1.0
        begin, end = executor.my_rows(mbs)
        return [microbatch.rows(t, begin, end) for t in targets_mb], (end - begin) / mbs

    def layouts(self) -> list[EdgeLayout]:
        """Every stage edge's wire layout for the batch :meth:`inputs` prepared last (its
        micro-batch size, in the autocast it ran in)."""
        assert self._specs_for is not None, "inputs() prepares a batch first"
        return self._layouts[self._specs_for][0]

    def loss_dtype(self, mbs: int) -> torch.dtype:
        """The dtype step() returns the loss in (every rank knows it, only the output stage
        computes the loss): the model output's floating dtype without autocast, float32 if it
        has none. Without autocast because autocast computes losses in float32 (its float32
        list holds the losses) while the outputs it produces are often bfloat16."""
        return self._loss_dtypes[mbs]

    def _output_dtype(self, key: tuple[int, AutocastState], values: dict[str, Any]) -> torch.dtype:
        if key[1]:  # propagated under autocast: propagate once more without it
            with contextlib.ExitStack() as plain:
                for kind, _ in key[1]:
                    plain.enter_context(torch.autocast(kind, enabled=False))
                output = self._shapes.layouts(self._cut, self._num_edges, values)[1]
        else:
            output = self._layouts[key][1]
        floats = [t.dtype for t in flatten_values([output]) if t.is_floating_point()]
        return floats[0] if floats else torch.float32
