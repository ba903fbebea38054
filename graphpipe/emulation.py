"""Emulation: a stage's compute replaced by a wait of its predicted duration; transfers stay real.

On a machine with fewer cores than ranks, real compute would time-share the cores and measure
the machine, not the pipeline. In emulation each micro-batch's forward waits for the stage's
``forward_seconds`` and its backward for ``backward_seconds`` (the plan's figures, from the
profiled cost model, the same ones the simulator uses), and produces zero tensors of the real
shapes, so every point-to-point transfer, the schedule's order and the executor's waits are the
real ones. Sleeping ranks use no CPU, so 4 to 16 ranks fit on 2 cores, and the measured
iteration time shows the runtime's scheduling efficiency against the simulator's prediction.
Losses and gradients are meaningless in this mode; every report of it says "emulated".

On a replicated stage the iteration's last emulated backward (the one the runtime's gradient
buckets are armed for) also hands zero gradients to the real parameters, group by group (in the
runtime's bucket order: reverse registration, about a bucket's bytes to a group) at an even pace
over the backward's wait, so that the buckets start their all-reduces during the backward, as
they do on real compute and as the simulator assumes. Without them every bucket would start
after the backward, and the all-reduce that a real run overlaps would be timed in series. The
other backwards hand the parameters nothing and wait in one piece per half: handing zeros in
every backward allocated and accumulated every parameter's gradient each micro-batch, real CPU
work beside the wait (a stage of 8.4 M parameters: 17 ms of CPU and 25 ms of wall time per
10 ms emulated backward), which made replicated plans run well behind their simulation.
The pieces of the armed backward wait until deadlines counted from the backward's start (each
half's own start under a split backward), so the CPU work between and inside them (making the
gradients, the buckets' hooks copying them and starting the all-reduces) lies inside the
emulated backward, as on a GPU, whose kernels run while the CPU does that work; waited after
that work, the armed backward ran up to twice its figure, and replicated plans 15-20% slower
than simulated (benchmarks/replica_bench.py).
:class:`EmulatedOptimizer` stands in for the optimizer: its step is a wait of the simulated step
(the zero gradients would make a real one meaningless, and on large stages not free).

A plain ``time.sleep(d)`` returns 0.1-0.2 ms late on Linux (the default 50 us timer slack and
wake-up latency), which over the tens of tasks on a pipeline's critical path is a few percent
the simulator does not know of; :func:`wait` therefore asks for a 1 us timer slack (Linux
``prctl``), sleeps until shortly before the deadline and spins the rest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from graphpipe._ext import _C

__all__ = ["EmulatedOptimizer", "EmulatedStage", "emulate_stage", "wait"]

#: How long before the deadline the coarse sleep ends; the rest is spun. Covers the usual
#: oversleep of time.sleep (with a 1 us timer slack) while costing little CPU per wait: with
#: more ranks than cores, spinning ranks take the cores from ranks with real work.
SPIN_SECONDS = 100e-6
#: Bytes of parameters per group whose gradients a replicated stage's emulated backward hands
#: over at once: the runtime's default gradient bucket (cost/gradient_buckets.h).
GROUP_BYTES = 1 << 20
#: At most this many groups (each one more wait, whose spin costs CPU the other ranks need).
MAX_GROUPS = 16

_PR_SET_TIMERSLACK = 29
_slack_set = False


def _tight_timer_slack() -> None:
    """Linux: this thread's sleeps may end 1 us late instead of the default 50 us."""
    global _slack_set
    if _slack_set:
        return
    _slack_set = True
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the spin covers the oversleep
        pass


#: How late (seconds) this process's sleeps have been returning: a moving average of the
#: lateness past each sleep's target. On a loaded machine a sleeping rank wakes when a core is
#: free, easily 0.3-0.5 ms late with 8 ranks on 2 busy cores, once per wait, which the simulator
#: would otherwise see as a per-instruction cost of the runtime. Sleeps end this much earlier.
_lateness = 0.0
#: Weight of the newest sample in the moving average, and the most it may anticipate.
_LATENESS_WEIGHT = 0.2
_MAX_LATENESS = 2e-3


