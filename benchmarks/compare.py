"""The main job: is a graph pipeline faster than what a PyTorch user would run instead?

For each model, world size and per-rank memory limit, in one invocation, with the same global
batch, optimizer (SGD), dtype (float32) and number of ranks:

  graphpipe/graph+dp       graphpipe's runtime on the plan graphpipe.plan's default search
                           makes (what wrap() runs: replicas, plain data parallelism and plans
                           folded up to 2 stages per rank weighed by simulation, the schedule
                           "auto"): a graph pipeline, data parallelism, a V, or a mix
  graphpipe/sequential+dp  the same on the ``sequential`` (chain) planner's plan
  torch/1f1b               torch.distributed.pipelining as its users run it: pipeline() (over
                           torch.export) split at the modules where the sequential plan's stages
                           begin, Pipe.build_stage, Schedule1F1B (baselines/torch_pipeline_frontend.py;
                           where torch's front end cannot take the model, the reason instead), at
                           least as many micro-batches as stages (Schedule1F1B's requirement)
  torch/1f1b interpreter   the same schedule on stages cut at the plan's exact operators by the
                           hand-written interpreter of baselines/torch_pipelining.py (which adds
                           work: a contiguous-gradient node per input, clones of relayed tensors);
                           beside the front end's row, its figure shows that overhead
  torch/interleaved zb,    torch's zero-bubble family with 2 stages per rank through its front
  torch/zbv, torch/dualpipev  end (ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
                           ScheduleDualPipeV): the sequential plan for twice the ranks, the stages
                           placed looping or in a V, each rank's memory the sum of its stages'
                           (where torch cannot take the model or the cut, the reason instead)
  graphpipe/graph V        the planner's own V: its graph cut for twice the ranks folded in a V
                           (graphpipe.plan(..., stages_per_rank=2, fold="v"), no replicas), under
                           zb_graph (or why no such plan simulates faster than one stage per rank)
  torch/fsdp2              FSDP2, torch.distributed.fsdp.fully_shard on every layer and the root
                           (baselines/torch_fsdp.py): every rank 1/world of the training state
  torch/ddp                DistributedDataParallel: every rank the whole model (baselines/torch_ddp.py)

``--variants all`` adds graphpipe's plain pipelines (graph, graph under the zero-bubble schedule,
sequential), torch's GPipe (interpreter) and torch's interleaved 1F1B (2 stages per rank). ``--memory-limit`` takes one or more per-rank limits, each a job
of its own: ``none`` (the device's memory: the model fits everywhere, data parallelism's regime)
or ``auto`` (memory-bound: 90% of the whole model's parameters, gradients and optimizer state,
so that no rank can hold the whole model's training state) or a size (``30MiB``). The limit is
the cost model's, the same for every variant: the planners plan under it, FSDP2 runs the fewest
micro-batches (gradient accumulation) at which its cost-model figure fits, and DDP is reported
as "does not fit" with the bytes it needs.

Every variant is measured in ``--rounds`` interleaved rounds (A, B, C, then C, B, A: the order
reversed every other round, so that over an even number of rounds a steady drift of the machine
hits every variant alike; 6 measured, 2 emulated by default),
each on freshly spawned ranks (Gloo on CPU, one torch thread each) or, under ``torchrun``, on
the launched ranks; warm-up iterations, then measured ones, back to back (one barrier per
round; an iteration is the mean over the working ranks of the time between their returns),
pooled over the rounds. We report
samples/s (median and min-max spread), the cost model's memory per rank and the measured peak
(resident memory on CPU, allocated on GPU), ratios to the baselines, a verdict line per job
(the fastest variant, graph+dp over the best non-graphpipe variant), and check every variant's
first-step loss against single-process training. Output: a markdown table on stdout, JSON
(machine, torch, commit, every figure) and a PNG chart. Beside it, for every graphpipe row, the
simulator's prediction of the same plan with the device description the planner used (links, the
link collectives see (fitted to real all-reduces) and the runtime's per-instruction and per-step
costs, measured by graphpipe.calibration with as many ranks at once as the run), its error, one gradient bucket's all-reduce measured against the cost
model's price, and per job whether the planner's pick (graph+dp) is within 5% of the fastest.
Measured runs also profile the model in every round, in its place in the round's order, on the
run's ranks at once (benchmarks/profiles_beside.py), and the table prices every graphpipe plan
again on those profiles' median: the simulator's error where the machine's drift between the
profile and the runs is taken out. The plans are still made on the profile before the runs.

``--emulate`` (the default on CPU; ``--no-emulate`` measures real compute) replaces each stage's
compute by a wait of its profiled duration (transfers and collectives stay real), so that 4 to
16 ranks fit on a small machine; every output of that mode says "emulated". Emulated DDP and
FSDP2 ranks wait the same cost model's time for the whole model at their shard of the batch,
split over the parameter segments, so their real all-reduces (DDP) and all-gathers and
reduce-scatters (FSDP2) overlap the compute as usual. Optimizer steps are waits of the
simulated step (the emulated zero gradients would make the real one free).

``--device cuda`` runs every rank on its own GPU with NCCL (profiling on the GPU too, planning
with the ``--gpu-kind`` preset and the measured links).

    python benchmarks/compare.py        # defaults: MMT, 4 emulated ranks, no limit and memory-bound
    python benchmarks/compare.py --models mmt candle_uno --memory-limit auto
    python benchmarks/compare.py --no-emulate             # measured: 4 models, 2 CPU ranks
    python benchmarks/compare.py --variants all --memory-limit none
    torchrun --nproc-per-node 2 benchmarks/compare.py --no-emulate   # the launched ranks (Gloo on CPU)
    torchrun --nproc-per-node 8 benchmarks/compare.py --device cuda --size paper
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from profiles_beside import REPEATS, WARMUP, profile_rank, shard_sizes, simulate_beside  # noqa: E402

import graphpipe  # noqa: E402
from graphpipe.local_ranks import rank_cpus  # noqa: E402
from graphpipe.models import build_model, default_loss  # noqa: E402
from graphpipe.runtime import stage_assignment  # noqa: E402
from graphpipe.testing import RankResult, reference_training, run_ranks, seeded_batches  # noqa: E402

#: Benchmark sizes: big enough on a CPU core that compute, not per-operator overhead, dominates;
#: small enough that the default run takes a few minutes on 2 cores.
BENCH_SPECS = {
    "mmt": "mmt:branches=4,depth=2,seq=32,hidden=128,heads=4,ffn=256,batch=32",
    "dlrm": "dlrm:dense_branches=4,sparse_branches=4,dense_in=256,dense_width=512,dense_depth=3,"
            "emb_rows=20000,emb_dim=64,bag=16,top_width=512,top_depth=2,batch=64",
    "candle_uno": "candle_uno:branches=4,feature_in=512,width=512,depth=4,top_width=512,top_depth=2,batch=64",
    "transformer": "transformer:depth=8,seq=32,hidden=128,heads=4,ffn=256,batch=32",
}
LR = 0.001
#: The optimizer every run steps (torch.optim.SGD at LR); the plans size Adam's memory, the
#: planner's default, but the simulator prices this one's step.
RUN_OPTIMIZER = "sgd"
MIB = 2**20
PEER_BUILD_FAILED = "a peer rank could not build this variant"
#: The ratio columns of the table: every variant against these (same model, ranks and limit).
BASELINES = ("graphpipe/sequential+dp", "torch/fsdp2", "torch/ddp")
#: The reference of the chart's bars (drawn as 1.0).
CHART_REFERENCE = "graphpipe/sequential+dp"
#: torch's schedules with several stages per rank (baselines/torch_pipeline_frontend.py), run on a
#: cut of 2 stages per rank: the zero-bubble family always, interleaved 1F1B with --every.
TORCH_MULTI_STAGE = ("interleaved zb", "zbv", "dualpipev")
TORCH_MULTI_STAGE_EVERY = ("interleaved 1f1b",)

#: The default run (the main job): MMT on 4 emulated ranks (devices 4x slower than a core),
#: once with no memory limit (the model fits everywhere: data parallelism's regime) and once
#: memory-bound (no rank holds the whole training state), in under 6 minutes on a 2-core
#: machine. --no-emulate runs the measured 2-rank comparison of all of BENCH_SPECS instead.
DEFAULT_EMULATED_MODELS = ("mmt",)
DEFAULT_EMULATED_WORLD = 4
DEFAULT_MEASURED_WORLD = 2
DEFAULT_SLOWDOWN = 4.0
DEFAULT_EMULATED_LIMITS = ("none", "auto")
DEFAULT_MEASURED_LIMITS = ("none",)
# Every round of every variant spawns its ranks afresh (about 10 s for 4 ranks on 2 busy
# cores): 2 rounds keep the default run within 6 minutes there, still interleaved. Measured
# runs take 6: that machine drifts 10-20% from minute to minute, and with 4 rounds two copies of
# one plan still read up to 4% apart in one run.
DEFAULT_EMULATED_ROUNDS = 2
DEFAULT_MEASURED_ROUNDS = 6


# ---- what is timed: one record per runtime, in a Variant ------------------------------------

@dataclass
class GraphpipeRun:
    """graphpipe's runtime on a plan (as JSON: plans cross process boundaries as text)."""

    plan_json: str
    schedule: str
    plan_key: str  # which plan of make_variants' info
    optimizer_seconds: list[float] = field(default_factory=list)  # per stage, simulated (emulation)


