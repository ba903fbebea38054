"""Measures per-operator forward and backward time at several batch sizes and stores it on the graph.

For each batch size the whole traced graph runs ``warmup + repeats`` times, forward and backward,
as in training. The forward times each operator where it stands in that run (the median per
operator is kept): timed alone in a tight loop, an operator runs with its code and data hot in
the caches, and the sum of such timings fell 15-58% short of a real forward on the benchmark
models, most for graphs of many small operators (benchmarks/profile_bench.py). The backward cannot be split by operator
inside one autograd pass, so each operator's backward is timed alone (on detached copies of its
captured inputs, a fresh forward each time, only the backward inside the timer) and the
operators' backward times are then scaled together so that they add up to the measured
backward of the whole graph: the split comes from the operators, the total from the real run.
Inputs for batch size ``b`` are the example inputs' rows ``0..b-1`` (repeated cyclically when
``b`` exceeds the example batch).

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


class _TimedRun(fx.Interpreter):
    """One forward of the graph that times every operator's call where it stands in the run."""

    def __init__(self, gm: fx.GraphModule, sync: Callable[[], None]) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.sync = sync
        self.seconds: dict[str, float] = {}
        # Resolved before timing, as the generated forward() has them at hand.
        self.calls = {n.name: _callable(gm, n) for n in gm.graph.nodes if n.op.startswith("call_")}

    def run_node(self, n: fx.Node) -> Any:
        fn = self.calls.get(n.name)
        if fn is None:  # placeholders, parameters (get_attr), the output: nothing to time
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        self.sync()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.sync()
        self.seconds[n.name] = time.perf_counter() - start
        return result


def _timed_backward(output: Any, sync: Callable[[], None]) -> float | None:
    """Seconds of the backward from ``output``'s tensors that need a gradient (all-ones output
    gradients); None when none does."""
    outs = [t for t in iter_tensors(output) if t.requires_grad]
    if not outs:
        return None
    grads = [torch.ones_like(t) for t in outs]
    sync()
    start = time.perf_counter()
    torch.autograd.backward(outs, grads)
    sync()
    return time.perf_counter() - start


def _whole_graph_runs(gm: fx.GraphModule, values: list[Any], sync: Callable[[], None], warmup: int,
                      repeats: int) -> tuple[dict[str, float], float, dict[str, Any]]:
    """Runs the graph forward and backward ``warmup + repeats`` times, as in training.

    Returns each operator's median forward seconds (timed in place), the median backward
    seconds of the whole graph (0 when no output needs a gradient), and the last run's values
    of every node (the inputs each operator's backward is then timed on)."""
    forward: dict[str, list[float]] = {}
    backward: list[float] = []
    env: dict[str, Any] = {}
    for i in range(warmup + repeats):
        run = _TimedRun(gm, sync)
        whole = _timed_backward(run.run(*values), sync)  # as in training: inputs need no gradient
        env = run.env
        if i < warmup:
            continue
        if whole is not None:
            backward.append(whole)
        for name, seconds in run.seconds.items():
            forward.setdefault(name, []).append(seconds)
    medians = {name: statistics.median(samples) for name, samples in forward.items()}
    return medians, (statistics.median(backward) if backward else 0.0), env


def _scale_to_total(seconds: Sequence[float], total: float) -> list[float]:
    """``seconds`` scaled by one factor so that they add up to ``total``; unchanged when they
    add up to nothing or ``total`` is not positive (nothing to scale, or nothing measured)."""
    current = sum(seconds)
    if current <= 0.0 or total <= 0.0:
        return list(seconds)
    return [s * total / current for s in seconds]


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
    # The runs accumulate into parameter gradients and, in training mode, update buffers such as
    # BatchNorm's running statistics: the user's model must come out as it went in.
    saved_grads = {p: p.grad for p in model.parameters()}
    saved_buffers = [(buf, buf.detach().clone()) for buf in model.buffers()]
    by_name = {n.name: n for n in gm.graph.nodes}
    results: dict[int, list[Any]] = {i: [] for i in range(graph.num_nodes)}
    base_batch = traced.batch_size
    for b in sizes:
        rows = torch.arange(b) % base_batch
        values = _take_rows(traced.placeholder_values, rows, base_batch)
        forward_in_place, whole_backward, env = _whole_graph_runs(gm, values, sync, warmup, repeats)
        timed: list[tuple[int, float, float]] = []  # (node, forward, backward alone)
        for name, node_id in traced.node_ids.items():
            node = by_name[name]
            if node.op == "placeholder":
                timed.append((node_id, 0.0, 0.0))
                continue
            fn = _callable(gm, node)
            args = fx.node.map_arg(node.args, lambda a: env[a])
            kwargs = fx.node.map_arg(node.kwargs, lambda a: env[a])
            args, kwargs = pytree.tree_map_only(torch.Tensor, _leafify, (args, kwargs))

            def forward() -> Any:
                return fn(*args, **kwargs)

            samples = [_timed_backward(forward(), sync) for _ in range(warmup + repeats)]
            kept = [t for t in samples[warmup:] if t is not None]  # none: no output needs a gradient
            bwd = statistics.median(kept) if kept else 0.0
            timed.append((node_id, forward_in_place.get(name, 0.0), bwd))
        backward = _scale_to_total([t[2] for t in timed], whole_backward)
        for (node_id, fwd, _), bwd in zip(timed, backward):
            results[node_id].append(_C.ProfileSample(b, fwd, bwd))
    for p, grad in saved_grads.items():
        p.grad = grad
    with torch.no_grad():
        for buf, value in saved_buffers:
            buf.copy_(value)
    for node_id, samples in results.items():
        graph.set_profile(node_id, samples)
    return graph


def _to(value: Any, dev: torch.device) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(dev), value)
