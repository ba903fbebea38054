"""Measures per-operator forward and backward time at several batch sizes and stores it on the graph.

For each batch size the whole traced graph runs ``warmup + repeats`` times, forward and backward,
as in training, the sizes taken in turn within each round so that the machine's drift slows every
size alike (the planner weighs the sizes against each other). The forward times each operator
where it stands in that run (the median per operator is kept): timed alone in a tight loop, an
operator runs with its code and data hot in the caches, and the sum of such timings fell 15-58%
short of a real forward on the benchmark models, most for graphs of many small operators
(benchmarks/profile_bench.py). The backward cannot be split by operator inside one autograd pass,
so each operator's backward is timed alone (on detached copies of its captured inputs, a fresh
forward each time, only the backward inside the timer) and the operators' backward times are
then scaled together so that they add up to the measured backward of the whole graph: the split
comes from the operators, the total from the real run. Inputs for batch size ``b`` are the example inputs' rows ``0..b-1`` (repeated cyclically when
``b`` exceeds the example batch).

Each operator's backward is also timed split in two, as the runtime splits a stage's backward
for a zero-bubble schedule (runtime/split_backward.h, run through ``_C.backward_input``): I, the
gradients of its inputs (every floating input, as if received from another stage: the runtime's
received activations need a gradient even where the model's data did not), recording those
arriving where its parameters join; then W, from there to its parameters (0 for an operator
without any). I and W are scaled by the operator's backward factor above: what makes
an operator timed alone faster than in the real run (hot caches) applies to both halves alike.
How a stage's halves follow from its operators' is the C++ core's rule
(partition/backward_halves.h).

The measurement runs in the precision the graph was traced in (``graph.compute_dtype``): under
``torch.autocast`` for bfloat16 or float16, autocast off otherwise, so a graph traced under
autocast gets the times of its reduced-precision operators.

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
from graphpipe.capture import may_write_inputs
from graphpipe.errors import GraphError, InputError
from graphpipe.trace import autocast_for, iter_tensors, trace_module

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


def _operator_args(gm: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any]
                   ) -> tuple[tuple[Any, ...], dict[str, Any], list[torch.Tensor], list[torch.Tensor]]:
    """``node``'s arguments for timing it alone, from the values of a run (``env``).

    Returns the args and kwargs, the operator's inputs that need a gradient (detached leaf copies
    of the floating tensors other operators or the graph inputs give it) and its parameters (its
    module's, and those it reads as attributes, as detached leaf copies) that need one. Other
    attributes (buffers, constants) get no gradient, as in training.
    """
    inputs: list[torch.Tensor] = []
    params: list[torch.Tensor] = []

    def value(a: fx.Node) -> Any:
        v = env[a]
        if a.op != "get_attr":
            leaves = pytree.tree_map_only(torch.Tensor, _leafify, v)
            inputs.extend(t for t in iter_tensors(leaves) if t.requires_grad)
            return leaves
        if isinstance(v, nn.Parameter):
            copy = v.detach().requires_grad_(v.requires_grad)
            if copy.requires_grad:
                params.append(copy)
            return copy
        return pytree.tree_map_only(torch.Tensor, torch.Tensor.detach, v)

    args = fx.node.map_arg(node.args, value)
    kwargs = fx.node.map_arg(node.kwargs, value)
    if node.op == "call_module":
        params.extend(p for p in gm.get_submodule(str(node.target)).parameters() if p.requires_grad)
    return args, kwargs, inputs, params


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


def _backward_roots(output: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """The tensors of ``output`` that need a gradient and all-ones gradients for them; None
    when none does."""
    outs = [t for t in iter_tensors(output) if t.requires_grad]
    if not outs:
        return None
    return outs, [torch.ones_like(t) for t in outs]


def _timed_backward(output: Any, sync: Callable[[], None]) -> float | None:
    """Seconds of the backward from ``output``'s tensors that need a gradient (all-ones output
    gradients); None when none does."""
    roots = _backward_roots(output)
    if roots is None:
        return None
    outs, grads = roots
    sync()
    start = time.perf_counter()
    torch.autograd.backward(outs, grads)
    sync()
    return time.perf_counter() - start


def _timed_halves(output: Any, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                  sync: Callable[[], None]) -> tuple[float, float] | None:
    """Seconds of the runtime's own split backward from ``output`` (runtime/split_backward.h):
    its first pass, the gradients of ``inputs`` keeping the graph, then its second, those of
    ``params`` from the gradients the first recorded. None when no output needs a gradient."""
    roots = _backward_roots(output)
    if roots is None:
        return None
    outs, grads = roots
    sync()
    start = time.perf_counter()
    _, pending = _C.backward_input(outs, grads, list(inputs), list(params))
    sync()
    middle = time.perf_counter()
    if pending.empty:
        return middle - start, 0.0
    pending.run()
    sync()
    return middle - start, time.perf_counter() - middle


def _timed_split(output: Any, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                 sync: Callable[[], None]) -> tuple[float, float] | None:
    """Seconds of the backward from ``output`` split as the runtime splits it: I, the gradients of
    ``inputs`` alone keeping the graph, then W, those of ``params`` alone (0 without any; I is 0
    without inputs). None when no output needs a gradient."""
    halves = _timed_halves(output, inputs, params, sync)
    if halves is None:
        return None
    return (halves[0] if inputs else 0.0), halves[1]


def _timed_unsplit(output: Any, inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor],
                   sync: Callable[[], None]) -> float | None:
    """Seconds of the whole backward from ``output``, through the same C++ entry as
    ``_timed_split`` with nothing split off. Timing it through ``torch.autograd.backward`` instead
    charged B a few microseconds of Python the split's halves do not pay, and scaled by the one
    shared factor that priced I + W below B on small operators. None when no output needs a
    gradient."""
    halves = _timed_halves(output, [], list(inputs) + list(params), sync)
    return None if halves is None else halves[0] + halves[1]


def _operator_backward(gm: fx.GraphModule, node: fx.Node, env: dict[fx.Node, Any], sync: Callable[[], None],
                       warmup: int, repeats: int) -> tuple[float, float, float]:
    """Median seconds of ``node``'s backward timed alone, whole and split into I and W (a fresh
    forward on fresh leaf copies of its inputs each time; 0s when no output needs a gradient)."""
    fn = _callable(gm, node)
    # As the runtime does for a stage that writes in place (runtime/stage_call.py): such an
    # operator (nn.ReLU(inplace=True), which torchvision's ResNets and GoogLeNet use) gets copies
    # of its input leaves; the copies' gradients still reach the leaves.
    copies = may_write_inputs(gm, node)

    def forward() -> tuple[Any, list[torch.Tensor], list[torch.Tensor]]:
        args, kwargs, inputs, params = _operator_args(gm, node, env)
        if copies:
            leaves = {id(t) for t in inputs}
            args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.clone() if id(t) in leaves else t,
                                                (args, kwargs))
        return fn(*args, **kwargs), inputs, params

    whole: list[float] = []
    split: list[tuple[float, float]] = []
    for i in range(warmup + repeats):
        alone = _timed_unsplit(*forward(), sync)
        halves = _timed_split(*forward(), sync)
        if i >= warmup and alone is not None and halves is not None:
            whole.append(alone)
            split.append(halves)
    if not whole:
        return 0.0, 0.0, 0.0
    return (statistics.median(whole), statistics.median(h[0] for h in split),
            statistics.median(h[1] for h in split))


def _whole_graph_runs(gm: fx.GraphModule, values: list[Any], sync: Callable[[], None], warmup: int,
                      repeats: int) -> list[tuple[dict[str, float], float, dict[fx.Node, Any]]]:
    """Runs the graph forward and backward ``warmup + repeats`` times at each batch size (one
    entry of ``values`` per size), as in training, the sizes taken in turn within each round.

    Why in turn: the planner reads the sizes against each other (is one micro-batch of 16 rows
    faster than two of 8?), and a machine drifts by more than that from one minute to the next.
    Taken in turn, a drift slows every size alike: on the 2-core machine the ratio between
    adjacent sizes varied 1.4x (MMT) to 3.1x (the Transformer) less from one profile to the next
    than with each size's runs back to back (benchmarks/profile_repeatability.py).

    Returns, per size, each operator's median forward seconds (timed in place), the median
    backward seconds of the whole graph (0 when no output needs a gradient), and the last run's
    values of every node (the inputs each operator's backward is then timed on; every size's are
    held until then, at most about twice the largest size's with sizes that double)."""
    forward: list[dict[str, list[float]]] = [{} for _ in values]
    backward: list[list[float]] = [[] for _ in values]
    envs: list[dict[fx.Node, Any]] = [{} for _ in values]
    for i in range(warmup + repeats):
        for size, inputs in enumerate(values):
            run = _TimedRun(gm, sync)
            whole = _timed_backward(run.run(*inputs), sync)  # as in training: inputs need no gradient
            envs[size] = run.env
            if i < warmup:
                continue
            if whole is not None:
                backward[size].append(whole)
            for name, seconds in run.seconds.items():
                forward[size].setdefault(name, []).append(seconds)
    return [({name: statistics.median(samples) for name, samples in forward[size].items()},
             statistics.median(backward[size]) if backward[size] else 0.0, envs[size]) for size in range(len(values))]


def _scale_factor(seconds: Sequence[float], total: float) -> float:
    """The one factor that makes ``seconds`` add up to ``total``; 1 when they add up to nothing
    or ``total`` is not positive (nothing to scale, or nothing measured)."""
    current = sum(seconds)
    if current <= 0.0 or total <= 0.0:
        return 1.0
    return total / current


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
    group: Any = None,
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
        group: a ``torch.distributed`` process group whose ranks all call ``profile`` with the
            same graph, batch sizes, repeats and warm-up (``torch.distributed.group.WORLD``: every
            rank). They time at the same moment, as the job's ranks will compute, and every rank
            stores the same figures: per operator, batch size and field, the median over the
            ranks' medians. A machine's speed drifts and its ranks share it: a profile taken
            beside their work prices it better than a lone one taken before (docs/results.md,
            "Profiles beside the runs"). Default None: this process alone.

    Returns:
        The same graph, with ``Node.profile`` filled in (one ``ProfileSample`` per batch size).

    Raises:
        GraphError: the graph was not traced from this model (its operators differ), or not in
            the precision the model computes in here.
        InputError: bad batch sizes or device; with ``group``, a rank that profiles another graph
            or with other settings (every rank raises it, naming that rank).
    """
    sizes = list(batch_sizes)
    if not sizes or any(int(b) < 1 for b in sizes) or sorted(set(sizes)) != sizes:
        raise InputError(f"batch_sizes must be positive and strictly increasing, got {sizes}")
    if repeats < 1 or warmup < 0:
        raise InputError("repeats must be >= 1 and warmup >= 0")
    dev = _measuring_device(model, device)
    model = model.to(dev)
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    precision = autocast_for(model, graph.compute_dtype)  # the precision the graph was traced in
    with precision:
        traced = trace_module(model, _to(example_inputs, dev), _to(example_kwargs, dev), leaf_modules=leaf_modules)
    if traced.graph.fingerprint() != graph.fingerprint() or traced.graph.compute_dtype != graph.compute_dtype:
        raise GraphError(
            "profile: the graph does not match the model (its operators or edges differ, or it computes in "
            f"{traced.graph.compute_dtype} where the graph was traced in {graph.compute_dtype}); "
            "profile the graph that graphpipe.trace returned for this same model"
        )
    # The runs accumulate into parameter gradients and, in training mode, update buffers such as
    # BatchNorm's running statistics: the user's model must come out as it went in.
    saved_grads = {p: p.grad for p in model.parameters()}
    saved_buffers = [(buf, buf.detach().clone()) for buf in model.buffers()]
    if group is not None:
        _agree_to_start(group, graph.fingerprint(), sizes, repeats, warmup)
    results: dict[int, list[Any]] = {i: [] for i in range(graph.num_nodes)}
    with autocast_for(model, graph.compute_dtype):
        for size_samples in _profile_batches(traced, sizes, sync, warmup, repeats):
            for node_id, sample in size_samples:
                results[node_id].append(sample)
    for p, grad in saved_grads.items():
        p.grad = grad
    with torch.no_grad():
        for buf, value in saved_buffers:
            buf.copy_(value)
    if group is not None:
        results = _median_over_ranks(group, results)
    for node_id, samples in results.items():
        graph.set_profile(node_id, samples)
    return graph


def _agree_to_start(group: Any, fingerprint: str, sizes: list[int], repeats: int, warmup: int) -> None:
    """Every rank of ``group`` learns every rank's graph and settings before any times anything
    (the gather is also the start line): a rank that differs from rank 0 makes every rank raise,
    naming it, instead of leaving the others in a gather of figures that cannot be merged. The
    wait is bounded by the group's timeout."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise InputError("profile(group=) profiles on the ranks of a process group, but torch.distributed is "
                         "not initialized in this process (call torch.distributed.init_process_group, or "
                         "graphpipe.init_distributed under torchrun, first; or leave group=None)")
    everyone = _gathered(group, (fingerprint, list(sizes), repeats, warmup), "agreeing on what to profile")
    what = ("graph (fingerprint)", "batch sizes", "repeats", "warm-up")
    for rank, theirs in enumerate(everyone):
        for name, first, other in zip(what, everyone[0], theirs):
            if other != first:
                raise InputError(f"profile(group=): rank {rank} profiles with another {name} than rank 0 "
                                 f"({other!r} against {first!r}); every rank of the group must profile the "
                                 "same graph with the same settings")