@dataclass
class TorchPipelineRun:
    """torch.distributed.pipelining on the sequential plan's cuts: through its front end
    (``pipeline()`` split at ``split_points``) or through the
    interpreter of baselines/torch_pipelining.py (the operator cuts ``labels``)."""

    front_end: bool  # pipeline() at split_points, or the interpreter at labels
    split_points: list[str]  # module paths where torch's pipeline() cuts
    labels: dict[str, int]  # operator name -> stage
    num_stages: int
    schedule: str
    stage_seconds: list[tuple[float, float]]  # per stage, forward and backward per micro-batch (emulation)
    optimizer_seconds: list[float] = field(default_factory=list)
    # 1: stage r on rank r (Schedule1F1B, ScheduleGPipe); more: one of torch's several-stages-per-
    # rank schedules (`schedule` a key of MULTI_STAGE_SCHEDULES) through its front end.
    stages_per_rank: int = 1


@dataclass
class DataParallelRun:
    """torch DDP or FSDP2: every rank the whole model's compute on its shard of the batch."""

    emulation: Any  # baselines.torch_ddp.DDPEmulation (the cost model's waits), or why there is none


@dataclass
class Variant:
    """One way of training the model that compare.py times."""

    name: str
    runtime: str  # "graphpipe", "torch" (pipelining), "ddp" or "fsdp2"
    run: GraphpipeRun | TorchPipelineRun | DataParallelRun | None = None
    micro_batches: int = 1
    depth: int = 0  # stages on the longest path; 1 for data parallelism
    memory_bytes: float | None = None  # the cost model's training state per rank
    unavailable: str = ""  # why there is no number (printed instead of one)


# ---- per-rank work -------------------------------------------------------------------------

