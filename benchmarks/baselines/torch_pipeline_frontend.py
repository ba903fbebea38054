"""Baseline: torch.distributed.pipelining through its own front end, as its users run it.

``torch.distributed.pipelining.pipeline(model, mb_args, split_spec)`` exports the model
(torch.export) and splits the exported program before the modules named in ``split_spec``;
``Pipe.build_stage`` gives each rank its stage and torch's schedule (``Schedule1F1B``) runs it.
Nothing of graphpipe's runs here: the split points are the modules at which the ``sequential``
plan's stages begin (``split_points``), so this is the same chain of stages as far as module
boundaries allow (torch splits only at module calls, the plan at any operator).

Multi-input models (MMT's branches, CANDLE-Uno's towers) consume some inputs first at a later
stage, and ``Schedule.step`` hands the model's inputs to stage 0 only. The one change a torch
user makes for that is ``EnterAtStageZero``: the model inside a wrapper whose forward takes a view
of every input (no copy, no compute), so each input enters at stage 0 and torch's stages send it
on to the stage that reads it, as they send any activation.

Compared with ``baselines.torch_pipelining`` (a hand-written interpreter over
``torch.fx.passes.split_module``), nothing is added to the stages: no contiguous-gradient node,
no float64 carriers for integer tensors, no clones of relayed tensors. One exception, under the
schedules that split the backward (``FreshOutputs``): a copy of each stage output, without which
torch fails on some cuts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from baselines.torch_pipelining import schedule_step

__all__ = ["MULTI_STAGE_SCHEDULES", "SPLIT_BACKWARD_SCHEDULES", "EnterAtStageZero", "FreshOutputs",
           "make_multi_stage_stepper", "make_stepper", "split_points", "stage_placement"]


class EnterAtStageZero(nn.Module):
    """``model`` with every input viewed at the start of its forward, so that torch's
    ``pipeline()`` puts each input's first use in stage 0 (split points gain the prefix
    ``model.``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(*(x.view_as(x) for x in inputs))


class FreshOutputs(nn.Module):
    """A stage whose outputs that carry a gradient are copies (``clone``) of what ``inner``
    returns.

    torch's schedules that split the backward (``SPLIT_BACKWARD_SCHEDULES``) detach a stage's
    outputs in place once its input backward has run (torch 2.13, ``stage.py``), to free the
    graph early, and run the weight backward over the same graph afterwards. Where the stage
    also saved one of its outputs for its own backward (a cut just after a block's residual sum,
    which the next layer norm inside the stage saves), the weight backward then fails: "Trying to
    use a saved tensor that has been detached in-place". Which cut the sequential plan gives
    follows the profile, so the failure came and went from run to run of compare.py. A copy is
    saved by nothing, so detaching it frees what torch means to free and nothing else; it costs
    one copy of the stage's outputs per micro-batch. The gradients are unchanged.
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return pytree.tree_map(
            lambda v: v.clone() if isinstance(v, torch.Tensor) and v.requires_grad else v, self.inner(*args))


def _split(model: nn.Module, micro: tuple[torch.Tensor, ...], points: list[str]) -> Any:
    """torch's ``pipeline()`` of ``EnterAtStageZero(model)`` cut before each of ``points``, on a
    copy of ``model``: pipeline() leaves hooks on the submodules it splits before (torch 2.13's
    ``_split_before_forward``), so a second split, or a trace, of the same model recursed without
    end."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    return pipeline(EnterAtStageZero(copy.deepcopy(model)), mb_args=micro,
                    split_spec={f"model.{p}": SplitPoint.BEGINNING for p in points})


def split_points(stage_modules: list[list[str]]) -> list[str]:
    """The split points for a chain of stages given, per stage, the module paths of its
    operators in execution order: the first module of each stage after the first. Raises
    ValueError where two stages would begin at the same module (torch cannot cut inside one call)."""
    points: list[str] = []
    for modules in stage_modules[1:]:
        first = next((m for m in modules if m), None)
        if first is None or first in points:
            raise ValueError(f"torch's front end splits at module calls only; a stage begins inside module {first!r}")
        points.append(first)
    return points


