"""Checks each batch against what the pipeline was built for, before anything is posted.

Every rank receives the whole batch, so every rank can check it alone and reach the same verdict:
a bad batch raises the same ``InputError`` on every rank while no transfer is in flight, and the
pipeline stays in step and usable. Without the check, a batch with another feature size or dtype
failed inside one stage's forward only, and the ranks fell out of step.

Checked: the structure of each input (tensors, tuples, lists, dicts), each tensor's dtype and its
shape beyond the batch dimension, against the example inputs ``wrap`` traced; and the targets'
structure, dtypes and shapes beyond the batch dimension against the first step's (what a loss can
be checked for cheaply; values, such as a class index out of range, are not). Batch sizes and
their divisibility into micro-batches are checked where the batch is split
(``graphpipe.runtime.microbatch``). Cost: one pytree walk over the batch, a few microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from graphpipe.errors import InputError

__all__ = ["BatchCheck"]

_Spec = tuple[str, list[Any]]


def _spec(value: Any) -> _Spec:
    leaves, tree = pytree.tree_flatten(value)
    described = [
        (leaf.dtype, tuple(leaf.shape[1:]) if leaf.dim() > 0 else None, leaf.dim())
        if isinstance(leaf, torch.Tensor) else ("value", type(leaf).__name__)
        for leaf in leaves
    ]
    return str(tree), described


def _shape(spec: tuple) -> str:
    _, rest, ndim = spec
    if ndim == 0:
        return "a 0-d tensor"
    return "shape (batch, " + ", ".join(map(str, rest)) + ")" if rest else "shape (batch,)"


def _compare(what: str, expected: _Spec, got: _Spec, reference: str) -> None:
    if expected[0] != got[0]:
        if len(expected[1]) != len(got[1]):
            raise InputError(
                f"{what} holds {len(got[1])} values (tensors and others), {reference} it held {len(expected[1])}"
            )
        raise InputError(
            f"{what} is nested differently (tuples, lists, dicts) than {reference}: "
            f"{' '.join(got[0].split())} instead of {' '.join(expected[0].split())}"
        )
    for k, (want, have) in enumerate(zip(expected[1], got[1])):
        where = what if len(expected[1]) == 1 else f"{what} (tensor {k})"
        if want == have:
            continue
        if want[0] == "value" or have[0] == "value":
            raise InputError(f"{where} is a {have[-1]} where {reference} it was a {want[-1]}")
        if want[0] != have[0]:
            raise InputError(f"{where} has dtype {have[0]}, {reference} it had {want[0]}")
        raise InputError(f"{where} has {_shape(have)}, {reference} it had {_shape(want)}")


class BatchCheck:
    """The expected form of a pipeline's inputs (from the traced example) and targets (from
    the first step).

    Args:
        model_name: for messages.
        example: the traced example's value of each ``forward`` argument, by placeholder name.
    """

    def __init__(self, model_name: str, example: Mapping[str, Any]) -> None:
        self.model_name = model_name
        self._inputs = {name: _spec(value) for name, value in example.items()}
        self._targets: _Spec | None = None

    def check_inputs(self, values: Mapping[str, Any]) -> None:
        """Raises InputError naming the first input whose structure, dtype or shape beyond the
        batch dimension differs from the traced example's."""
        for name, expected in self._inputs.items():
            _compare(f"{self.model_name} input {name!r}", expected, _spec(values.get(name)), "as traced")

    def check_targets(self, targets: Any) -> None:
        """The first call records the targets' form; later calls raise InputError where it
        differs."""
        got = _spec(targets)
        if self._targets is None:
            self._targets = got
            return
        _compare("targets", self._targets, got, "in the first step")