def _rank_device(device: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # Linux: this process's peak resident set (VmHWM), not ru_maxrss, which a spawned rank
    # inherits from the parent it was forked from (rank 0's planner, hundreds of MiB).
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _with_wait(step: Any, seconds: float) -> Any:
    """``step`` followed by a wait (emulation: the stage's simulated optimizer step)."""
    from graphpipe.emulation import wait

    def emulated(x: Any, y: Any) -> float:
        loss = step(x, y)
        wait(seconds)
        return loss

    return emulated


def _graphpipe_stepper(rank: int, world: int, spec: str, run: GraphpipeRun, model: Any, inputs: Any,
                       emulate: float | None, device: torch.device) -> Any:
    # skip_nonfinite=False: the optimizer steps as soon as this rank's part is done, before the
    # closing loss sum (which waits for the other ranks), as the simulator assumes.
    pipe = graphpipe.wrap(model.to(device), inputs, default_loss(spec), plan=run.plan_json, schedule=run.schedule,
                          device=device, skip_nonfinite=False)
    params = list(pipe.parameters())
    optimizer = torch.optim.SGD(params, lr=LR) if params else None
    if emulate is not None and pipe.stages:
        from graphpipe.emulation import EmulatedOptimizer, emulate_stage

        emulate_stage(pipe, scale=emulate)
        # The optimizer step is a wait of the simulated ones (of each stage the rank holds), where
        # the runtime steps it.
        params = list(pipe.parameters())
        optimizer = EmulatedOptimizer(params, sum(run.optimizer_seconds[s] for s in pipe.stages
                                                  if s < len(run.optimizer_seconds)))
    return lambda x, y: float(pipe.step(x, y, optimizer=optimizer))


def _torch_stepper(rank: int, world: int, spec: str, run: TorchPipelineRun, micro_batches: int, model: Any,
                   inputs: Any, emulate: float | None, device: torch.device) -> Any:
    import torch.distributed as dist
    from baselines.torch_pipelining import chain_stage_modules, make_stepper, pin_integer_consumers, stage_examples

    from graphpipe.trace import trace_module

    if run.stages_per_rank > 1:
        return _torch_multi_stage_stepper(rank, world, spec, run, micro_batches, model, inputs, emulate, device)
    k = run.num_stages
    group = dist.new_group(list(range(k))) if k < world else None  # collective: every rank calls it
    if rank >= k:  # more ranks than chain stages: this rank idles (its steps are not timed)
        def idle(x: Any, y: Any) -> float:
            return float("nan")

        idle.idle = True  # type: ignore[attr-defined]
        return idle
    if run.front_end:
        from baselines.torch_pipeline_frontend import make_stepper as frontend_stepper

        from graphpipe.emulation import EmulatedStage

        forward, backward = run.stage_seconds[rank]
        wrapper = None if emulate is None else (lambda m: EmulatedStage(m, emulate * forward, emulate * backward))
        step = frontend_stepper(model, tuple(inputs), run.split_points, rank, k, default_loss(spec), micro_batches,
                                lr=LR, device=device, group=group, stage_wrapper=wrapper)
        return _with_wait(step, run.optimizer_seconds[rank]) if emulate is not None else step
    traced = trace_module(model, inputs)
    labels = pin_integer_consumers(traced.module, run.labels, traced.placeholder_values)
    stages = chain_stage_modules(traced.module, labels, k)
    example = stage_examples(stages, tuple(inputs), micro_batches)[rank]
    stage = stages[rank]
    if emulate is not None:  # the same waits as graphpipe's emulated stages, from the same cost model
        from graphpipe.emulation import EmulatedStage

        forward, backward = run.stage_seconds[rank]
        stage = EmulatedStage(stage, emulate * forward, emulate * backward)
    step = make_stepper(stage, rank, k, default_loss(spec), micro_batches, run.schedule, lr=LR, device=device,
                        group=group, example=example)
    return _with_wait(step, run.optimizer_seconds[rank]) if emulate is not None else step


def _torch_multi_stage_stepper(rank: int, world: int, spec: str, run: TorchPipelineRun, micro_batches: int,
                               model: Any, inputs: Any, emulate: float | None, device: torch.device) -> Any:
    """One of torch's several-stages-per-rank schedules on every rank; emulated, each of this
    rank's stages waits its own predicted times, and the optimizer step the sum of theirs."""
    from baselines.torch_pipeline_frontend import make_multi_stage_stepper, stage_placement

    from graphpipe.emulation import EmulatedStage

    def wrapper(stage: int, module: Any) -> Any:
        forward, backward = run.stage_seconds[stage]
        return EmulatedStage(module, emulate * forward, emulate * backward)

    step = make_multi_stage_stepper(model, tuple(inputs), run.split_points, rank, world, default_loss(spec),
                                    micro_batches, run.schedule, lr=LR, device=device,
                                    stage_wrapper=None if emulate is None else wrapper)
    if emulate is None:
        return step
    mine = stage_placement(run.schedule, world, run.num_stages)[rank]
    return _with_wait(step, sum(run.optimizer_seconds[i] for i in mine))


def _data_parallel_stepper(rank: int, world: int, spec: str, runtime: str, run: DataParallelRun, micro_batches: int,
                           model: Any, inputs: Any, emulate: float | None, device: torch.device) -> Any:
    """This rank's step of torch DDP or FSDP2 (1/world of the batch per rank). Emulated: the
    model's compute becomes the cost model's waits, per parameter segment (their zero gradients
    go through the real collectives, overlapping the backward), and the SGD step a wait of the
    simulated optimizer step (FSDP2: of 1/world of it, each rank updating its shard). FSDP2 runs
    ``micro_batches`` pieces of the shard (gradient accumulation), each waiting the cost model's
    time at its rows."""
    from baselines import torch_ddp, torch_fsdp

    if emulate is None:
        if runtime == "ddp":
            return torch_ddp.make_stepper(model, rank, world, default_loss(spec), lr=LR, device=device)
        return torch_fsdp.make_stepper(model, rank, world, default_loss(spec), lr=LR, device=device,
                                       micro_batches=micro_batches)
    if not hasattr(run.emulation, "segments"):
        raise RuntimeError(f"cannot emulate {runtime}: {run.emulation}")
    shard = torch_ddp.shard_inputs(tuple(inputs), rank, world)
    if runtime == "ddp":
        fake = torch_ddp.emulated_model(model, shard, run.emulation, scale=emulate)
        return torch_ddp.make_stepper(fake, rank, world, default_loss(spec), lr=LR, device=device,
                                      optimizer_wait=emulate * run.emulation.optimizer_seconds)
    piece = tuple(t.tensor_split(micro_batches)[0] for t in shard)
    fake = torch_fsdp.emulated_model(model, piece, run.emulation, scale=emulate)
    return torch_fsdp.make_stepper(fake, rank, world, default_loss(spec), lr=LR, device=device,
                                   optimizer_wait=emulate * run.emulation.optimizer_seconds / world,
                                   micro_batches=micro_batches)


def keep_freed_memory() -> None:
    """glibc malloc: freed blocks stay in the process for reuse, none is handed back to the OS.

    By default glibc serves large blocks with mmap and trims the heap after frees, so every step
    gives the gradient buffers back and faults them in again: on the 2-core machine, DLRM's
    embedding gradients cost 6000-9500 page faults (15-18 ms of kernel time) at random steps of
    a 20 ms iteration, and the measured steps spread from 21 to 39 ms. With a 1 GiB mmap and trim
    threshold the faults stop after the first step. Applied in every process of every variant
    (graphpipe's and torch's alike); a no-op where there is no glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    libc.mallopt(m_mmap_threshold, 1 << 30)
    libc.mallopt(m_trim_threshold, 1 << 30)


def measure_rank(rank: int, world: int, spec: str, variant: Variant, steps: int, emulate: float | None,
                 device: str = "cpu") -> dict:
    """Builds ``variant`` on this rank and runs ``steps`` iterations back to back, as a training
    loop does, after one barrier of the whole group: {"losses", "seconds", "peak_memory",
    "idle"}, where seconds[i] is the time from iteration i - 1's return to iteration i's on this
    rank (i = 0: from the barrier) and idle says that this rank takes no part (a chain shorter
    than the world). Every rank calls it.
    ``emulate``: None computes for real; a number s emulates every stage's compute by waits of
    s x its predicted duration (1: the plan's figures, 0: no compute, the runtime alone)."""
    import torch.distributed as dist

    keep_freed_memory()
    dev = _rank_device(device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    model, inputs, data = seeded_batches(spec, steps)
    failure: Exception | None = None
    try:
        if variant.runtime == "graphpipe":
            step = _graphpipe_stepper(rank, world, spec, variant.run, model, inputs, emulate, dev)
        elif variant.runtime == "torch":
            step = _torch_stepper(rank, world, spec, variant.run, variant.micro_batches, model, inputs, emulate, dev)
        else:
            step = _data_parallel_stepper(rank, world, spec, variant.runtime, variant.run, variant.micro_batches,
                                          model, inputs, emulate, dev)
    except Exception as exc:  # agreed on below, then raised
        failure = exc
    # Every rank learns whether every other could build its part before any rank waits on a
    # peer: a variant that one rank refuses then fails everywhere at once instead of leaving
    # the others in a barrier.
    built = torch.tensor([0 if failure else 1], device=dev)
    dist.all_reduce(built, op=dist.ReduceOp.MIN)
    if failure is not None:
        raise failure
    if int(built.item()) == 0:
        raise RuntimeError(PEER_BUILD_FAILED)
    losses, seconds = [], []
    # No garbage-collection pauses inside timed iterations (the same for every variant).
    gc.collect()
    gc.disable()
    # No barrier between iterations: a barrier's exit skew and its own all-reduce land in every
    # iteration timed between two (on 8 Gloo ranks on 2 cores they added 4-15 ms to a 61 ms
    # DLRM step whose ranks, timed back to back, took 60-64.5 ms), and a training loop has none.
    dist.barrier()
    last = time.perf_counter()
    for x, y in data:
        losses.append(step(x, y))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        now = time.perf_counter()
        seconds.append(now - last)
        last = now
    gc.enable()
    dist.barrier()  # no rank leaves (and frees its memory) while another still steps
    return {"losses": losses, "seconds": seconds, "peak_memory": _peak_memory_bytes(dev),
            "idle": bool(getattr(step, "idle", False))}




# ---- planning: the variants of one job --------------------------------------------------------

@dataclass
class Job:
    """One model at one world size under one per-rank memory limit."""

    model: str  # the name given on the command line
    spec: str
    world: int
    memory_limit: str | None  # None (the device's memory), "auto" or a size such as "30MiB"


def regime(limit_bytes: float | None) -> str:
    return "fits (no limit)" if limit_bytes is None else f"memory-bound, {limit_bytes / MIB:.3g} MiB/rank"


def auto_memory_limit(static_bytes: float) -> float:
    """The memory-bound default: 90% of the whole model's parameters, gradients and optimizer
    state (the planner's static bytes for one device), so that no rank can hold the whole
    model's training state (data parallelism cannot run, however small its micro-batches)."""
    return 0.9 * static_bytes


def _device_model(world: int, device: str, gpu_kind: str, slowdown: float, calibration: dict | None = None) -> Any:
    """The cost model's devices: the preset (CPU ranks: this machine's measured throughput and
    memory bandwidth, by which the optimizer step is priced), the measured links, and devices
    ``slowdown`` times slower than this core, so the planner, the simulator and the emulated waits
    all see the same, longer compute and memory traffic."""
    preset = graphpipe.devices(world, gpu_kind if device == "cuda" else "cpu", measure=device != "cuda")
    return calibrated_description(preset, world, slowdown, calibration)


def run_optimizer_price(calibration: dict) -> dict[str, float]:
    """The report's measured price per parameter tensor of RUN_OPTIMIZER's step, as
    ``Devices.optimizer_tensor_seconds`` takes it ({}: not measured). Reports before prices were
    kept per optimizer hold one number, measured with SGD."""
    prices = calibration.get("optimizer_tensor_seconds") or {}
    if not isinstance(prices, dict):
        prices = {"sgd": float(prices)}
    return {RUN_OPTIMIZER: prices[RUN_OPTIMIZER]} if RUN_OPTIMIZER in prices else {}


def calibrated_description(devices: Any, world: int, slowdown: float, calibration: dict | None) -> Any:
    """``devices`` (a preset description) with the report's measured ``calibration`` of ``world``
    ranks (None: the preset's own figures) and ``slowdown`` applied, as _device_model makes it
    (benchmarks/resimulate.py rebuilds older reports' descriptions with it)."""
    if calibration is not None:
        latency, bandwidth = calibration["link_latency_seconds"], calibration["link_bandwidth_bytes_per_second"]
        devices.set_node_links(world, bandwidth, latency, bandwidth, latency)
        # The runtime's measured costs go into the description: the planner charges them as the
        # simulator does (cost::Devices). They are this machine's CPU work, not the devices'
        # compute, so the slowdown leaves them alone.
        devices.instruction_overhead_seconds = calibration["instruction_overhead_seconds"]
        devices.step_overhead_seconds = calibration["step_overhead_seconds"]
        # Collectives (the replicas' gradient all-reduces) are priced from the link a real
        # all-reduce over these ranks showed, not from the point-to-point one (cost/devices.h).
        devices.collective_latency_seconds = calibration["collective_latency_seconds"]
        devices.collective_bandwidth_bytes_per_second = calibration["collective_bandwidth_bytes_per_second"]
        # A transfer's tensors share one latency; each extra one costs one more message (absent
        # from reports written before it was measured: a latency per tensor).
        devices.extra_tensor_seconds = calibration.get("extra_tensor_seconds")
        # What an all-reduce beside the backward costs it on these ranks (absent from reports
        # written before it was measured: nothing).
        devices.collective_overlap_loss = calibration.get("collective_overlap_loss", 0.0)
        # The price per parameter tensor of the optimizer these runs step (absent from reports
        # written before it was measured, and from emulated runs, which step no real optimizer:
        # nothing). Only its price: the plans size Adam's memory, but what the runs pay per tensor
        # is RUN_OPTIMIZER's loop (simulate_plans simulates its step).
        devices.optimizer_tensor_seconds = run_optimizer_price(calibration)
        # The wait for the slowest rank, per second of compute (absent from older reports: none).
        devices.rank_skew_fraction = calibration.get("rank_skew_fraction", 0.0)
    devices.relative_speed = devices.relative_speed / slowdown
    devices.memory_bandwidth = devices.memory_bandwidth / slowdown
    return devices


def _links_only_price(devices: Any, world: int) -> float:
    """One 1 MiB all-reduce over every rank priced from the point-to-point links alone (the
    description without its collective link figures): what the cost model charged before it
    had them."""
    links = graphpipe.Devices.from_json(devices.to_json())
    links.collective_latency_seconds = 0.0
    links.collective_bandwidth_bytes_per_second = 0.0
    return graphpipe.all_reduce_cost(links, list(range(world)), 1 << 20).seconds


def _plan_or_reason(graph: Any, devices: Any, partitioner: str, schedule_choice: str = "1f1b",
                    **kwargs: Any) -> tuple[Any, str]:
    # A variant is replicated only where it says so: plan()'s default would replicate pipelines
    # that leave ranks idle, and the table compares the two kinds side by side.
    kwargs.setdefault("replicate", False)
    try:
        return graphpipe.plan(graph, devices, partitioner, schedule=schedule_choice, **kwargs), ""
    except Exception as exc:  # the planner's refusal is the row's content
        return None, f"no plan: {type(exc).__name__}: {str(exc)[:240]}"


def peak_rank_memory(plan: Any) -> float:
    """The most bytes a rank holds: its stages' memory summed (several stages share a rank)."""
    per_rank: dict[int, float] = {}
    for stage in plan.stages:
        for d in stage.devices:
            per_rank[int(d)] = per_rank.get(int(d), 0.0) + stage.memory_bytes
    return max(per_rank.values())


def make_variants(job: Job, profile_batches: tuple[int, ...], calibration: dict[str, float], device: str = "cpu",
                  gpu_kind: str = "h100", slowdown: float = 1.0,
                  every: bool = False) -> tuple[list[Variant], dict, float | None]:
    """Profiles and plans ``job``: its variants, the plans' figures (simulated times) and the
    memory limit in bytes (None: the device's memory)."""
    model, inputs = build_model(job.spec)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, device="cuda" if device == "cuda" else "cpu",
                      batch_sizes=profile_batches, repeats=REPEATS, warmup=WARMUP)
    devices = _device_model(job.world, device, gpu_kind, slowdown, calibration)
    one = _device_model(1, device, gpu_kind, slowdown)
    shard_batch = -(-graph.trace_batch_size // job.world)
    ddp = whole_model(graph, one, shard_batch)
    limit = (None if job.memory_limit is None else auto_memory_limit(ddp[0].static_bytes)
             if job.memory_limit == "auto" else graphpipe.parse_bytes(job.memory_limit))

    plans: dict[str, Any] = {}
    variants: list[Variant] = []

    def graphpipe_variant(name: str, key: str, partitioner: str, schedule: str | None = None, folded: bool = False,
                          **kwargs: Any) -> None:
        """A graphpipe row: the plan under ``key`` (made here once), run under ``schedule`` or
        (None) the schedule the plan was made for; ``folded``: only if that plan is folded in a V."""
        if key not in plans:
            plans[key], reason = _plan_or_reason(graph, devices, partitioner, memory_limit=limit, **kwargs)
            if plans[key] is None:
                del plans[key]
                variants.append(Variant(name, "graphpipe", unavailable=reason))
                return
        p = plans[key]
        if folded and p.fold != "v":
            variants.append(Variant(name, "graphpipe", unavailable=f"not run: no plan folded in a V simulates "
                                                                  f"faster here (the search chose {p.partitioner})"))
            return
        variants.append(Variant(name, "graphpipe", GraphpipeRun(p.to_json(graph), schedule or p.schedule, key),
                                p.num_micro_batches, p.depth, peak_rank_memory(p)))

    # The planner's pick: plan()'s default search (replicate None: replicas, plain data
    # parallelism and folds of 2 stages per rank, planner/default_search.h), as wrap() plans, and
    # the schedule chosen with the plan.
    graphpipe_variant("graphpipe/graph+dp", "graphpipe+dp", "graphpipe", replicate=None, schedule_choice="auto")
    graphpipe_variant("graphpipe/sequential+dp", "sequential+dp", "sequential", replicate=True)
    if every:
        graphpipe_variant("graphpipe/graph", "graphpipe", "graphpipe")
        graphpipe_variant("graphpipe/graph zb", "graphpipe", "graphpipe", "zb_graph")
        graphpipe_variant("graphpipe/sequential", "sequential", "sequential")
    # The cut torch's several-stages-per-rank rows and graphpipe's V row share, planned once.
    doubled = doubled_sequential_cut(graph, devices, limit)
    variants += torch_pipeline_variants(graph, devices, limit, every, model, inputs, doubled)
    # Beside torch's zero-bubble family: graphpipe on the very cut torch's ZB-V runs (the
    # sequential plan for twice the ranks), in a V on the ranks, under zb_graph.
    if doubled.reason:
        variants.append(Variant("graphpipe/V zb", "graphpipe", unavailable=doubled.reason))
    else:
        graphpipe_variant("graphpipe/V zb", "V", "manual", manual=doubled.labels,
                          stage_devices=v_placement(job.world), micro_batches=doubled.cut.micro_batches,
                          schedule_choice="zb_graph")
    # The planner's own V: its graph cut for twice the ranks folded in a V (plan(fold="v"), no
    # replicas), under zb_graph; on a DAG such as MMT's the cut torch's family cannot run.
    graphpipe_variant("graphpipe/graph V", "graph V", "graphpipe", folded=True, replicate=False, stages_per_rank=2,
                      fold="v", schedule_choice="zb_graph")
    variants += data_parallel_variants(graph, model, one, job.world, shard_batch, ddp, limit)

    info = simulate_plans(plans, graph, devices)
    if job.world > 1:
        # What the cost model prices one gradient bucket's all-reduce over every rank at (from
        # the description's collective link, as planner and simulator do), beside the measured
        # one and the links-only price: the replicas' sync rests on it.
        info["bucket_all_reduce"] = {
            "measured_seconds": calibration["bucket_all_reduce_seconds"],
            "priced_seconds": graphpipe.all_reduce_cost(devices, list(range(job.world)), 1 << 20).seconds,
            "priced_from_links_seconds": _links_only_price(devices, job.world)}
    for v in variants:
        if isinstance(v.run, GraphpipeRun):
            key = v.run.plan_key + (" zb" if v.run.schedule == "zb_graph" else "")
            v.run.plan_key = key
            v.run.optimizer_seconds = info[key]["optimizer_seconds"]
    return variants, info, limit


def whole_model(graph: Any, one: Any, rows: int) -> tuple[Any, Any]:
    """The whole model on one device at ``rows`` rows (one micro-batch): the cost model's stage
    figures (memory, forward and backward seconds) and the emulation waits they give, spread
    over the parameter segments with the simulated optimizer step (or why there are none)."""
    from baselines.torch_ddp import emulation_segments

    whole = graphpipe.plan(graph, one, "sequential", batch_size=rows, micro_batches=1)
    figures = whole.stages[0]
    try:
        return figures, emulation_segments(graph, rows, figures.forward_seconds, figures.backward_seconds,
                                           optimizer_seconds(graphpipe.simulate(whole, one, optimizer=RUN_OPTIMIZER), 1)[0])
    except Exception as exc:  # only the emulated data-parallel variants need it
        return figures, f"{type(exc).__name__}: {exc}"


def data_parallel_variants(graph: Any, model: Any, one: Any, world: int, shard_batch: int, ddp: tuple[Any, Any],
                           limit: float | None) -> list[Variant]:
    """torch FSDP2 (at the fewest micro-batches at which a rank's part fits the limit) and torch
    DDP (the whole model at a rank's shard, ``ddp``), each with its cost-model memory, "does not
    fit" where that exceeds the limit."""
    from baselines import torch_fsdp

    ddp_figures, ddp_emulation = ddp
    layer_bytes = max((sum(p.numel() * p.element_size() for p in model.get_submodule(n).parameters())
                       for n in torch_fsdp.layer_names(model)), default=0)
    fsdp_m, (fsdp_figures, fsdp_emulation) = 1, ddp
    while True:
        fsdp_bytes = torch_fsdp.memory_bytes(ddp_figures.static_bytes, fsdp_figures.activation_bytes, layer_bytes,
                                             world)
        if limit is None or fsdp_bytes <= limit or shard_batch % (2 * fsdp_m):
            break
        fsdp_m *= 2
        fsdp_figures, fsdp_emulation = whole_model(graph, one, shard_batch // fsdp_m)
    if hasattr(fsdp_emulation, "segments") and hasattr(ddp_emulation, "segments"):
        fsdp_emulation.optimizer_seconds = ddp_emulation.optimizer_seconds  # one step per iteration

    def unfit(need: float, note: str = "") -> str:
        if limit is None or need <= limit:
            return ""
        return f"does not fit: needs {need / MIB:.3g} MiB/rank > {limit / MIB:.3g} MiB{note}"

    static = ddp_figures.static_bytes
    note = (f" (its parameters, gradients and optimizer state alone: {static / MIB:.3g} MiB)"
            if limit is not None and static > limit else "")
    return [Variant("torch/fsdp2", "fsdp2", DataParallelRun(fsdp_emulation), fsdp_m, 1, fsdp_bytes, unfit(fsdp_bytes)),
            Variant("torch/ddp", "ddp", DataParallelRun(ddp_emulation), 1, 1, ddp_figures.memory_bytes,
                    unfit(ddp_figures.memory_bytes, note))]


def torch_pipeline_variants(graph: Any, devices: Any, limit: float | None, every: bool, model: Any,
                            inputs: Any, doubled: DoubledCut | None = None) -> list[Variant]:
    """torch.distributed.pipelining at the sequential plan's cuts (the same stages and stage
    times as that plan, at at least as many micro-batches as stages: Schedule1F1B refuses fewer):
    1F1B through torch's front end (``pipeline()``, or the reason it cannot take the model) and
    through the interpreter of baselines/torch_pipelining.py, which cuts at any operator; and
    the 2-stages-per-rank schedules on ``doubled`` (None: planned here)."""
    seq, reason = _plan_or_reason(graph, devices, "sequential", memory_limit=limit)
    names = ["torch/1f1b", "torch/1f1b interpreter"] + (["torch/gpipe interpreter"] if every else [])
    if doubled is None:
        doubled = doubled_sequential_cut(graph, devices, limit)
    multi = torch_multi_stage_variants(graph, doubled, limit, every, model, inputs)
    if seq is None:
        return [Variant(n, "torch", unavailable=reason) for n in names] + multi
    labels = stage_assignment(seq, graph)
    front = _torch_cut(graph, devices, seq, labels)
    points, refused = _front_end_cut(graph, seq, model, inputs, front.micro_batches)
    # The interpreter keeps integer tensors inside one stage (pin_integer_consumers: torch's
    # pipelining garbles them between stages); where that empties stages (DLRM's embedding bags
    # all join the indices' stage) they are dropped, and the waits are those of the pinned cut.
    from baselines.torch_pipelining import pin_integer_consumers

    from graphpipe.trace import trace_module

    traced = trace_module(model, inputs)
    pinned = pin_integer_consumers(traced.module, labels, traced.placeholder_values)
    used = sorted(set(pinned.values()))
    pinned = {name: used.index(stage) for name, stage in pinned.items()}
    inner = front if pinned == labels else _torch_cut(graph, devices, seq, pinned, front.micro_batches)

    def run(cut: _TorchCut, schedule: str, front_end: bool = False) -> TorchPipelineRun:
        return TorchPipelineRun(front_end, points, cut.labels, cut.num_stages, schedule, cut.seconds, cut.optimizer)

    out = [Variant("torch/1f1b", "torch", run(front, "1f1b", True), front.micro_batches, front.num_stages, front.memory,
                   unavailable=refused),
           Variant("torch/1f1b interpreter", "torch", run(inner, "1f1b"), inner.micro_batches, inner.num_stages,
                   inner.memory)]
    if every:
        out.append(Variant("torch/gpipe interpreter", "torch", run(inner, "fill_drain"), inner.micro_batches,
                           inner.num_stages, inner.memory))
    return out + multi


def _front_end_cut(graph: Any, plan: Any, model: Any, inputs: Any, micro_batches: int) -> tuple[list[str], str]:
    """Where torch's front end cuts ``plan``'s chain (the module each stage begins at), and why it
    cannot run it ("" where it can)."""
    from baselines.torch_pipeline_frontend import refusal, split_points

    try:
        points = split_points([[graph.node(n).module for n in stage.nodes] for stage in plan.stages])
        return points, refusal(model, tuple(inputs), points, micro_batches)
    except ValueError as exc:
        return [], str(exc)


def _same_devices(devices: Any, count: int) -> Any:
    """``devices`` described for ``count`` devices: the same figures, every pair joined by the
    link between its first two (one node)."""
    description = json.loads(devices.to_json())
    n = description["count"]
    latency = description["link_latency"][0][1] if n > 1 else 0.0
    bandwidth = description["link_bandwidth"][0][1] if n > 1 else 0.0
    description.update(count=count, node=[0] * count,
                       link_latency=[[0.0 if i == j else latency for j in range(count)] for i in range(count)],
                       link_bandwidth=[[bandwidth] * count for _ in range(count)])
    return graphpipe.Devices.from_json(json.dumps(description))


def torch_multi_stage_variants(graph: Any, doubled: DoubledCut, limit: float | None, every: bool, model: Any,
                               inputs: Any) -> list[Variant]:
    """torch's several-stages-per-rank schedules (TORCH_MULTI_STAGE) on 2 stages per rank: the
    ``sequential`` plan for twice the ranks (the same devices' figures) cut at its modules through
    torch's front end, each rank holding the stages its schedule places there, its memory their
    sum. The row says why where torch cannot run it: the cut is not 2 stages per rank, or the
    front end refuses the model (inputs read after stage 0, stages out of order)."""
    from baselines.torch_pipeline_frontend import stage_placement

    world = doubled.world
    names = list(TORCH_MULTI_STAGE) + (list(TORCH_MULTI_STAGE_EVERY) if every else [])
    rows = [f"torch/{name}" for name in names]
    if doubled.reason:
        return [Variant(r, "torch", depth=2 * world if world > 1 else 0, unavailable=doubled.reason)
                for r in rows]
    cut = doubled.cut
    points, refused = _front_end_cut(graph, doubled.plan, model, inputs, cut.micro_batches)
    out = []
    for name, row in zip(names, rows):
        placed = stage_placement(name, world, cut.num_stages)
        memory = max(sum(cut.stage_memory[i] for i in stages) for stages in placed)
        run = TorchPipelineRun(True, points, cut.labels, cut.num_stages, name, cut.seconds, cut.optimizer,
                               stages_per_rank=2)
        # The cut was planned for twice the ranks, each stage under the limit; a rank holds two.
        unfit = (f"does not fit: needs {memory / MIB:.1f} MiB/rank (its 2 stages) > {limit / MIB:.1f} MiB"
                 if limit is not None and memory > limit else "")
        out.append(Variant(row, "torch", run, cut.micro_batches, cut.num_stages, memory,
                           unavailable=refused or unfit))
    return out


@dataclass
class DoubledCut:
    """The cut torch's several-stages-per-rank schedules and graphpipe's V row run: the
    ``sequential`` plan for twice the ranks, or the reason there is none of 2 stages per rank."""

    world: int
    reason: str = ""  # non-empty: no such cut (plan, labels and cut are then None)
    plan: Any = None
    labels: dict[str, int] | None = None  # operator name -> stage
    cut: _TorchCut | None = None  # priced on the doubled devices, at torch's micro-batches


def doubled_sequential_cut(graph: Any, devices: Any, limit: float | None) -> DoubledCut:
    """The ``sequential`` plan for twice the ranks of ``devices`` (the same devices' figures),
    with its operator labels and its cut as torch runs it (_torch_cut)."""
    world = devices.count
    if world < 2:
        return DoubledCut(world, "one rank: nothing to pipeline")
    doubled = _same_devices(devices, 2 * world)
    seq, reason = _plan_or_reason(graph, doubled, "sequential", memory_limit=limit)
    if seq is not None and seq.num_stages != 2 * world:
        reason = f"not run: the sequential plan for {2 * world} stages (2 per rank) has {seq.num_stages}"
    if seq is None or reason:
        return DoubledCut(world, reason)
    labels = stage_assignment(seq, graph)
    return DoubledCut(world, "", seq, labels, _torch_cut(graph, doubled, seq, labels))


def v_placement(world: int) -> dict[int, list[int]]:
    """2 x ``world`` chain stages in a V on ``world`` ranks (rank r: stages r and 2 world - 1 - r)."""
    return {s: [s if s < world else 2 * world - 1 - s] for s in range(2 * world)}


@dataclass
class _TorchCut:
    """A chain cut torch's pipelining runs: operator -> stage, at as many micro-batches as
    stages at least (Schedule1F1B refuses fewer), with its stages' emulated times and memory."""

    labels: dict[str, int]
    num_stages: int
    micro_batches: int
    seconds: list[tuple[float, float]]  # per stage, forward and backward per micro-batch
    optimizer: list[float]  # per stage, its simulated optimizer step
    memory: float  # the peak stage's bytes
    stage_memory: list[float] = field(default_factory=list)  # per stage, its bytes


def _torch_cut(graph: Any, devices: Any, plan: Any, labels: dict[str, int], micro_batches: int | None = None) -> _TorchCut:
    """The cut ``labels`` priced by the cost model at ``micro_batches`` (default: the plan's, or
    as many as stages where the batch allows): ``plan`` where it is that cut and micro-batching,
    else a manual plan of the cut."""
    k = len(set(labels.values()))
    m = micro_batches or plan.num_micro_batches
    if m < k and graph.trace_batch_size % k == 0:
        m = k
    same = labels == stage_assignment(plan, graph)
    at_m = plan if same and m == plan.num_micro_batches else \
        graphpipe.plan(graph, devices, "manual", manual=labels, micro_batches=m)
    return _TorchCut(labels, k, m, [(s.forward_seconds, s.backward_seconds) for s in at_m.stages],
                     optimizer_seconds(graphpipe.simulate(at_m, devices, optimizer=RUN_OPTIMIZER), k), peak_rank_memory(at_m),
                     [s.memory_bytes for s in at_m.stages])


def simulate_plans(plans: dict[str, Any], graph: Any, devices: Any) -> dict[str, dict]:
    """Per plan under the schedule it was made for (and "graphpipe zb": the graph plan under
    zb_graph too; a plan made for zb_graph is keyed "<name> zb"): its shape, the simulated
    iteration (with the devices' measured runtime costs) and optimizer step per stage."""
    info: dict[str, dict] = {}
    for name, p in plans.items():
        for kind in sorted({p.schedule} | ({"zb_graph"} if name == "graphpipe" else set())):
            result = graphpipe.simulate(p, devices, kind, optimizer=RUN_OPTIMIZER)
            info[name + (" zb" if kind == "zb_graph" else "")] = {
                "stages": p.num_stages, "depth": p.depth, "micro_batches": p.num_micro_batches,
                "micro_batch_size": p.micro_batch_size, "partitioner": p.partitioner,
                "replicas": [len(s.devices) for s in p.stages],
                "predicted_iteration_seconds": p.predicted_iteration_seconds,
                "simulated_iteration_seconds": result.iteration_seconds,
                "optimizer_seconds": optimizer_seconds(result, p.num_stages),
                "memory_bytes": [s.memory_bytes for s in p.stages],
                # The description it was simulated with, so that benchmarks/resimulate.py can
                # price the plan again under another rule from the report alone.
                "devices": json.loads(devices.to_json())}
    return info


def optimizer_seconds(result: Any, num_stages: int) -> list[float]:
    """Per stage, the duration of its optimizer step in a simulation."""
    out = [0.0] * num_stages
    for task in result.tasks:
        if task.kind == "optimizer":
            out[task.stage] = task.end - task.start
    return out


@dataclass
class Launch:
    """How ranks come to be: spawned by this script per run, or launched once by torchrun."""

    torchrun: bool
    device: str  # "cpu" or "cuda"
    timeout: float
    # Spawned CPU ranks each bound to a core of their own where they are no more than the cores
    # (local_ranks.run_ranks(bind_cpus=True)): bound, 2 ranks on 2 cores stepped 1.003-1.108x as
    # fast as unbound (benchmarks/cpu_binding_bench.py); why is not measured.
    bind_cpus: bool = False

    @classmethod
    def spawned(cls, device: str = "cpu", timeout: float = 600.0, bind_cpus: bool = False) -> Launch:
        """Ranks this script spawns per run (the side benchmarks' way: they are never run under
        torchrun)."""
        return cls(torchrun=False, device=device, timeout=timeout, bind_cpus=bind_cpus)

    def binds(self, world: int) -> bool:
        """Whether ``world`` spawned ranks are bound to a CPU each (bind_cpus asked, CPU ranks,
        no more of them than the CPUs this process may use)."""
        if not self.bind_cpus or self.torchrun or self.device != "cpu":
            return False
        try:
            rank_cpus(world)  # the one rule for whether they can be: a CPU each
        except ValueError:
            return False
        return True

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if self.torchrun else 0

    def run(self, world: int, variant: Variant, spec: str, steps: int, emulate: float | None) -> list[RankResult]:
        """``measure_rank`` on every rank; every rank's result (on every rank under torchrun)."""
        return self.call(world, measure_rank, spec, variant, steps, emulate, self.device)

    def call(self, world: int, fn: Any, *args: Any) -> list[RankResult]:
        """``fn(rank, world, *args)`` on every rank; every rank's result (on every rank under
        torchrun)."""
        if not self.torchrun:
            return run_ranks(fn, world, *args, timeout=self.timeout, backend=self.backend,
                             bind_cpus=self.binds(world))
        import torch.distributed as dist

        rank = dist.get_rank()
        try:
            mine = RankResult(rank, True, fn(rank, world, *args))
        except Exception as exc:  # every rank learns every rank's failure
            mine = RankResult(rank, False, error_type=type(exc).__name__, message=str(exc))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        return gathered


def run_variant(spec: str, world: int, variant: Variant, launch: Launch, rounds: list[int], warmup: int,
                emulate: float | None, round_index: int, pooled: dict) -> None:
    """One round of ``variant``: warm-up plus ``rounds[round_index]`` measured iterations, pooled
    into ``pooled`` (seconds, first loss from round 0, peak memory per rank, or an error)."""
    if "error" in pooled:
        return
    results = launch.run(world, variant, spec, warmup + rounds[round_index], emulate)
    failed = [r for r in results if not r.ok]
    if failed:
        # Report the rank that failed first, not the ones that lost their connection to it.
        first = min(failed, key=lambda r: (PEER_BUILD_FAILED in r.message or "closed by peer" in r.message
                                           or "PeerError" in r.error_type, r.rank))
        pooled.clear()
        pooled["error"] = f"rank {first.rank}: {first.error_type}: {first.message}"
        return
    steps = warmup + rounds[round_index]
    # Iteration i's time: the mean over the working ranks of the time between their returns
    # from iterations i - 1 and i. The ranks wait on each other every iteration (the loss sum,
    # the gradients' collectives, the pipeline's transfers), so none runs ahead and over a
    # round each rank's sum is the round's length; the first interval (from the barrier) is a
    # warm-up one.
    working = [r for r in results if not r.value.get("idle")] or results
    seconds = [statistics.fmean(r.value["seconds"][i] for r in working) for i in range(steps)]
    pooled.setdefault("iteration_seconds", []).extend(seconds[warmup:])
    if round_index == 0:
        losses = [r.value["losses"][0] for r in results if r.value["losses"][0] == r.value["losses"][0]]
        pooled["first_loss"] = losses[0] if losses else float("nan")
    peaks = [r.value["peak_memory"] for r in results]
    pooled["peak_memory_bytes"] = [max(a, b) for a, b in zip(pooled.get("peak_memory_bytes", peaks), peaks)]
    pooled["median_seconds"] = statistics.median(pooled["iteration_seconds"])


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def _launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def calibrate(worlds: list[int], launch: Launch, emulated: bool = False) -> dict[int, dict[str, float]]:
    """The device description's measured figures (graphpipe.calibration), each measured with as
    many ranks at once as the runs it describes: the link, the runtime's per-instruction and
    per-step costs, the collective link (fitted to real all-reduces), and (reported only) one
    gradient bucket's all-reduce. ``emulated``: the runs emulate compute by waits, and the
    dispatch is measured between such waits."""
    from graphpipe.calibration import EMULATED_WAIT, link, runtime_costs

    # Emulated runs' ranks sleep between instructions and pay the late wake-ups: the dispatch is
    # measured between waits too (graphpipe/calibration.py, EMULATED_WAIT).
    wait = EMULATED_WAIT if emulated else 0.0
    calibration: dict[int, dict[str, float]] = {}
    for world in worlds:
        # A torchrun launch of one process has no pair of its own ranks to time a link between:
        # it is measured on two spawned ranks, as a spawned launch does at any world size.
        # Bound as the runs will be, so that the figures describe them.
        latency, bandwidth = link(concurrency=world, in_group=launch.torchrun and world > 1, device=launch.device,
                                  bind_cpus=launch.binds(max(2, world)))
        costs = runtime_costs(world, in_group=launch.torchrun, device=launch.device, wait=wait,
                              bind_cpus=launch.binds(world))
        calibration[world] = {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                              "instruction_overhead_seconds": costs.instruction_overhead_seconds,
                              "step_overhead_seconds": costs.step_overhead_seconds,
                              "bucket_all_reduce_seconds": costs.bucket_all_reduce_seconds,
                              "collective_latency_seconds": costs.collective_latency_seconds,
                              "collective_bandwidth_bytes_per_second": costs.collective_bandwidth_bytes_per_second,
                              "extra_tensor_seconds": costs.extra_tensor_seconds,
                              "collective_overlap_loss": costs.collective_overlap_loss,
                              "optimizer_tensor_seconds": dict(costs.optimizer_tensor_seconds),
                              "rank_skew_fraction": costs.rank_skew_fraction,
                              "dispatch_wait_seconds": wait}
        if launch.rank == 0:
            extra = ("-" if costs.extra_tensor_seconds is None
                     else f"{costs.extra_tensor_seconds * 1e6:.0f} us")
            print(f"calibration, {world} ranks at once: link latency {latency * 1e6:.0f} us ({extra} per extra "
                  f"tensor), bandwidth {bandwidth / 1e9:.2f} GB/s, runtime {costs.instruction_overhead_seconds * 1e6:.0f} us per "
                  f"instruction{' (between emulated waits)' if wait else ''} and "
                  f"{costs.step_overhead_seconds * 1e3:.2f} ms per step, an all-reduce beside compute costs it "
                  f"{costs.collective_overlap_loss:.2f}x its time, the SGD step "
                  f"{costs.optimizer_tensor_seconds.get(RUN_OPTIMIZER, 0.0) * 1e6:.1f} us per parameter tensor, the slowest rank "
                  f"{costs.rank_skew_fraction:.3f} s per second of compute", file=sys.stderr)
    return calibration


# ---- the job: measure every variant, interleaved ------------------------------------------

def run_job(job: Job, args: argparse.Namespace, launch: Launch, calibration: dict[str, float], rounds: list[int],
            mode: str, bar: Any) -> list[dict]:
    """Plans ``job`` (rank 0; under torchrun the others receive the plans), times its variants
    in interleaved rounds, and returns one report row per variant."""
    batch = build_model(job.spec)[1][0].shape[0]
    shared: list[Any] = [None]
    if launch.rank == 0:
        profile_batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= batch)
        planned = make_variants(job, profile_batches, calibration, args.device, args.gpu_kind, args.slowdown,
                                args.variants == "all")
        shared = [(*planned, reference_losses(job.spec, 1)[0])]
    if launch.torchrun:
        import torch.distributed as dist

        dist.broadcast_object_list(shared, src=0)
    variants, plans, limit, reference = shared[0]
    runnable: list[Variant | None] = [v for v in variants if not v.unavailable]
    graphpipe_runs = {v.run.plan_key: v.run for v in runnable if v and isinstance(v.run, GraphpipeRun)}
    # Measured runs also profile in every round, in its order (None below; profiles_beside.py).
    beside = BesideProfiles() if not args.emulate and graphpipe_runs else None
    if beside is not None:
        beside.sizes = shard_sizes((plans[k]["micro_batch_size"], plans[k]["replicas"]) for k in graphpipe_runs)
        runnable.append(None)
    bar.total += len(runnable) * len(rounds)
    label = f"{job.model} x{job.world} {'limit' if limit else 'no limit'}"
    results: dict[str, dict] = {v.name: {} for v in variants}
    # A B C, C B A, A B C, ...: the machine drifts over minutes, and a fixed order keeps the first
    # and the last variant a whole round apart every time; with the order reversed every other
    # round, an even number of rounds gives every variant the same mean position, so a steady
    # drift hits all alike.
    for round_index in range(len(rounds)):
        for variant in runnable if round_index % 2 == 0 else runnable[::-1]:
            bar.set_postfix_str(f"{label} {variant.name if variant else 'profile'} (round {round_index + 1})")
            if variant is None and beside is not None:
                beside.take(launch.call(job.world, profile_rank, job.spec, beside.sizes, args.device))
            elif variant is not None:
                run_variant(job.spec, job.world, variant, launch, rounds, args.warmup,
                            1.0 if args.emulate else None, round_index, results[variant.name])
            bar.update(1)
    if beside is not None and launch.rank == 0:
        beside.price(job.spec, graphpipe_runs, plans)
    rows = [report_row(job, v, results[v.name], results, plans, limit, reference, batch, mode, args) for v in variants]
    if "bucket_all_reduce" in plans:
        for row in rows:
            row["bucket_all_reduce"] = plans["bucket_all_reduce"]
    return rows


@dataclass
class BesideProfiles:
    """A measured job's profiles beside its runs (profiles_beside.py): the rounds' profiles, and
    after the rounds each graphpipe plan priced on their median (into the plans' figures)."""

    sizes: list[int] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    error: str = ""

    def take(self, results: list[RankResult]) -> None:
        failed = [r for r in results if not r.ok]
        if failed:
            self.error = self.error or f"rank {failed[0].rank}: {failed[0].error_type}: {failed[0].message[:200]}"
        else:
            self.rounds.append(results[0].value)

    def price(self, spec: str, runs: dict[str, GraphpipeRun], plans: dict) -> None:
        """Each plan of ``runs`` simulated on the profiles, under the description it was
        planned with, into ``plans[key]["beside"]`` (or why not)."""
        if self.error or not self.rounds:
            for key in runs:
                plans[key]["beside"] = {"unavailable": self.error or "no profile"}
            return
        # One trace and profile per device description (a job's plans share one): the model is
        # traced and the rounds' median set once, not once per plan.
        by_devices: dict[str, dict[str, tuple[str, str]]] = {}
        for key, run in runs.items():
            by_devices.setdefault(json.dumps(plans[key]["devices"], sort_keys=True), {})[key] = (run.plan_json,
                                                                                               run.schedule)
        for description, group in by_devices.items():
            priced = simulate_beside(spec, self.rounds, group, graphpipe.Devices.from_json(description),
                                     RUN_OPTIMIZER)
            for key in group:
                plans[key]["beside"] = priced[key]


def report_row(job: Job, variant: Variant, r: dict, results: dict[str, dict], plans: dict,
               limit: float | None, reference: float, batch: int, mode: str, args: argparse.Namespace) -> dict:
    row = {"model": job.model, "spec": job.spec, "world": job.world, "variant": variant.name, "mode": mode,
           "emulated": bool(args.emulate), "device": args.device, "batch": batch, "regime": regime(limit),
           "memory_limit_bytes": limit, "micro_batches": variant.micro_batches, "depth": variant.depth or None,
           "model_memory_bytes": variant.memory_bytes, **r}
    if variant.unavailable:
        row["unavailable"] = variant.unavailable
    if isinstance(variant.run, DataParallelRun) and args.emulate:
        e = variant.run.emulation
        row["emulation"] = ({"segments": len(e.segments), "forward_seconds": e.forward_seconds,
                             "backward_seconds": e.backward_seconds, "optimizer_seconds": e.optimizer_seconds}
                            if hasattr(e, "segments") else {"error": str(e)})
    if "median_seconds" in r:
        row["samples_per_second"] = batch / r["median_seconds"]
        row["spread"] = [batch / max(r["iteration_seconds"]), batch / min(r["iteration_seconds"])]
        # Emulated stages compute nothing: their losses are meaningless, so not checked.
        row["loss_matches_reference"] = None if args.emulate else (
            abs(r["first_loss"] - reference) <= 1e-4 * max(1.0, abs(reference)))
        for other in BASELINES:
            if results.get(other, {}).get("median_seconds"):
                row[f"speedup_vs_{other}"] = results[other]["median_seconds"] / r["median_seconds"]
    if isinstance(variant.run, GraphpipeRun):
        # The plan itself (stage times included), so the simulator's figures can be
        # recomputed from the report alone, e.g. with another machine model.
        plan = row["plan"] = dict(plans[variant.run.plan_key], json=json.loads(variant.run.plan_json),
                                  schedule=variant.run.schedule)
        if "median_seconds" in r:
            plan["simulator_error"] = r["median_seconds"] / plan["simulated_iteration_seconds"] - 1.0
            beside = plan["beside"] = dict(plan.get("beside", {}))  # this row's, not the plan's
            if "simulated_iteration_seconds" in beside:
                beside["simulator_error"] = r["median_seconds"] / beside["simulated_iteration_seconds"] - 1.0
    return row


def reference_losses(spec: str, steps: int) -> list[float]:
    model, _, data = seeded_batches(spec, steps)
    return reference_training(model, data, default_loss(spec), LR)


def resolve_defaults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fills the mode-dependent defaults: emulated on CPU unless --no-emulate (never on CUDA),
    then the models, world sizes, memory limits, slowdown and rounds of that mode."""
    if args.emulate is None:
        args.emulate = args.device == "cpu"
    if args.models is None:
        args.models = list(DEFAULT_EMULATED_MODELS) if args.emulate else list(BENCH_SPECS)
    if args.world is None:
        args.world = [DEFAULT_EMULATED_WORLD if args.emulate else DEFAULT_MEASURED_WORLD]
    if args.memory_limit is None:
        args.memory_limit = list(DEFAULT_EMULATED_LIMITS if args.emulate else DEFAULT_MEASURED_LIMITS)
    if args.slowdown is None:
        args.slowdown = DEFAULT_SLOWDOWN if args.emulate else 1.0
    if args.rounds is None:
        args.rounds = DEFAULT_EMULATED_ROUNDS if args.emulate else DEFAULT_MEASURED_ROUNDS


def split_steps(steps: int, rounds: int) -> list[int]:
    """Measured iterations per round: ``steps`` spread over ``rounds`` (at least 1 each)."""
    rounds = max(1, min(rounds, steps))
    return [steps // rounds + (1 if i < steps % rounds else 0) for i in range(rounds)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None,
                        help=f"names in BENCH_SPECS or model specs (default: {' '.join(DEFAULT_EMULATED_MODELS)} "
                             f"emulated, all of BENCH_SPECS with --no-emulate)")
    parser.add_argument("--world", type=int, nargs="+", default=None,
                        help=f"world sizes (default {DEFAULT_EMULATED_WORLD} emulated, {DEFAULT_MEASURED_WORLD} with "
                             "--no-emulate; under torchrun, the launched world)")
    parser.add_argument("--memory-limit", nargs="+", default=None,
                        help="per-rank memory limits of the cost model, a job each: none, auto (memory-bound: "
                             "90%% of the whole model's parameters, gradients and optimizer state) or a size such as "
                             "30MiB (default: "
                             f"{' '.join(DEFAULT_EMULATED_LIMITS)} emulated, {' '.join(DEFAULT_MEASURED_LIMITS)} "
                             "with --no-emulate)")
    parser.add_argument("--variants", default="main", choices=["main", "all"],
                        help="main: graph+dp, sequential+dp, graphpipe's V rows (V zb, graph V), torch pipelining, "
                             "FSDP2, DDP; all: also graphpipe's plain pipelines and torch's GPipe")
    parser.add_argument("--steps", type=int, default=24, help="measured iterations per variant, over all rounds")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds per variant, each with its own warm-up (default "
                             f"{DEFAULT_EMULATED_ROUNDS} emulated, {DEFAULT_MEASURED_ROUNDS} with --no-emulate)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up iterations per round")
    parser.add_argument("--size", default="bench", choices=["bench", "small", "paper"],
                        help="model sizes: the benchmark sizes (default), the test sizes, or the paper's")
    parser.add_argument("--emulate", action=argparse.BooleanOptionalAction, default=None,
                        help="stage compute replaced by profiled waits (CPU); the default on CPU, "
                             "--no-emulate measures real compute")
    parser.add_argument("--slowdown", type=float, default=None,
                        help=f"emulated runs: devices this many times slower than this CPU core (default "
                             f"{DEFAULT_SLOWDOWN:g}: longer waits, so the ranks' own CPU work weighs less)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cpu: Gloo CPU ranks (default); cuda: one GPU per rank, NCCL")
    parser.add_argument("--gpu-kind", default="h100", help="device preset the planner uses with --device cuda")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before giving up")
    parser.add_argument("--bind-cpus", action=argparse.BooleanOptionalAction, default=True,
                        help="bind each spawned CPU rank to a core of its own where the ranks are no more than the "
                             "cores (default: on; not under torchrun)")
    parser.add_argument("--out", default="results/compare.json")
    parser.add_argument("--png", default="results/compare.png")
    args = parser.parse_args()
    resolve_defaults(args, parser)
    if args.device == "cuda" and args.emulate:
        parser.error("--emulate replaces compute by CPU waits; use it with --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to this process")
    if args.slowdown != 1.0 and not args.emulate:
        parser.error("--slowdown applies to --emulate runs only")
    if args.slowdown < 1.0:
        parser.error("--slowdown must be at least 1")
    return args


def start(args: argparse.Namespace) -> Launch:
    """This process's launch: spawned ranks per run, or the torchrun group (joined here)."""
    torch.set_num_threads(1)
    keep_freed_memory()  # the profiles rank 0 takes see the same allocator as the runs
    launch = Launch(_launched_by_torchrun(), args.device, args.timeout, args.bind_cpus)
    if launch.torchrun:
        import datetime

        import torch.distributed as dist

        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(launch.backend, timeout=datetime.timedelta(seconds=args.timeout))
        args.world = [dist.get_world_size()]
    return launch


def jobs(args: argparse.Namespace) -> list[Job]:
    out = []
    for name in args.models:
        spec = BENCH_SPECS.get(name, name) if args.size == "bench" or ":" in name else f"{name}:size={args.size}"
        for world in sorted(set(args.world)):
            for limit in args.memory_limit:
                out.append(Job(name, spec, world, None if limit.lower() == "none" else limit))
    return out


def main() -> None:
    args = parse_args()
    mode = ("emulated" + (f", devices {args.slowdown:g}x slower than this core" if args.slowdown != 1.0 else "")
            if args.emulate else "measured")
    launch = start(args)
    calibration = calibrate(sorted(set(args.world)), launch, emulated=bool(args.emulate))
    rounds = split_steps(args.steps, args.rounds)
    from tqdm import tqdm

    bar = tqdm(total=0, desc=f"compare ({mode})", unit="run", file=sys.stderr, disable=launch.rank != 0)
    rows = [row for job in jobs(args)
            for row in run_job(job, args, launch, calibration[job.world], rounds, mode, bar)]
    bar.close()
    if launch.rank == 0:
        print_table(rows, mode)
        write_json(rows, args, mode, launch, rounds, calibration)
        write_png(rows, Path(args.png), mode)
    if launch.torchrun:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


# ---- reporting ---------------------------------------------------------------------------

def write_json(rows: list[dict], args: argparse.Namespace, mode: str, launch: Launch, rounds: list[int],
               calibration: dict) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "compare", "mode": mode, "device": args.device, "machine": platform.platform(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "commit": git_commit(),
        "launch": "torchrun" if launch.torchrun else "spawn", "bind_cpus": launch.bind_cpus,
        "slowdown": args.slowdown, "steps": args.steps,
        "rounds": rounds, "warmup": args.warmup, "calibration": calibration, "rows": rows,
        "verdict": verdict(rows)}, indent=1))
    print(f"wrote {out}")


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.3g}"