def make_stepper(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], points: list[str], rank: int,
                 world: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], micro_batches: int,
                 lr: float = 0.01, device: torch.device | None = None, group: Any = None,
                 stage_wrapper: Callable[[nn.Module], nn.Module] | None = None) -> Callable[..., float]:
    """This rank's training step: ``pipeline()`` at ``points``, ``Pipe.build_stage``, and
    ``Schedule1F1B`` over ``micro_batches``; ``step(inputs, target)`` returns the mean loss on
    the last rank (NaN elsewhere, as in torch's API). ``stage_wrapper``: emulation, replaces the
    stage's module (the schedule and every transfer stay torch's)."""
    from torch.distributed.pipelining import Schedule1F1B

    device = device or torch.device("cpu")
    micro = tuple(t.chunk(micro_batches)[0] for t in example_inputs)
    pipe = _split(model, micro, points)
    if pipe.num_stages != world:
        raise ValueError(f"torch's front end made {pipe.num_stages} stages of {world} split points + 1")
    stage = pipe.build_stage(rank, device, group)
    if stage_wrapper is not None:
        real = stage.submod
        stage.submod = stage_wrapper(real)
        # torch's stage reads its submodule's graph (the placeholders) on the first step.
        stage.submod.graph = real.graph
    schedule = Schedule1F1B(stage, micro_batches, loss_fn=loss_fn)
    params = [p for p in stage.submod.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr) if params else None

    def step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        return schedule_step(schedule, optimizer, rank == 0, rank == world - 1, inputs, target, device)

    return step


def _stage_index(node: Any) -> int:
    return int(str(node.target).removeprefix("submod_pp_"))


def _sources(node: Any) -> set[int]:
    """The stages whose outputs a split-graph stage call reads (through getitem or directly)."""
    out: set[int] = set()
    for arg in node.args:
        producer = arg.args[0] if getattr(arg, "op", "") == "call_function" else arg
        if getattr(producer, "op", "") == "call_module":
            out.add(_stage_index(producer))
    return out


def refusal(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], points: list[str],
            micro_batches: int) -> str:
    """Why torch's front end cannot train ``model`` split at ``points`` ("" if it can): the
    split must give one stage per point + 1, and every model input must enter at stage 0
    (``Schedule.step`` hands the inputs to stage 0 only; ``EnterAtStageZero`` sees to that)."""
    micro = tuple(t.chunk(micro_batches)[0] for t in example_inputs)
    try:
        pipe = _split(model, micro, points)
    except Exception as exc:
        return f"torch's pipeline() failed: {type(exc).__name__}: {str(exc)[:100]}"
    if pipe.num_stages != len(points) + 1:
        return f"torch's pipeline() made {pipe.num_stages} stages of {len(points)} split points"
    late = []
    for node in pipe.split_gm.graph.nodes:
        if node.op == "placeholder":
            stages = sorted({str(user.target) for user in node.users if str(user.target) != "submod_pp_0"})
            if stages:
                late.append(f"{node.target} at {', '.join(s.replace('submod_pp_', 'stage ') for s in stages)}")
    if late:
        return ("torch's front end cannot feed model inputs to later stages (Schedule.step gives them to stage 0 "
                f"only): {'; '.join(late)}")
    order = [_stage_index(n) for n in pipe.split_gm.graph.nodes if n.op == "call_module"]
    if order != sorted(order):
        # Seen on MMT with 4 branches cut at each branch: the split graph runs stage 2 before
        # stage 1; there torch 2.13's Schedule1F1B deadlocks over Gloo and ScheduleGPipe's
        # losses differ from one process.
        return ("torch's pipeline() ordered the stages " + " -> ".join(map(str, order))
                + "; its schedules assume stage i runs before stage i+1")
    skips = sorted({(src, _stage_index(n)) for n in pipe.split_gm.graph.nodes if n.op == "call_module"
                    for src in _sources(n) if src < _stage_index(n) - 1})
    if skips and len(points) + 1 > 3:
        # torch's 1F1B waits on each send before the next forward, and a send to a stage two or
        # more ahead is received only after the stages between have run: MMT and CANDLE-Uno cut
        # at the sequential plan's 4 stages deadlocked (Gloo). 3 stages with a 0 -> 2 edge ran
        # and trained like one process (tests/python/test_baseline_torch_pipelining.py).
        return ("torch's Schedule1F1B deadlocks on sends that skip stages (here "
                + ", ".join(f"{a} -> {b}" for a, b in skips) + "); its front end has no relay")
    return ""


def train_rank(rank: int, world: int, spec: str, points: list[str], micro_batches: int, steps: int,
               lr: float) -> list[float]:
    """``steps`` iterations of a ``graphpipe.models`` spec through torch's front end on this rank
    of an initialised process group: the losses (NaN except on the last rank)."""
    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches

    torch.set_num_threads(1)
    model, inputs, batches = seeded_batches(spec, steps)
    step = make_stepper(model, tuple(inputs), points, rank, world, default_loss(spec), micro_batches, lr=lr)
    return [step(x, y) for x, y in batches]