def _median_over_ranks(group: Any, results: dict[int, list[Any]]) -> dict[int, list[Any]]:
    """Every rank's figures gathered, each replaced by its median over the ranks (bounded by the
    group's timeout)."""
    mine = {node: [_fields(s) for s in samples] for node, samples in results.items()}
    return median_samples(_gathered(group, mine, "gathering the ranks' timings"))


def _gathered(group: Any, mine: Any, during: str) -> list[Any]:
    """``mine`` from every rank of ``group`` (all_gather_object, bounded by the group's timeout).
    A peer that died or never came fails every rank with the runtime's errors (PeerError,
    PipelineTimeout; runtime/failure.py's rule), naming this rank, the group's other ranks and
    what the gather was for, instead of the backend's bare message."""
    import torch.distributed as dist

    from graphpipe.runtime.failure import collective_error

    everyone: list[Any] = [None] * dist.get_world_size(group)
    try:
        dist.all_gather_object(everyone, mine, group=group)
    except RuntimeError as exc:
        me = dist.get_rank(group)
        others = [r for r in range(len(everyone)) if r != me]
        error = collective_error(exc, dist.get_rank(), _timeout_seconds(group),
                                 f"in profile(group=), {during} with the group's ranks {others}")
        if error is exc:
            raise
        raise error from exc
    return everyone