def print_table(rows: list[dict], mode: str) -> None:
    """The markdown table (one row per model, world size, memory limit and variant, with its
    mode, plan depth and memory per rank), then the notes (what emulation replaced, parity
    checks, the simulator's errors) and the verdict lines."""
    print(f"\n### graph pipelines vs sequential pipelines, FSDP2 and DDP ({mode}; samples/s, median of measured "
          "iterations)\n")
    vs = " | ".join(f"vs {b}" for b in BASELINES)
    print(f"| model | ranks | memory | variant | mode | depth | M | samples/s (min-max) | {vs} | loss ok | "
          "cost model MiB/rank | peak RSS MiB/rank |")
    print("|" + "---|" * (11 + len(BASELINES)))
    for r in rows:
        row_mode = "emulated" if r.get("emulated") else "measured"
        depth = "-" if not r.get("depth") else ("1 (dp)" if r["variant"] in ("torch/ddp", "torch/fsdp2")
                                                else r["depth"])
        head = (f"| {r['model']} | {r['world']} | {r.get('regime', '-')} | {r['variant']} | {row_mode} | {depth} | "
                f"{r['micro_batches']} |")
        model_memory = _mib(r.get("model_memory_bytes"))
        blank = " - |" * (len(BASELINES) + 1)
        if "unavailable" in r or "error" in r:
            text = r.get("unavailable") or f"failed: {r['error'][:80]}"
            print(f"{head} {text} |{blank} {model_memory} | - |")
            continue
        ratios = " | ".join(f"{r[f'speedup_vs_{b}']:.2f}x" if f"speedup_vs_{b}" in r else "-" for b in BASELINES)
        print(f"{head} {r['samples_per_second']:.1f} ({r['spread'][0]:.1f}-{r['spread'][1]:.1f}) | {ratios} | "
              f"{ {True: 'yes', False: 'NO', None: 'n/a'}[r['loss_matches_reference']] } | {model_memory} | "
              f"{max(r['peak_memory_bytes']) / MIB:.0f} |")
    if any(r.get("emulated") for r in rows):
        slower = mode.partition(", ")[2]
        print("- emulated rows: each pipeline stage's forward and backward (torch/ddp, torch/fsdp2: each rank's "
              "whole model on its 1/ranks of the batch, per parameter segment) and each optimizer step are waits "
              "of the cost model's profiled times" + (f" ({slower})" if slower else "") + "; every transfer, "
              "all-reduce, all-gather, reduce-scatter and schedule is real; losses are not checked; the peak RSS "
              "is the whole process's (torch included), with no real activations")
    print("- cost model MiB/rank: parameters, gradients, optimizer state (Adam, as the planner prices it) and "
          "activations of the rank's largest stage; FSDP2: 1/ranks of the static state, the whole model's "
          "activations at one micro-batch (M) of its shard of the batch, and its largest layer unsharded")
    _print_plan_notes(rows, mode)
    for line in verdict(rows):
        print(line)