def wait(seconds: float) -> None:
    """Returns ``seconds`` after the call, within a few microseconds on an idle core: sleeps
    until shortly before the deadline (earlier by the usual lateness of this process's
    sleeps), then spins the rest, yielding the core to other runnable ranks while it spins."""
    global _lateness
    if seconds <= 0.0:
        return
    _tight_timer_slack()
    now = time.perf_counter()
    deadline = now + seconds
    coarse = seconds - SPIN_SECONDS - _lateness
    if coarse > 0.0:
        time.sleep(coarse)
        late = time.perf_counter() - (now + coarse)
        _lateness = min(_MAX_LATENESS, max(0.0, (1.0 - _LATENESS_WEIGHT) * _lateness + _LATENESS_WEIGHT * late))
    while time.perf_counter() < deadline:
        os.sched_yield()


def _zero_outputs(ctx: Any, specs: list) -> tuple[torch.Tensor, ...]:
    """Zero tensors of ``specs``' shapes and dtypes, the non-floating ones marked
    non-differentiable (autograd would otherwise expect gradients for them)."""
    outs = tuple(torch.zeros(shape, dtype=dtype) for shape, dtype in specs)
    for t in outs:
        if not t.is_floating_point():
            ctx.mark_non_differentiable(t)
    return outs


class _Clock:
    """When the backward a replicated stage's two chains of waits belong to is due to end: the
    deadline of the last piece to run (None before any has)."""

    __slots__ = ("deadline",)

    def __init__(self) -> None:
        self.deadline: float | None = None


class _Chain:
    """One emulated backward's chain of waits on a replicated stage (its input half's or its
    weight half's): the half's seconds, its pieces not yet run, whether this backward is the
    iteration's last (which the chain's first piece to run asks the runtime: ``armed``; None:
    always), the clock it shares with the other half's chain (``other``), and whether its first
    piece starts that clock anew once the other chain has run to its end (``restarts``: the
    weight half's, which runs first in a whole backward, and after I in a split one)."""

    __slots__ = ("seconds", "armed", "live", "left", "clock", "other", "restarts")

    def __init__(self, seconds: float, armed: Callable[[], bool] | None, pieces: int, clock: _Clock,
                 restarts: bool = False) -> None:
        self.seconds = seconds
        self.armed = armed
        self.live = True
        self.left = pieces
        self.clock = clock
        self.other: _Chain | None = None
        self.restarts = restarts

    def next_deadline(self, seconds: float, first: bool, now: float) -> float | None:
        """When this chain's next piece (of ``seconds`` in the armed backward, ``first`` or not)
        ends, its clock moved there; None: the piece has no wait (in a backward that is not
        armed, the first piece waits the whole half).

        The half's first piece starts the clock where none runs yet, and the weight half's
        first piece starts it anew where the input half has run to its end: a split backward's
        W, run after other instructions (counted from I's start, its deadlines would have
        passed). Within a whole backward the weight half runs first, so the input half's first
        piece goes on from where the weight half's clock stands, however few the pieces."""
        self.left -= 1
        clock = self.clock
        if first:
            self.live = self.armed is None or bool(self.armed())
            other = self.other
            if clock.deadline is None or (self.restarts and other is not None and other.left <= 0):
                clock.deadline = now
        assert clock.deadline is not None  # a chain's first piece runs before its others
        if not self.live:
            if not first:
                return None
            seconds = self.seconds
        clock.deadline += seconds
        return clock.deadline