def _timeout_seconds(group: Any) -> float:
    """The group's timeout in seconds (its CPU backend's options; torch's default if unknown)."""
    import torch.distributed as dist

    try:
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return dist.distributed_c10d.default_pg_timeout.total_seconds()


_SAMPLE_FIELDS = ("forward_seconds", "backward_seconds", "backward_input_seconds", "backward_weight_seconds")


def _fields(sample: Any) -> tuple[int, ...]:
    return (sample.batch_size, *(getattr(sample, f) for f in _SAMPLE_FIELDS))


def median_samples(per_rank: Sequence[Mapping[int, Sequence[Sequence[float]]]]) -> dict[int, list[Any]]:
    """Per node, the ``ProfileSample`` of each batch size whose every time is the median over the
    ranks of that time: ``per_rank[r][node]`` lists rank r's samples as tuples ``(batch_size,
    forward, backward, backward_input, backward_weight)``, in the same batch sizes on every
    rank."""
    merged: dict[int, list[Any]] = {}
    for node in per_rank[0]:
        merged[node] = []
        for i, first in enumerate(per_rank[0][node]):
            figures = [statistics.median(rank[node][i][f] for rank in per_rank) for f in range(1, 5)]
            merged[node].append(_C.ProfileSample(int(first[0]), *figures))
    return merged


