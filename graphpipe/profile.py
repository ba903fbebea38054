"""Measures per-operator forward and backward time at several batch sizes and stores it on the graph.

For each batch size the traced graph runs once to capture every operator's inputs; then each
operator runs alone on detached copies of its inputs: forward timed over ``repeats`` runs after
``warmup`` runs, backward timed the same way on a fresh forward each time (only the backward is
inside the timer). The medians go into ``Node.profile``. Inputs for batch size ``b`` are the
example inputs' rows ``0..b-1`` (repeated cyclically when ``b`` exceeds the example batch).

The partitioner reads the resulting curve to choose micro-batch sizes: per-sample cost usually
falls as the batch grows, because every operator call carries a fixed overhead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch.utils import _pytree as pytree

from graphpipe._ext import _C
from graphpipe.errors import GraphError, InputError
from graphpipe.trace import iter_tensors, trace_module

__all__ = ["profile"]


def _take_rows(value: Any, rows: torch.Tensor, batch: int) -> Any:
    """Rows ``rows`` of every tensor whose leading dimension is the batch."""
    return pytree.tree_map_only(
        torch.Tensor,
        lambda t: t.index_select(0, rows.to(t.device)) if t.dim() > 0 and t.shape[0] == batch else t,
        value,
    )


def _leafify(t: torch.Tensor) -> torch.Tensor:
    """A detached copy; floating tensors require grad so the backward reaches them."""
    copy = t.detach()
    return copy.requires_grad_(True) if copy.is_floating_point() else copy


def _callable(gm: fx.GraphModule, node: fx.Node) -> Callable[..., Any]:
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))
    if node.op == "call_method":
        name = str(node.target)
        return lambda self_, *args, **kwargs: getattr(self_, name)(*args, **kwargs)
    return node.target  # type: ignore[return-value]


def _median_seconds(run: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        run()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def profile(
    graph: Any,
    model: nn.Module,
    example_inputs: Any,
    device: str | torch.device | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    *,
    example_kwargs: Mapping[str, Any] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    leaf_modules: Sequence[Any] = (),
) -> Any:
    """Measures every operator of ``graph`` and stores the medians on its nodes.

    Args:
        graph: the ``OpGraph`` returned by :func:`graphpipe.trace` for this model.
        model: the model that was traced (moved to ``device`` for the measurement).
        example_inputs: inputs as given to :func:`graphpipe.trace`.
        device: where to measure ("cpu", "cuda", "cuda:1"); default: the model's device.
        batch_sizes: increasing batch sizes to measure at.
        repeats: timed runs per operator and direction (the median is kept).
        warmup: untimed runs before timing.
        leaf_modules: the same value given to :func:`graphpipe.trace`.

    Returns:
        The same graph, with ``Node.profile`` filled in (one ``ProfileSample`` per batch size).

    Raises:
        GraphError: the graph was not traced from this model (its operators differ).
        InputError: bad batch sizes or device.
    """
    sizes = list(batch_sizes)
    if not sizes or any(int(b) < 1 for b in sizes) or sorted(set(sizes)) != sizes:
        raise InputError(f"batch_sizes must be positive and strictly increasing, got {sizes}")
    if repeats < 1 or warmup < 0:
        raise InputError("repeats must be >= 1 and warmup >= 0")
    first = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
    if dev.type == "meta":
        raise InputError("cannot time operators on the meta device: pass device='cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' requested but torch.cuda.is_available() is False")
    model = model.to(dev)
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    traced = trace_module(model, _to(example_inputs, dev), _to(example_kwargs, dev), leaf_modules=leaf_modules)
    if traced.graph.fingerprint() != graph.fingerprint():
        raise GraphError(
            "profile: the graph does not match the model (its operators or edges differ); "
            "profile the graph that graphpipe.trace returned for this same model"
        )
    gm = traced.module
    # The per-operator backward runs accumulate into parameter gradients: keep the user's.
    saved_grads = {p: p.grad for p in model.parameters()}
    by_name = {n.name: n for n in gm.graph.nodes}
    results: dict[int, list[Any]] = {i: [] for i in range(graph.num_nodes)}
    base_batch = traced.batch_size
    for b in sizes:
        rows = torch.arange(b) % base_batch
        values = _take_rows(traced.placeholder_values, rows, base_batch)
        # Keep every node's output: each operator is then run alone on its captured inputs.
        capture = fx.Interpreter(gm, garbage_collect_values=False)
        with torch.no_grad():
            capture.run(*values)
        env = capture.env
        for name, node_id in traced.node_ids.items():
            node = by_name[name]
            if node.op == "placeholder":
                results[node_id].append(_C.ProfileSample(b, 0.0, 0.0))
                continue
            fn = _callable(gm, node)
            args = fx.node.map_arg(node.args, lambda a: env[a])
            kwargs = fx.node.map_arg(node.kwargs, lambda a: env[a])
            args, kwargs = pytree.tree_map_only(torch.Tensor, _leafify, (args, kwargs))

            def forward() -> Any:
                return fn(*args, **kwargs)

            fwd = _median_seconds(forward, sync, warmup, repeats)
            probe = forward()
            outs = [t for t in iter_tensors(probe) if t.requires_grad]
            bwd = 0.0
            if outs:
                bwd_samples = []
                for i in range(warmup + repeats):
                    outs = [t for t in iter_tensors(forward()) if t.requires_grad]
                    grads = [torch.ones_like(t) for t in outs]
                    sync()
                    start = time.perf_counter()
                    torch.autograd.backward(outs, grads)
                    sync()
                    if i >= warmup:
                        bwd_samples.append(time.perf_counter() - start)
                bwd = statistics.median(bwd_samples)
            results[node_id].append(_C.ProfileSample(b, fwd, bwd))
    for p, grad in saved_grads.items():
        p.grad = grad
    for node_id, samples in results.items():
        graph.set_profile(node_id, samples)
    return graph


def _to(value: Any, dev: torch.device) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(dev), value)