def _wait_piece(chain: _Chain | None, seconds: float, first: bool,
                specs: list | None = None) -> list[torch.Tensor] | None:
    """A piece's wait: its ``seconds`` outside a chain or in the iteration's last backward,
    else the whole half in the chain's first piece and nothing in the others. Returns the zero
    gradients of ``specs`` when the piece hands them over (outside a chain, or in the armed
    backward), else None.

    A chain's pieces wait until deadlines (:meth:`_Chain.next_deadline`), not for durations, and
    make their gradients before waiting: what runs between and inside the pieces on the CPU, the
    gradients' making and the gradient buckets' hooks (copying each group into its bucket,
    starting its all-reduce), then lies inside the backward, as it does on a GPU, whose kernels
    run while the CPU does that work; added after each wait, it made the emulated replicated
    backward twice the simulator's (CANDLE-Uno)."""
    now = time.perf_counter()
    deadline = now + seconds if chain is None else chain.next_deadline(seconds, first, now)
    hands = chain is None or chain.live
    grads = [torch.zeros(s, dtype=d) for s, d in specs] if hands and specs is not None else None
    if deadline is not None:
        wait(deadline - time.perf_counter())
    return grads


class _WaitInputs(torch.autograd.Function):
    """Outputs zeros shaped like the real outputs; its backward (the input-gradient half, or its
    last piece in a ``chain``) waits, then returns zeros for the inputs."""

    @staticmethod
    def forward(ctx: Any, seconds: float, chain: _Chain | None, first: bool, specs: list,
                *inputs: torch.Tensor) -> Any:
        ctx.seconds, ctx.chain, ctx.first = seconds, chain, first
        ctx.input_specs = [(t.shape, t.dtype) for t in inputs]
        return _zero_outputs(ctx, specs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        _wait_piece(ctx.chain, ctx.seconds, ctx.first)
        return (None, None, None, None, *[torch.zeros(s, dtype=d) if d.is_floating_point else None
                                         for s, d in ctx.input_specs])


class _WaitWeights(torch.autograd.Function):
    """A zero that depends on the stage's one parameter; its backward (the weight-gradient
    half) waits. Added to every floating output, so a whole backward runs both halves, a
    gradient for the inputs only the first, one for the parameters only the second."""

    @staticmethod
    def forward(ctx: Any, seconds: float, anchor: torch.Tensor) -> torch.Tensor:
        ctx.seconds = seconds
        return torch.zeros(())

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        wait(ctx.seconds)
        return None, torch.zeros(())


class _WaitGroup(torch.autograd.Function):
    """One piece of a ``chain`` of waits: its backward waits (_wait_piece), then hands zeros to
    the next piece (``after``) and, in the iteration's last backward, zero gradients to
    ``params`` (whose accumulator hooks start the runtime's gradient buckets). Forward: a scalar
    zero."""

    @staticmethod
    def forward(ctx: Any, seconds: float, chain: _Chain, first: bool, after: torch.Tensor,
                *params: torch.Tensor) -> torch.Tensor:
        ctx.seconds, ctx.chain, ctx.first = seconds, chain, first
        ctx.param_specs = [(p.shape, p.dtype) for p in params]
        return torch.zeros(())

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        grads = _wait_piece(ctx.chain, ctx.seconds, ctx.first, ctx.param_specs)
        return (None, None, None, torch.zeros(()), *(grads if grads is not None else [None] * len(ctx.param_specs)))


class _ZerosOf(torch.autograd.Function):
    """Zeros of the given shapes that depend on ``link`` (the chains' joint head): free in
    both directions."""

    @staticmethod
    def forward(ctx: Any, specs: list, link: torch.Tensor) -> Any:
        return _zero_outputs(ctx, specs)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        return None, torch.zeros(())


def parameter_groups(params: list[nn.Parameter], group_bytes: float = GROUP_BYTES,
                     max_groups: int = MAX_GROUPS) -> list[list[nn.Parameter]]:
    """``params`` in the runtime's bucket order (reverse registration) cut into consecutive
    groups of about ``group_bytes`` each (at most ``max_groups``, whole parameters)."""
    ordered = list(reversed(params))
    total = sum(p.numel() * p.element_size() for p in ordered)
    size = max(float(group_bytes), total / max_groups)
    groups: list[list[nn.Parameter]] = [[]]
    filled = 0.0
    for p in ordered:
        if groups[-1] and filled >= size:
            groups.append([])
            filled = 0.0
        groups[-1].append(p)
        filled += p.numel() * p.element_size()
    return groups if groups[0] else []


class EmulatedOptimizer(torch.optim.Optimizer):
    """An optimizer whose step is a wait of ``seconds`` (the simulated step); ``zero_grad``
    drops the gradients as torch's does."""

    def __init__(self, params: Any, seconds: float) -> None:
        super().__init__(params, {})
        self.seconds = float(seconds)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # closure: torch.optim.Optimizer.step's signature
        wait(self.seconds)


class EmulatedStage(nn.Module):
    """Wraps a stage module: the first call runs it for real (to learn its outputs' shapes),
    later calls wait ``forward_seconds`` and return zeros of those shapes. Its backward waits
    ``backward_seconds``: the input-gradient half (``input_seconds``) in one autograd node, the
    rest in another that only the parameter (``anchor``) depends on, so that a split backward
    (zero-bubble schedules: I, then W) waits each half where the runtime runs it."""

    def __init__(self, real: nn.Module, forward_seconds: float, backward_seconds: float,
                 input_seconds: float | None = None, replicated: bool = False,
                 armed: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.real = real
        # Replicated: the backward hands the real parameters zero gradients, group by group,
        # interleaved with the input half (see the module's docstring); else one wait per half.
        # `armed` says whether the backward running is the iteration's last (the runtime's
        # GradientBuckets.armed); None: every backward is.
        self._groups = parameter_groups([p for p in real.parameters() if p.requires_grad]) if replicated else []
        self._armed = armed
        self.forward_seconds = float(forward_seconds)
        self.backward_seconds = float(backward_seconds)
        self.input_seconds = float(backward_seconds / 2 if input_seconds is None else input_seconds)
        # Keeps the backward alive even when no input needs a gradient (a source stage).
        self.anchor = nn.Parameter(torch.zeros(()))
        self._spec: Any = None
        self._leaves: list[Any] = []
        self._tensor_specs: list[tuple[torch.Size, torch.dtype]] = []
        self._one_tensor = False

    def forward(self, *args: Any) -> Any:
        if self._spec is None:
            with torch.no_grad():
                result = self.real(*args)
            leaves, self._spec = pytree.tree_flatten(result)
            self._leaves = [(t.shape, t.dtype) if isinstance(t, torch.Tensor) else t for t in leaves]
            # Computed once: the per-call work is what the emulation measures the runtime with.
            self._tensor_specs = [leaf for leaf in self._leaves if isinstance(leaf, tuple)]
            self._one_tensor = self._spec.is_leaf() and len(self._tensor_specs) == 1
        wait(self.forward_seconds)
        floats = _float_tensors(args)
        # A stage with no input that needs a gradient (a source) has no input half to wait for:
        # its whole backward is the parameters' (as in the runtime's split, where I is empty).
        has_inputs = any(a.requires_grad for a in floats)
        input_part = self.input_seconds if has_inputs else 0.0
        if self._groups:
            outs = list(self._chained_outputs(floats, input_part))
        else:
            weight = _WaitWeights.apply(self.backward_seconds - input_part, self.anchor)
            outs = [t + weight if t.is_floating_point() else t
                    for t in _WaitInputs.apply(input_part, None, True, self._tensor_specs, *floats)]
        if self._one_tensor:
            return outs[0]
        it = iter(outs)
        leaves = [next(it) if isinstance(leaf, tuple) else leaf for leaf in self._leaves]
        return pytree.tree_unflatten(leaves, self._spec)


    def _chained_outputs(self, floats: list[torch.Tensor], input_part: float) -> tuple:
        """Outputs whose backward runs two chains of waits, interleaved: the input half's
        (ending in the inputs' gradients) and the weight half's (each piece handing one
        parameter group its gradients). Autograd's engine runs the ready node created last
        first, so the pieces are created deepest first, alternating, the weight chain's head
        last: the backward then alternates weight piece, input piece, and the groups' gradients
        become final at an even pace over the whole backward, the first group first."""
        n = len(self._groups)
        weight_total = sum(p.numel() for g in self._groups for p in g) or 1
        weight_seconds = self.backward_seconds - input_part
        # Piece k = 0 of each chain, created last, runs first.
        clock = _Clock()
        inputs = _Chain(input_part, self._armed, n, clock)
        weights = _Chain(weight_seconds, self._armed, n, clock, restarts=True)
        inputs.other, weights.other = weights, inputs
        inputs_head = _WaitInputs.apply(input_part / n, inputs, n == 1, [((), torch.float32)], *floats)[0]
        weights_head = self.anchor
        for k in reversed(range(n)):
            if k < n - 1:
                inputs_head = _WaitGroup.apply(input_part / n, inputs, k == 0, inputs_head)
            share = sum(p.numel() for p in self._groups[k]) / weight_total
            weights_head = _WaitGroup.apply(weight_seconds * share, weights, k == 0, weights_head, *self._groups[k])
        return _ZerosOf.apply(self._tensor_specs, weights_head + inputs_head)


def _float_tensors(args: tuple) -> list[torch.Tensor]:
    """The floating tensors among ``args``' pytree leaves, in pytree order. Stage modules take
    tensors, tuples or lists of them and a few constants: those are walked directly (a pytree
    walk per micro-batch costs more than the rest of the emulated forward), anything else
    (a dict, a registered pytree) through torch's pytree."""
    out: list[torch.Tensor] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_floating_point():
                out.append(a)
        elif type(a) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in a):
            out.extend(t for t in a if t.is_floating_point())
        elif a is not None and not isinstance(a, (bool, int, float, str)):
            return [t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return out


def emulate_stage(pipe: Any, forward_seconds: float | None = None, backward_seconds: float | None = None,
                  scale: float = 1.0) -> None:
    """Switches this rank's stages (each of them, where it runs several) of a ``graphpipe.wrap``
    pipeline to emulation.

    The durations (per micro-batch) default to the plan's predicted ``forward_seconds`` and
    ``backward_seconds`` of the stage, times ``scale`` (0 measures the runtime alone: its
    dispatch, transfers and per-step work, with no compute).
    """
    for stage in pipe.stages:
        _emulate_one(pipe, stage, forward_seconds, backward_seconds, scale)


def _emulate_one(pipe: Any, stage: int, forward_seconds: float | None, backward_seconds: float | None,
                 scale: float) -> None:
    """Switches stage ``stage`` of this rank to emulation (see :func:`emulate_stage`)."""
    figures = pipe.plan.stages[stage]
    fwd = figures.forward_seconds if forward_seconds is None else forward_seconds
    bwd = figures.backward_seconds if backward_seconds is None else backward_seconds
    # I as the schedules and the simulator price it, W the rest of the backward: a whole backward
    # (1F1B) waits the stage's backward, a split one too (the extra activation gradients the real
    # W walks again, which the simulator's W includes, are not emulated).
    split_input = _C.backward_split(figures)[0]
    share = min(1.0, split_input / figures.backward_seconds) if figures.backward_seconds > 0 else 0.5
    replicated = len(figures.devices) > 1
    buckets = pipe.gradient_buckets
    armed = (lambda: buckets.armed) if buckets is not None else None
    # A split backward's W computes the gradient of the emulated stage's one parameter (its
    # waits hang on it), and on a replicated stage those of the real parameters too.
    pipe.swap_stage_module(
        lambda real: EmulatedStage(real, fwd * scale, bwd * scale, bwd * scale * share, replicated=replicated,
                                   armed=armed),
        weights=lambda emulated: [emulated.anchor] + [p for g in emulated._groups for p in g], stage=stage)