def _print_plan_notes(rows: list[dict], mode: str) -> None:
    """Where graph+dp and sequential+dp are the same shape and simulated within 2%, a parity
    note; and the simulator's prediction beside every graphpipe row's time."""
    plans = {(r["model"], r["world"], r.get("regime", "-"), r["variant"]): r["plan"] for r in rows if "plan" in r}
    for (model, world, limit, variant), graph in plans.items():
        seq = plans.get((model, world, limit, variant.replace("/graph", "/sequential", 1)))
        if not variant.startswith("graphpipe/graph") or "zb" in variant or seq is None:
            continue
        if (graph["depth"], graph["micro_batches"]) == (seq["depth"], seq["micro_batches"]) and \
                abs(graph["simulated_iteration_seconds"] / seq["simulated_iteration_seconds"] - 1) <= 0.02:
            print(f"- {model} x{world}, {limit}: both plans are {graph['depth']} deep with {graph['micro_batches']} "
                  f"micro-batches and simulated within 2% of each other: {variant} vs its sequential "
                  "counterpart is a parity check, its ratio the noise of this machine")
        elif graph["depth"] < seq["depth"]:
            print(f"- {model} x{world}, {limit}: the graph plan is shallower than the sequential one (depth "
                  f"{graph['depth']} against {seq['depth']})")
    short = mode.split(",")[0]
    errors: list[float] = []
    beside_errors: list[float] = []
    print(f"\n#### the simulator (with the measured runtime costs) vs {short}\n")
    print(f"| model | ranks | memory | variant | plan | {short} ms | simulated ms | simulated off by | "
          "simulated on the profiles beside the runs, ms | off by |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "plan" in r and "median_seconds" in r:
            p = r["plan"]
            error = p["simulated_iteration_seconds"] / r["median_seconds"] - 1.0
            errors.append(error)
            beside = p.get("beside", {})
            if "simulated_iteration_seconds" in beside:
                beside_errors.append(beside["simulated_iteration_seconds"] / r["median_seconds"] - 1.0)
                again = f"{1e3 * beside['simulated_iteration_seconds']:.1f} | {100 * beside_errors[-1]:+.1f}%"
            else:
                again = f"{beside.get('unavailable', 'not profiled (emulated compute)')} | -"
            print(f"| {r['model']} | {r['world']} | {r.get('regime', '-')} | {r['variant']} | {p['partitioner']}, "
                  f"{p['stages']} stages, replicas {p.get('replicas', '-')}, depth {p['depth']}, "
                  f"{p['micro_batches']} x {p['micro_batch_size']}, {p.get('schedule', '1f1b')} | "
                  f"{1e3 * r['median_seconds']:.1f} | "
                  f"{1e3 * p['simulated_iteration_seconds']:.1f} | {100 * error:+.1f}% | {again} |")
    for what, found in (("", errors), (" on the profiles beside the runs", beside_errors)):
        if found:
            print(f"- simulator{what} vs {short}: within 10% in {sum(abs(e) <= 0.10 for e in found)} of "
                  f"{len(found)} runs, within 20% in {sum(abs(e) <= 0.20 for e in found)}, worst "
                  f"{100 * max(found, key=abs):+.1f}%")
    buckets = {(r["world"], json.dumps(r["bucket_all_reduce"])) for r in rows if "bucket_all_reduce" in r}
    for world, text in sorted(buckets):
        b = json.loads(text)
        print(f"- one 1 MiB gradient bucket's all-reduce over {world} ranks: measured {1e3 * b['measured_seconds']:.1f} "
              f"ms, priced by the cost model (from the collective link fitted to real all-reduces) at "
              f"{1e3 * b['priced_seconds']:.1f} ms, from the point-to-point links alone at "
              f"{1e3 * b.get('priced_from_links_seconds', float('nan')):.1f} ms")


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["world"], r.get("regime", "-")), []).append(r)
    return groups


