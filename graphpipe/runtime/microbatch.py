"""Splits a batch (tensors, tuples, lists, dicts) into micro-batches along dim 0, and merges back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from graphpipe.errors import InputError
from graphpipe.trace import iter_tensors

__all__ = ["batch_size", "call_inputs", "copy", "merge", "rows", "split", "to_device"]


def batch_size(value: Any, what: str = "inputs") -> int:
    """The common leading dimension of every tensor in ``value``; InputError if they differ."""
    sizes = {int(t.shape[0]) for t in iter_tensors(value) if t.dim() > 0}
    if not sizes:
        raise InputError(f"{what} contain no batched tensor: graphpipe splits batches along dim 0")
    if len(sizes) > 1:
        raise InputError(
            f"{what} have tensors with different leading (batch) dimensions {sorted(sizes)}; "
            "every tensor must have the batch as its first dimension"
        )
    return sizes.pop()


def split(value: Any, chunks: int, what: str = "inputs") -> list[Any]:
    """``value`` cut into ``chunks`` equal micro-batches along dim 0 (0-d tensors and non-tensors
    are repeated in every micro-batch). A batch that does not divide raises InputError."""
    size = batch_size(value, what)
    if size == 0:
        # 0 % chunks == 0: without this an empty batch ran and returned a NaN loss.
        raise InputError(f"the batch in {what} holds 0 samples; a step needs at least {chunks} (one per micro-batch)")
    if size % chunks != 0:
        raise InputError(
            f"the batch of {size} samples in {what} does not divide into {chunks} micro-batches; "
            f"use a batch size that is a multiple of {chunks} (or change micro_batches)"
        )
    return _cut(value, chunks, size // chunks)


def rows(value: Any, begin: int, end: int) -> Any:
    """Rows ``[begin, end)`` of every batched tensor in ``value`` (views; a replica's share of a
    micro-batch). 0-d tensors and non-tensors are kept whole."""
    return _slice(value, begin, end - begin)


def _cut(value: Any, chunks: int, step: int) -> list[Any]:
    """``value`` as ``chunks`` micro-batches of ``step`` rows: each batched tensor is cut with one
    ``Tensor.split`` (the same views as ``chunks`` narrows, in one call: this runs every step).
    A tensor that requires grad is narrowed: autograd forbids in-place writes to the views of
    a multi-view op, and a model may write into its inputs."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return [value] * chunks
        if value.requires_grad:
            return [value.narrow(0, i * step, step) for i in range(chunks)]
        return list(value.split(step, 0))
    if isinstance(value, (tuple, list)):
        columns = [_cut(v, chunks, step) for v in value]
        kind = tuple if isinstance(value, tuple) else list
        return [kind(c[i] for c in columns) for i in range(chunks)]
    if isinstance(value, Mapping):
        cut = {k: _cut(v, chunks, step) for k, v in value.items()}
        return [{k: c[i] for k, c in cut.items()} for i in range(chunks)]
    return [value] * chunks


def _slice(value: Any, start: int, length: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value.narrow(0, start, length) if value.dim() > 0 else value
    if isinstance(value, tuple):
        return tuple(_slice(v, start, length) for v in value)
    if isinstance(value, list):
        return [_slice(v, start, length) for v in value]
    if isinstance(value, Mapping):
        return {k: _slice(v, start, length) for k, v in value.items()}
    return value


def copy(value: Any) -> Any:
    """``value`` with every tensor replaced by its own copy (a micro-batch that shares no
    storage or version counter with the batch it was cut from)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(copy(v) for v in value)
    if isinstance(value, list):
        return [copy(v) for v in value]
    if isinstance(value, Mapping):
        return {k: copy(v) for k, v in value.items()}
    return value


def merge(values: list[Any]) -> Any:
    """Inverse of :func:`split`: concatenates the micro-batches' tensors along dim 0, in the first
    one's structure: tuples, lists, dicts, named tuples and registered pytrees (a Hugging Face
    ``ModelOutput``) keep their type, as the plain model returns them."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values, 0) if first.dim() > 0 else first
    leaves, spec = pytree.tree_flatten(first)
    if not spec.is_leaf():
        columns = [pytree.tree_leaves(v) for v in values]
        return pytree.tree_unflatten([merge([c[i] for c in columns]) for i in range(len(leaves))], spec)
    if isinstance(first, Mapping):  # a mapping torch's pytree does not know
        return {k: merge([v[k] for v in values]) for k in first}
    return first


def call_inputs(inputs: Any) -> tuple[tuple, dict[str, Any]]:
    """``(args, kwargs)`` of a batch: a dict (any mapping, a tokenizer's ``BatchEncoding``
    too) holds keyword inputs, a tuple or list positional ones, anything else is the one
    positional input (a forward that takes one dict positionally gets ``(d,)``)."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}


def to_device(value: Any, device: torch.device) -> Any:
    """Every tensor of ``value`` moved to ``device`` (non-blocking), the rest as it is."""
    return pytree.tree_map(lambda t: t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t, value)