#: torch's schedules that run several stages per rank, by the name compare.py gives them: the
#: class in torch.distributed.pipelining, how it places the stages on the ranks ("loop":
#: rank r holds stages r, r + world, ...; "v": rank r holds stages r and 2 world - 1 - r, so
#: rank 0 holds the first stage and the last), and whether it splits each backward into an input
#: and a weight half (its stages' outputs are then copied: FreshOutputs).
MULTI_STAGE_SCHEDULES: dict[str, tuple[str, str, bool]] = {
    "interleaved 1f1b": ("ScheduleInterleaved1F1B", "loop", False),
    "interleaved zb": ("ScheduleInterleavedZeroBubble", "loop", True),
    "zbv": ("ScheduleZBVZeroBubble", "v", True),
    "dualpipev": ("ScheduleDualPipeV", "v", True),
}
#: The schedules of MULTI_STAGE_SCHEDULES that split the backward.
SPLIT_BACKWARD_SCHEDULES = frozenset(name for name, (_, _, split) in MULTI_STAGE_SCHEDULES.items() if split)


def stage_placement(schedule: str, world: int, num_stages: int) -> list[list[int]]:
    """The stages each rank holds under ``schedule`` (a key of ``MULTI_STAGE_SCHEDULES``), in the
    order torch's schedule takes them. A V needs exactly two stages per rank."""
    style = MULTI_STAGE_SCHEDULES[schedule][1]
    if num_stages % world != 0:
        raise ValueError(f"{num_stages} stages do not divide among {world} ranks")
    if style == "v":
        if num_stages != 2 * world:
            raise ValueError(f"torch's {schedule} holds exactly 2 stages per rank, got {num_stages} on {world}")
        return [[r, num_stages - 1 - r] for r in range(world)]
    return [list(range(r, num_stages, world)) for r in range(world)]


def make_multi_stage_stepper(model: nn.Module, example_inputs: tuple[torch.Tensor, ...], points: list[str],
                             rank: int, world: int, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                             micro_batches: int, schedule: str, lr: float = 0.01,
                             device: torch.device | None = None, group: Any = None,
                             stage_wrapper: Callable[[int, nn.Module], nn.Module] | None = None) -> Callable[..., float]:
    """This rank's training step under one of torch's several-stages-per-rank schedules:
    ``pipeline()`` cut at ``points`` (``len(points) + 1`` stages, a multiple of ``world``), the
    stages of ``stage_placement`` built as ``PipelineStage`` s of the split's submodules, and the
    schedule over ``micro_batches``. ``step(inputs, target)`` feeds the inputs to the rank holding
    the first stage and the target to the one holding the last, and returns the mean loss there
    (NaN elsewhere). ``stage_wrapper(stage_index, module)``: emulation, replaces a stage's module.

    ``PipelineStage`` rather than ``Pipe.build_stage``: the latter's stages assume stage i on rank
    i mod world and warm up their neighbours by point-to-point messages, which under a V sends
    from a rank to itself (stages 1 and 2 of 4 on rank 1), which Gloo refuses (torch 2.13:
    "Pair is not connected"); PipelineStage's warm-up vote skips that."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules

    device = device or torch.device("cpu")
    micro = tuple(t.chunk(micro_batches)[0] for t in example_inputs)
    pipe = _split(model, micro, points)
    num_stages = len(points) + 1
    if pipe.num_stages != num_stages:
        raise ValueError(f"torch's front end made {pipe.num_stages} stages of {len(points)} split points + 1")
    mine = stage_placement(schedule, world, num_stages)[rank]
    modules = [pipe.get_stage_module(i) for i in mine]
    if stage_wrapper is not None:
        modules = [stage_wrapper(i, m) for i, m in zip(mine, modules)]
    run = [FreshOutputs(m) for m in modules] if schedule in SPLIT_BACKWARD_SCHEDULES else modules
    stages = [PipelineStage(m, i, num_stages, device, group=group) for i, m in zip(mine, run)]
    runner = getattr(torch_schedules, MULTI_STAGE_SCHEDULES[schedule][0])(stages, micro_batches, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr) if params else None
    first, last = 0 in mine, num_stages - 1 in mine

    def step(inputs: tuple[torch.Tensor, ...], target: torch.Tensor) -> float:
        return schedule_step(runner, optimizer, first, last, inputs, target, device)

    step.stage_modules = dict(zip(mine, modules))  # type: ignore[attr-defined]  (tests read the parameters)
    return step