def verdict(rows: list[dict]) -> list[str]:
    """Per model, world size and memory limit: the fastest variant that fits (has a number), and
    graph+dp's ratio over the best non-graphpipe variant."""
    lines = []
    for (model, world, limit), group in _groups(rows).items():
        timed = [r for r in group if "samples_per_second" in r]
        if not timed:
            continue
        best = max(timed, key=lambda r: r["samples_per_second"])
        line = (f"**verdict, {model} x{world}, {limit}**: fastest that fits: {best['variant']} "
                f"({best['samples_per_second']:.1f} samples/s)")
        ours = next((r for r in timed if r["variant"] == "graphpipe/graph+dp"), None)
        others = [r for r in timed if not r["variant"].startswith("graphpipe/")]
        if ours and others:
            rival = max(others, key=lambda r: r["samples_per_second"])
            line += (f"; graphpipe/graph+dp {ours['samples_per_second'] / rival['samples_per_second']:.2f}x the best "
                     f"non-graphpipe variant ({rival['variant']})")
        if ours:
            # The replicated planner's pick (with its schedule) against the fastest measured.
            off = best["samples_per_second"] / ours["samples_per_second"] - 1.0
            line += (f"; the planner's pick (graphpipe/graph+dp) is {'within' if off <= 0.05 else 'NOT within'} 5% "
                     f"of the fastest ({100 * off:.1f}% slower)")
        unfit = [r["variant"] for r in group if r.get("unavailable", "").startswith("does not fit")]
        if unfit:
            line += f"; does not fit: {', '.join(unfit)}"
        lines.append(line)
    return lines