def _measuring_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    """Where :func:`profile` times: ``device``, else the model's (its first parameter's), else the CPU."""
    first = next(model.parameters(), None)
    dev = torch.device(device) if device is not None else (first.device if first is not None else torch.device("cpu"))
    if dev.type == "meta":
        raise InputError("cannot time operators on the meta device: pass device='cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' requested but torch.cuda.is_available() is False")
    return dev


def _profile_batches(traced: Any, sizes: list[int], sync: Callable[[], None], warmup: int,
                     repeats: int) -> list[list[tuple[int, Any]]]:
    """Per batch size of ``sizes`` (rows of the traced batch repeated), each operator's
    ``ProfileSample``: the whole-graph runs of every size first, the sizes in turn
    (``_whole_graph_runs``), then each size's operators timed alone (``_samples_at``)."""
    base_batch = traced.batch_size
    values = [_take_rows(traced.placeholder_values, torch.arange(b) % base_batch, base_batch) for b in sizes]
    runs = _whole_graph_runs(traced.module, values, sync, warmup, repeats)
    return [_samples_at(traced, b, *run, sync, warmup, repeats) for b, run in zip(sizes, runs)]


def _samples_at(traced: Any, b: int, forward_in_place: dict[str, float], whole_backward: float,
                env: dict[fx.Node, Any], sync: Callable[[], None], warmup: int,
                repeats: int) -> list[tuple[int, Any]]:
    """Each operator's ``ProfileSample`` at batch size ``b``: its forward as timed in place in the
    whole-graph runs, its backward timed alone on ``env``'s values, the backwards scaled so that
    they add up to the whole graph's backward."""
    gm = traced.module
    by_name = {n.name: n for n in gm.graph.nodes}
    timed: list[tuple[int, float, float, float, float]] = []  # (node, forward, backward, I, W alone)
    for name, node_id in traced.node_ids.items():
        node = by_name[name]
        if node.op == "placeholder":
            alone = (0.0, 0.0, 0.0)
        else:
            alone = _operator_backward(gm, node, env, sync, warmup, repeats)
        timed.append((node_id, forward_in_place.get(name, 0.0), *alone))
    factor = _scale_factor([t[2] for t in timed], whole_backward)
    return [(node_id, _C.ProfileSample(b, fwd, bwd * factor, inputs_half * factor, weights_half * factor))
            for node_id, fwd, bwd, inputs_half, weights_half in timed]


def _to(value: Any, dev: torch.device) -> Any:
    return pytree.tree_map_only(torch.Tensor, lambda t: t.to(dev), value)