def write_png(rows: list[dict], path: Path, mode: str) -> None:
    """One panel per model, world size and memory limit: each variant's throughput relative to
    graphpipe/sequential+dp (1.0 drawn as a line), graphpipe's simulated ratio as a marker,
    variants without a number named with the reason."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(6.2 * len(groups), 4.6), squeeze=False)
    for ax, ((model, world, limit), group) in zip(axes[0], groups.items()):
        ref = next((r for r in group if r["variant"] == CHART_REFERENCE and "samples_per_second" in r), None)
        timed = [r for r in group if "samples_per_second" in r]
        base = ref["samples_per_second"] if ref else max((r["samples_per_second"] for r in timed), default=1.0)
        names = [r["variant"] for r in group][::-1]
        for y, r in enumerate(group[::-1]):
            if "samples_per_second" not in r:
                reason = (r.get("unavailable") or "failed").split(" (")[0]
                ax.text(0.02, y, reason if len(reason) < 64 else reason[:61] + "...", va="center", fontsize=7,
                        color="dimgray", transform=ax.get_yaxis_transform())
                continue
            ratio = r["samples_per_second"] / base
            ax.barh(y, ratio, color="tab:blue" if r["variant"].startswith("graphpipe/") else "tab:orange")
            ax.text(ratio, y, f" {ratio:.2f}", va="center", fontsize=8)
            plan = r.get("plan", {})
            ref_plan = (ref or {}).get("plan", {})
            key = "simulated_iteration_seconds"
            if plan.get(key) and ref_plan.get(key):
                ax.plot(ref_plan[key] / plan[key], y, "kd", markersize=5)
        ax.axvline(1.0, color="black", linewidth=1, linestyle="--")
        ax.set_ylim(-0.6, len(names) - 0.4)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
        ax.set_xlim(0, max([1.2] + [1.15 * r["samples_per_second"] / base for r in timed]))
        ax.set_xlabel(f"throughput relative to {CHART_REFERENCE if ref else 'the fastest'} (higher is better)",
                      fontsize=8)
        ax.set_title(f"{model}, {world} ranks, {limit}", fontsize=9)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color="tab:blue", label=f"graphpipe ({mode.split(',')[0]})"),
               Patch(color="tab:orange", label=f"torch ({mode.split(',')[0]})"),
               Line2D([], [], color="black", marker="d", linestyle="", label="graphpipe, simulated"),
               Line2D([], [], color="black", linestyle="--", label=f"1.0 = {CHART_REFERENCE}")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Training throughput per variant ({mode})", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
