"""The main job: throughput of graph pipelines against sequential pipeline baselines.

For each model and world size, in one invocation, with the same global batch, optimizer (SGD),
dtype (float32) and number of ranks:

  graphpipe/graph        graphpipe's runtime on the ``graphpipe`` partitioner's plan (a DAG)
  graphpipe/sequential   graphpipe's runtime on the ``sequential`` plan (a chain, skip tensors
                         relayed through the stages in between)
  graphpipe/graph zb     the graph plan under the zero-bubble schedule ``zb_graph`` (every
                         backward split into its input- and weight-gradient halves)
  torch/1f1b, torch/gpipe
                         PyTorch's torch.distributed.pipelining (Schedule1F1B, ScheduleGPipe),
                         the model cut at the sequential plan's cut points, at the sequential
                         plan's micro-batch count (and at the graph plan's, marked "@graph M")
  torch/ddp              plain data parallelism, torch's DistributedDataParallel: every rank the
                         whole model on 1/world of the batch (baselines/torch_ddp.py)
  graphpipe/graph+dp, graphpipe/sequential+dp
                         graphpipe's runtime on plans with replicated stages
                         (graphpipe.plan(..., replicate=True)); reported as "not available in
                         this build" where graphpipe.plan takes no ``replicate``

Every variant is measured in ``--rounds`` interleaved rounds (variant A, B, C, D, then A, B, C,
D again, ...), each on freshly spawned ranks (Gloo on CPU, one torch thread each) or, under
``torchrun``, on the launched ranks: warm-up iterations, then measured ones, pooled over the
rounds. Interleaving spreads the machine's slow drifts over all variants alike, so the ratios
compare like with like. We report samples/s (median and min-max spread), peak memory per rank
(resident memory on CPU, allocated memory on GPU), and ratios to each baseline, and check that
every variant's first-step loss equals single-process training's. Plans are made once, on rank
0, from a profiled graph (graphpipe.profile at several batch sizes on this machine), with the
same memory limit for every partitioner. Output: a markdown table on stdout, JSON (machine,
torch, commit, every figure) and a PNG chart.

``--emulate`` (the default on CPU; ``--no-emulate`` measures real compute) replaces each stage's
compute by a wait of its profiled duration (transfers stay real), so that 4 to 16 ranks fit on
a small machine; every output of that mode says "emulated" (the table has a mode column), and
the measured iteration time is compared with the simulator's. Emulated DDP ranks wait the
same cost model's time for the whole model at their shard of the batch, split over the
parameter segments so that DDP's real gradient all-reduces overlap the backward as usual. The optimizer
step is emulated too: after each iteration a rank waits for its stage's simulated optimizer
step (the emulated zero gradients would make the real one free, where the simulator charges it).

``--device cuda`` runs every rank on its own GPU with NCCL (profiling on the GPU too, planning
with the ``--gpu-kind`` preset and the measured links).

    python benchmarks/compare.py        # defaults: MMT, 4 emulated ranks 4x slower than a core
    python benchmarks/compare.py --models mmt dlrm candle_uno
    python benchmarks/compare.py --no-emulate             # measured: 4 models, 2 CPU ranks
    python benchmarks/compare.py --no-emulate --models candle_uno --world 2 3 --steps 10
    python benchmarks/compare.py --emulate --world 4 8
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

import graphpipe  # noqa: E402
from graphpipe.models import build_model, default_loss  # noqa: E402
from graphpipe.runtime.testing import RankResult, reference_training, run_ranks, seeded_batches  # noqa: E402

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
PEER_BUILD_FAILED = "a peer rank could not build this variant"
#: The ratio columns of the table: graphpipe/graph and every other variant against these.
BASELINES = ("graphpipe/sequential", "torch/1f1b", "torch/gpipe", "torch/ddp")

#: The default run (the main job): emulated ranks, at a size where the graph planner cuts a
#: shallower pipeline than the sequential one (MMT at 4 ranks: depth 3 against 4), beside DLRM,
#: whose large embedding gradients make data parallelism pay for its all-reduce (both plans 4
#: deep at this size in the latest runs of docs/results.md), in under 6 minutes on a 2-core
#: machine. --no-emulate runs the measured 2-rank comparison of all of BENCH_SPECS instead.
DEFAULT_EMULATED_MODELS = ("mmt",)
DEFAULT_EMULATED_WORLD = 4
DEFAULT_MEASURED_WORLD = 2
DEFAULT_SLOWDOWN = 4.0
# Every round of every variant spawns its ranks afresh (about 10 s for 4 ranks on 2 busy
# cores): 2 rounds keep the default run within 6 minutes there, still interleaved.
DEFAULT_EMULATED_ROUNDS = 2
DEFAULT_MEASURED_ROUNDS = 3


#: The variants that need replicated stages (``graphpipe.plan(..., replicate=True)``).
REPLICATED_VARIANTS = {"graphpipe/graph+dp": "graphpipe", "graphpipe/sequential+dp": "sequential"}


@dataclass
class Variant:
    """One way of training the model that compare.py times: a runtime and what it runs."""

    name: str
    runtime: str  # "graphpipe", "torch" (pipelining) or "ddp" (torch DistributedDataParallel)
    plan_json: str | None = None
    schedule: str = "1f1b"
    micro_batches: int = 1
    labels: dict[str, int] = field(default_factory=dict)
    num_stages: int = 0
    note: str = ""
    # Emulation: per stage, the simulated optimizer step, which the emulated runs wait for too
    # (their zero gradients would make the real step free, where the simulator charges it).
    optimizer_seconds: list[float] = field(default_factory=list)
    # Which plan (a key of make_variants' plan info) a graphpipe variant runs.
    plan_key: str = ""
    # Pipeline depth (stages on the longest path); 1 for data parallelism.
    depth: int = 0
    # Emulated DDP: the cost model's waits (baselines.torch_ddp.DDPEmulation), or why there are none.
    ddp_emulation: Any = None
    # Set when this build cannot run the variant: the reason, printed instead of a number.
    unavailable: str = ""


# ---- per-rank work -------------------------------------------------------------------------

def _rank_device(device: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _graphpipe_stepper(spec: str, variant: Variant, model: Any, inputs: Any, emulate: float | None,
                       device: torch.device) -> Any:
    pipe = graphpipe.wrap(model.to(device), inputs, default_loss(spec), plan=variant.plan_json,
                          schedule=variant.schedule, device=device)
    if emulate is not None:
        from graphpipe.runtime.emulate import emulate_stage

        emulate_stage(pipe, scale=emulate)
    params = list(pipe.parameters())
    optimizer: Any = torch.optim.SGD(params, lr=LR) if params else None
    if emulate is not None and pipe._stage is not None:
        optimizer = _EmulatedOptimizer(optimizer, _optimizer_wait(variant, pipe._stage.index))

    def step(x: Any, y: Any) -> float:
        # optimizer= steps it as soon as this rank's part is done (before the loss broadcast)
        return float(pipe.step(x, y, optimizer=optimizer))

    return step


def _optimizer_wait(variant: Variant, stage: int) -> float:
    return variant.optimizer_seconds[stage] if stage < len(variant.optimizer_seconds) else 0.0


class _EmulatedOptimizer:
    """Emulation: the real optimizer's step (free on zero gradients), then a wait of the stage's
    simulated optimizer step."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner, self.seconds = inner, seconds

    def step(self) -> None:
        from graphpipe.runtime.emulate import wait

        if self.inner is not None:
            self.inner.step()
        wait(self.seconds)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.inner is not None:
            self.inner.zero_grad(set_to_none=set_to_none)


def _with_emulated_optimizer(step: Any, variant: Variant, stage: int) -> Any:
    """``step`` followed by a wait of the stage's simulated optimizer step (emulation)."""
    from graphpipe.runtime.emulate import wait

    seconds = _optimizer_wait(variant, stage)

    def emulated(x: Any, y: Any) -> float:
        loss = step(x, y)
        wait(seconds)
        return loss

    return emulated


def _torch_stepper(rank: int, world: int, spec: str, variant: Variant, model: Any, inputs: Any,
                   emulate: float | None,
                   device: torch.device) -> Any:
    import torch.distributed as dist

    from baselines.torch_pipelining import chain_stage_modules, make_stepper, pin_integer_consumers, stage_examples
    from graphpipe.trace import trace_module

    k = variant.num_stages
    group = dist.new_group(list(range(k))) if k < world else None  # collective: every rank calls it
    if rank >= k:  # more ranks than chain stages: this rank idles, joining the barriers
        return lambda x, y: float("nan")
    traced = trace_module(model, inputs)
    labels = pin_integer_consumers(traced.module, variant.labels, traced.placeholder_values)
    stages = chain_stage_modules(traced.module, labels, k)
    example = stage_examples(stages, tuple(inputs), variant.micro_batches)[rank]
    stage = stages[rank]
    if emulate is not None:  # the same waits as graphpipe's emulated stages: the sequential plan's figures
        from graphpipe.runtime.emulate import EmulatedStage

        figures = json.loads(variant.plan_json)["stages"][rank]
        stage = EmulatedStage(stage, emulate * figures["forward_seconds"], emulate * figures["backward_seconds"])
    step = make_stepper(stage, rank, k, default_loss(spec), variant.micro_batches, variant.schedule, lr=LR,
                        device=device, group=group, example=example)
    return _with_emulated_optimizer(step, variant, rank) if emulate is not None else step


def _ddp_stepper(rank: int, world: int, spec: str, variant: Variant, model: Any, inputs: Any,
                 emulate: float | None, device: torch.device) -> Any:
    """This rank's step of plain data parallelism (torch DDP, 1/world of the batch per rank).
    Emulated: the model's compute becomes the cost model's waits, per parameter segment (their
    zero gradients are all-reduced for real, overlapping the backward as DDP does), and the SGD
    step a wait of the simulated optimizer step."""
    from baselines.torch_ddp import emulated_model, make_stepper, shard_inputs

    if emulate is None:
        return make_stepper(model, rank, world, default_loss(spec), lr=LR, device=device)
    if not hasattr(variant.ddp_emulation, "segments"):
        raise RuntimeError(f"cannot emulate DDP: {variant.ddp_emulation}")
    fake = emulated_model(model, shard_inputs(tuple(inputs), rank, world), variant.ddp_emulation, scale=emulate)
    return make_stepper(fake, rank, world, default_loss(spec), lr=LR, device=device,
                        optimizer_wait=emulate * variant.ddp_emulation.optimizer_seconds)


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
    """Builds ``variant`` on this rank and runs ``steps`` iterations, each timed between two
    barriers of the whole group: {"losses", "seconds", "peak_memory"}. Every rank calls it.
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
            step = _graphpipe_stepper(spec, variant, model, inputs, emulate, dev)
        elif variant.runtime == "ddp":
            step = _ddp_stepper(rank, world, spec, variant, model, inputs, emulate, dev)
        else:
            step = _torch_stepper(rank, world, spec, variant, model, inputs, emulate, dev)
    except Exception as exc:  # noqa: BLE001 - agreed on below, then raised
        failure = exc
    # Every rank learns whether every other could build its part before any rank waits on a
    # peer: a variant that one rank refuses (torch's 1F1B with fewer micro-batches than stages)
    # then fails everywhere at once instead of leaving the others in a barrier.
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
    for x, y in data:
        dist.barrier()
        start = time.perf_counter()
        losses.append(step(x, y))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    gc.enable()
    return {"losses": losses, "seconds": seconds, "peak_memory": _peak_memory_bytes(dev)}


# ---- orchestration -------------------------------------------------------------------------

def reference_losses(spec: str, steps: int) -> list[float]:
    model, _, data = seeded_batches(spec, steps)
    return reference_training(model, data, default_loss(spec), LR)


def make_variants(spec: str, world: int, memory_limit: str | None, profile_batches: tuple[int, ...],
                  calibration: dict[str, float], device: str = "cpu", gpu_kind: str = "h100",
                  slowdown: float = 1.0) -> tuple[list[Variant], dict]:
    model, inputs = build_model(spec)
    graph = graphpipe.trace(model, inputs)
    profile_device = "cuda" if device == "cuda" else "cpu"
    graphpipe.profile(graph, model, inputs, device=profile_device, batch_sizes=profile_batches, repeats=3, warmup=1)
    latency, bandwidth = calibration["link_latency_seconds"], calibration["link_bandwidth_bytes_per_second"]
    # CPU ranks: this machine's measured throughput and memory bandwidth (the optimizer step is
    # priced by the latter; the preset's documented 5 GB/s made it 8x too slow here).
    devices = graphpipe.devices(world, gpu_kind if device == "cuda" else "cpu", measure=device != "cuda")
    devices.set_node_links(world, bandwidth, latency, bandwidth, latency)
    # An emulated device `slowdown` times slower than this core: the planner, the simulator and
    # the emulated waits (the plan's stage times and optimizer steps) all see the same, longer
    # compute and memory traffic.
    devices.relative_speed = devices.relative_speed / slowdown
    devices.memory_bandwidth = devices.memory_bandwidth / slowdown
    plans = {p: graphpipe.plan(graph, devices, p, memory_limit=memory_limit) for p in ("graphpipe", "sequential")}
    seq = plans["sequential"]
    labels = {graph.node(n).name: stage.id for stage in seq.stages for n in stage.nodes}
    variants = [
        Variant("graphpipe/graph", "graphpipe", plans["graphpipe"].to_json(graph), "1f1b",
                plans["graphpipe"].num_micro_batches, plan_key="graphpipe", depth=plans["graphpipe"].depth),
        Variant("graphpipe/graph zb", "graphpipe", plans["graphpipe"].to_json(graph), "zb_graph",
                plans["graphpipe"].num_micro_batches, plan_key="graphpipe zb", depth=plans["graphpipe"].depth),
        Variant("graphpipe/sequential", "graphpipe", seq.to_json(graph), "1f1b", seq.num_micro_batches,
                plan_key="sequential", depth=seq.depth),
        Variant("torch/1f1b", "torch", seq.to_json(graph), "1f1b", seq.num_micro_batches, labels, seq.num_stages,
                depth=seq.num_stages),
        Variant("torch/gpipe", "torch", seq.to_json(graph), "fill_drain", seq.num_micro_batches, labels,
                seq.num_stages, depth=seq.num_stages),
    ]
    graph_m = plans["graphpipe"].num_micro_batches
    if graph_m != seq.num_micro_batches:
        variants.append(Variant(f"torch/1f1b @graph M={graph_m}", "torch", seq.to_json(graph), "1f1b", graph_m,
                                labels, seq.num_stages, depth=seq.num_stages))
    batch = graph.trace_batch_size
    variants.append(Variant("torch/ddp", "ddp", micro_batches=1, depth=1,
                            ddp_emulation=ddp_emulation(graph, world, batch, device, gpu_kind, slowdown)))
    for name, key in REPLICATED_VARIANTS.items():
        replicated, reason = replicated_plan(graph, devices, key, memory_limit)
        if replicated is None:
            variants.append(Variant(name, "graphpipe", unavailable=reason))
            continue
        plans[f"{key}+dp"] = replicated
        variants.append(Variant(name, "graphpipe", replicated.to_json(graph), "1f1b", replicated.num_micro_batches,
                                plan_key=f"{key}+dp", depth=replicated.depth))
    info = {name: {"stages": p.num_stages, "depth": p.depth, "micro_batches": p.num_micro_batches,
                   "micro_batch_size": p.micro_batch_size, "partitioner": p.partitioner,
                   "predicted_iteration_seconds": p.predicted_iteration_seconds}
            for name, p in plans.items()}
    overhead = calibration["task_overhead_seconds"]
    info["graphpipe zb"] = dict(info["graphpipe"])
    kinds = {name: "1f1b" for name in plans} | {"graphpipe zb": "zb_graph"}
    for name, kind in kinds.items():
        p = plans[name.split(" ")[0]]
        result = graphpipe.simulate(p, devices, kind, task_overhead_seconds=overhead)
        info[name]["simulated_iteration_seconds"] = result.iteration_seconds
        info[name]["optimizer_seconds"] = optimizer_seconds(result, p.num_stages)
        info[name]["simulated_zero_compute_seconds"] = graphpipe.simulate(
            zero_compute(p, graph), devices, kind, task_overhead_seconds=overhead).iteration_seconds
    for v in variants:
        if v.runtime in ("graphpipe", "torch") and not v.unavailable:
            v.optimizer_seconds = info[v.plan_key or "sequential"]["optimizer_seconds"]
    return variants, info


def replicated_plan(graph: Any, devices: Any, partitioner: str, memory_limit: str | None) -> tuple[Any, str]:
    """``partitioner``'s plan with replicated stages (``graphpipe.plan(..., replicate=True)``:
    the planner may give a stage several devices, data parallel inside the stage), or None and
    why not. The hook for the ``+dp`` variants: they run once this build's ``graphpipe.plan``
    takes ``replicate``; until then they are reported as not available, never with a number."""
    import inspect

    if "replicate" not in inspect.signature(graphpipe.plan).parameters:
        return None, "not available in this build: graphpipe.plan has no replicate parameter"
    try:
        return graphpipe.plan(graph, devices, partitioner, memory_limit=memory_limit, replicate=True), ""
    except Exception as exc:  # noqa: BLE001 - the planner's refusal is the row's content
        return None, f"planning with replicate=True failed: {type(exc).__name__}: {exc}"


def ddp_emulation(graph: Any, world: int, batch: int, device: str, gpu_kind: str, slowdown: float) -> Any:
    """The waits of an emulated DDP rank, from the same cost model (and emulated device speed)
    as the pipelines' stages: the whole model planned onto one device at the largest shard
    (ceil(batch / world) rows, one micro-batch) gives the forward and backward seconds, its
    simulation the optimizer step; ``baselines.torch_ddp.emulation_segments`` spreads them over
    the parameter segments. Returns the DDPEmulation, or a string saying why there is none."""
    from baselines.torch_ddp import emulation_segments

    shard_batch = -(-batch // world)
    try:
        one = graphpipe.devices(1, gpu_kind if device == "cuda" else "cpu", measure=device != "cuda")
        one.relative_speed = one.relative_speed / slowdown
        one.memory_bandwidth = one.memory_bandwidth / slowdown
        whole = graphpipe.plan(graph, one, "sequential", batch_size=shard_batch, micro_batches=1)
        stage = json.loads(whole.to_json(graph))["stages"][0]
        optimizer = optimizer_seconds(graphpipe.simulate(whole, one), 1)[0]
        return emulation_segments(graph, shard_batch, stage["forward_seconds"], stage["backward_seconds"], optimizer)
    except Exception as exc:  # noqa: BLE001 - only the emulated DDP variant needs it
        return f"{type(exc).__name__}: {exc}"


def optimizer_seconds(result: Any, num_stages: int) -> list[float]:
    """Per stage, the duration of its optimizer step in a simulation."""
    out = [0.0] * num_stages
    for task in result.tasks:
        if task.kind == "optimizer":
            out[task.stage] = task.end - task.start
    return out


def zero_compute(plan: Any, graph: Any) -> Any:
    """The same plan with every stage's forward and backward time set to zero: what the
    simulator predicts of the runtime alone (dispatch, transfers)."""
    text = json.loads(plan.to_json(graph))
    for stage in text["stages"]:
        stage["forward_seconds"] = stage["backward_seconds"] = 0.0
        stage["backward_input_seconds"] = stage["backward_weight_seconds"] = 0.0
    return graphpipe.Plan.from_json(json.dumps(text), graph)


@dataclass
class Launch:
    """How ranks come to be: spawned by this script per run, or launched once by torchrun."""

    torchrun: bool
    device: str  # "cpu" or "cuda"
    timeout: float

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    @property
    def rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if self.torchrun else 0

    def run(self, world: int, variant: Variant, spec: str, steps: int, emulate: float | None) -> list[RankResult]:
        """``measure_rank`` on every rank; every rank's result (on every rank under torchrun)."""
        if not self.torchrun:
            return run_ranks(measure_rank, world, spec, variant, steps, emulate, self.device,
                             timeout=self.timeout, backend=self.backend)
        import torch.distributed as dist

        rank = dist.get_rank()
        try:
            mine = RankResult(rank, True, measure_rank(rank, world, spec, variant, steps, emulate, self.device))
        except Exception as exc:  # noqa: BLE001 - every rank learns every rank's failure
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
    seconds = [max(r.value["seconds"][i] for r in results) for i in range(steps)]
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


def calibrate(worlds: list[int], launch: Launch) -> dict[int, dict[str, float]]:
    """The simulator's link and dispatch figures, measured with as many ranks at once as each run."""
    from calibrate import dispatch_overhead, link

    calibration: dict[int, dict[str, float]] = {}
    for world in worlds:
        latency, bandwidth = link(concurrency=world, in_group=launch.torchrun, device=launch.device)
        overhead = dispatch_overhead(concurrency=world, in_group=launch.torchrun, device=launch.device)
        calibration[world] = {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                              "task_overhead_seconds": overhead}
        if launch.rank == 0:
            print(f"calibration, {world} ranks at once: link latency {latency * 1e6:.0f} us, bandwidth "
                  f"{bandwidth / 1e9:.2f} GB/s, runtime dispatch {overhead * 1e6:.0f} us per forward/backward",
                  file=sys.stderr)
    return calibration


def resolve_defaults(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fills the mode-dependent defaults: emulated on CPU unless --no-emulate (never on CUDA),
    then the models, world sizes and slowdown of that mode."""
    if args.emulate is None:
        args.emulate = args.device == "cpu"
    if args.models is None:
        args.models = list(DEFAULT_EMULATED_MODELS) if args.emulate else list(BENCH_SPECS)
    if args.world is None:
        args.world = [DEFAULT_EMULATED_WORLD if args.emulate else DEFAULT_MEASURED_WORLD]
    if args.slowdown is None:
        args.slowdown = DEFAULT_SLOWDOWN if args.emulate else 1.0
    if args.rounds is None:
        args.rounds = DEFAULT_EMULATED_ROUNDS if args.emulate else DEFAULT_MEASURED_ROUNDS


def split_steps(steps: int, rounds: int) -> list[int]:
    """Measured iterations per round: ``steps`` spread over ``rounds`` (at least 1 each)."""
    rounds = max(1, min(rounds, steps))
    return [steps // rounds + (1 if i < steps % rounds else 0) for i in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None,
                        help=f"names in BENCH_SPECS or model specs (default: {' '.join(DEFAULT_EMULATED_MODELS)} "
                             f"emulated, all of BENCH_SPECS with --no-emulate)")
    parser.add_argument("--world", type=int, nargs="+", default=None,
                        help=f"world sizes (default {DEFAULT_EMULATED_WORLD} emulated, {DEFAULT_MEASURED_WORLD} with "
                             "--no-emulate; under torchrun, the launched world)")
    parser.add_argument("--steps", type=int, default=24, help="measured iterations per variant, over all rounds")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"interleaved rounds per variant, each with its own warm-up (default "
                             f"{DEFAULT_EMULATED_ROUNDS} emulated, {DEFAULT_MEASURED_ROUNDS} with --no-emulate)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up iterations per round")
    parser.add_argument("--size", default="bench", choices=["bench", "small", "paper"],
                        help="model sizes: the benchmark sizes (default), the test sizes, or the paper's")
    parser.add_argument("--memory-limit", default=None, help="per-rank memory limit for every planner")
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
    parser.add_argument("--out", default="results/compare.json")
    parser.add_argument("--png", default="results/compare.png")
    args = parser.parse_args()
    resolve_defaults(args, parser)
    if args.device == "cuda" and args.emulate:
        parser.error("--emulate replaces compute by CPU waits; use it with --device cpu")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to this process")
    torch.set_num_threads(1)
    keep_freed_memory()  # the profiles rank 0 takes see the same allocator as the runs
    if args.slowdown != 1.0 and not args.emulate:
        parser.error("--slowdown applies to --emulate runs only")
    if args.slowdown < 1.0:
        parser.error("--slowdown must be at least 1")
    mode = ("emulated" + (f", devices {args.slowdown:g}x slower than this core" if args.slowdown != 1.0 else "")
            if args.emulate else "measured")
    launch = Launch(_launched_by_torchrun(), args.device, args.timeout)
    if launch.torchrun:
        import datetime

        import torch.distributed as dist

        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(launch.backend, timeout=datetime.timedelta(seconds=args.timeout))
        args.world = [dist.get_world_size()]
    lead = launch.rank == 0
    worlds = sorted(set(args.world))
    calibration = calibrate(worlds, launch)
    rounds = split_steps(args.steps, args.rounds)

    from tqdm import tqdm

    rows: list[dict] = []
    jobs = [(m, w) for m in args.models for w in worlds]
    per_job = 4 * len(rounds) + (2 if args.emulate else 0)  # grows by a round per extra variant
    bar = tqdm(total=len(jobs) * per_job, desc=f"compare ({mode})", unit="run", file=sys.stderr,
               disable=not lead)
    for name, world in jobs:
        spec = BENCH_SPECS.get(name, name) if args.size == "bench" or ":" in name else f"{name}:size={args.size}"
        batch = build_model(spec)[1][0].shape[0]
        profile_batches = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128) if b <= batch)
        shared: list[Any] = [None]
        if lead:  # rank 0 profiles and plans; under torchrun the others receive its plans
            variants, plans = make_variants(spec, world, args.memory_limit, profile_batches, calibration[world],
                                            args.device, args.gpu_kind, args.slowdown)
            shared = [(variants, plans, reference_losses(spec, 1)[0])]
        if launch.torchrun:
            import torch.distributed as dist

            dist.broadcast_object_list(shared, src=0)
        variants, plans, reference = shared[0]
        runnable = [v for v in variants if not v.unavailable]
        bar.total += (len(runnable) - 4) * len(rounds) + (
            sum(v.runtime == "graphpipe" for v in runnable) - 2 if args.emulate else 0)
        results: dict[str, dict] = {v.name: {} for v in variants}
        zero: dict[str, dict] = {}
        if args.emulate:
            # Calibration runs, apart from the measured ones: each graphpipe plan emulated with
            # no compute at all measures the runtime's own cost of that schedule (dispatch,
            # transfers, the step's set-up and loss broadcast, the barriers that time it), which
            # the simulator models only in part; the difference is added to the prediction.
            for variant in runnable:
                if variant.runtime == "graphpipe":
                    bar.set_postfix_str(f"{name} x{world} {variant.name} (zero-compute calibration)")
                    zero[variant.name] = {}
                    # (zero-compute steps take milliseconds: at least 10 for a steady median)
                    run_variant(spec, world, variant, launch, [max(10, rounds[0])], args.warmup, 0.0, 0,
                                zero[variant.name])
                    bar.update(1)
        for round_index in range(len(rounds)):  # A B C D, A B C D, ...: drifts hit every variant alike
            for variant in runnable:
                bar.set_postfix_str(f"{name} x{world} {variant.name} (round {round_index + 1})")
                run_variant(spec, world, variant, launch, rounds, args.warmup, 1.0 if args.emulate else None,
                            round_index, results[variant.name])
                bar.update(1)
        base = {k: v.get("median_seconds") for k, v in results.items()}
        for variant in variants:
            r = results[variant.name]
            row = {"model": name, "spec": spec, "world": world, "variant": variant.name, "mode": mode,
                   "emulated": bool(args.emulate), "device": args.device, "batch": batch,
                   "micro_batches": variant.micro_batches, "depth": variant.depth or None, **r}
            if variant.unavailable:
                row["unavailable"] = variant.unavailable
            if variant.runtime == "ddp" and args.emulate:
                e = variant.ddp_emulation
                row["ddp_emulation"] = ({"segments": len(e.segments), "forward_seconds": e.forward_seconds,
                                         "backward_seconds": e.backward_seconds,
                                         "optimizer_seconds": e.optimizer_seconds}
                                        if hasattr(e, "segments") else {"error": str(e)})
            if "median_seconds" in r:
                row["samples_per_second"] = batch / r["median_seconds"]
                row["spread"] = [batch / max(r["iteration_seconds"]), batch / min(r["iteration_seconds"])]
                # Emulated stages compute nothing: their losses are meaningless, so not checked.
                row["loss_matches_reference"] = None if args.emulate else (
                    abs(r["first_loss"] - reference) <= 1e-4 * max(1.0, abs(reference)))
                for other in BASELINES:
                    if base.get(other):
                        row[f"speedup_vs_{other}"] = base[other] / r["median_seconds"]
            if variant.runtime == "graphpipe" and not variant.unavailable:
                row["plan"] = dict(plans[variant.plan_key])
                # The plan itself (stage times included), so the simulator's figures can be
                # recomputed from the report alone, e.g. with another machine model.
                row["plan"]["json"] = json.loads(variant.plan_json) if variant.plan_json else None
                z = zero.get(variant.name, {})
                if "median_seconds" in z:
                    plan = row["plan"]
                    plan["zero_compute_seconds"] = z["median_seconds"]
                    plan["simulated_calibrated_seconds"] = (plan["simulated_iteration_seconds"] + z["median_seconds"]
                                                            - plan["simulated_zero_compute_seconds"])
                    if "median_seconds" in r:
                        plan["simulator_error"] = r["median_seconds"] / plan["simulated_calibrated_seconds"] - 1.0
            rows.append(row)
    bar.close()
    if lead:
        print_table(rows, mode)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({
            "benchmark": "compare", "mode": mode, "device": args.device, "machine": platform.platform(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "commit": git_commit(),
            "launch": "torchrun" if launch.torchrun else "spawn", "slowdown": args.slowdown,
            "steps": args.steps, "rounds": rounds,
            "warmup": args.warmup, "calibration": calibration, "rows": rows}, indent=1))
        print(f"wrote {out}")
        write_png(rows, Path(args.png), mode)
    if launch.torchrun:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def print_table(rows: list[dict], mode: str) -> None:
    """The markdown table (one row per model, world size and variant, with its mode and plan
    depth), then the notes: what emulation replaced, parity checks, the simulator's errors."""
    print(f"\n### graph vs sequential pipelines ({mode}; samples/s, median of measured iterations; "
          "peak memory: resident on CPU, allocated on GPU)\n")
    vs = " | ".join(f"vs {b}" for b in BASELINES)
    print(f"| model | ranks | variant | mode | depth | M | samples/s (min-max) | {vs} | loss ok | peak memory/rank MiB |")
    print("|" + "---|" * (9 + len(BASELINES)))
    blank = " |" * (len(BASELINES) + 2)
    for r in rows:
        row_mode = "emulated" if r.get("emulated") else "measured"
        depth = "-" if not r.get("depth") else (f"{r['depth']} (dp)" if r["variant"] == "torch/ddp" else r["depth"])
        head = f"| {r['model']} | {r['world']} | {r['variant']} | {row_mode} | {depth} | {r['micro_batches']} |"
        if "unavailable" in r:
            print(f"{head} {r['unavailable']} |{blank}")
            continue
        if "error" in r:
            print(f"{head} failed: {r['error'][:80]} |{blank}")
            continue
        ratios = " | ".join(f"{r[f'speedup_vs_{b}']:.2f}x" if f"speedup_vs_{b}" in r else "-" for b in BASELINES)
        memory = max(r["peak_memory_bytes"]) / 2**20
        print(f"{head} {r['samples_per_second']:.1f} ({r['spread'][0]:.1f}-{r['spread'][1]:.1f}) | {ratios} | "
              f"{ {True: 'yes', False: 'NO', None: 'n/a'}[r['loss_matches_reference']] } | {memory:.0f} |")
    if any(r.get("emulated") for r in rows):
        slower = mode.partition(", ")[2]
        print("- emulated rows: each pipeline stage's forward and backward (torch/ddp: each rank's whole model "
              "on its 1/ranks of the batch, per parameter segment) and each optimizer step are waits of the "
              "cost model's profiled times" + (f" ({slower})" if slower else "") + "; every transfer, "
              "all-reduce and schedule is real; losses are not checked")
    depths = {(r["model"], r["world"], r["variant"]): r.get("depth") for r in rows}
    for (model, world, variant), depth in depths.items():
        seq = depths.get((model, world, "graphpipe/sequential"))
        if variant == "graphpipe/graph" and depth and seq and depth < seq:
            print(f"- {model} x{world}: the graph plan is shallower than the sequential one (depth {depth} "
                  f"against {seq})")
    # Where both planners made pipelines of the same depth and micro-batching that the simulator
    # times within 2% of each other, graphpipe/graph vs graphpipe/sequential is a parity check.
    plans = {(r["model"], r["world"], r["variant"]): r["plan"] for r in rows if "plan" in r}
    for (model, world, variant), graph in plans.items():
        seq = plans.get((model, world, "graphpipe/sequential"))
        if variant != "graphpipe/graph" or seq is None:
            continue
        if (graph["depth"], graph["micro_batches"]) == (seq["depth"], seq["micro_batches"]) and \
                abs(graph["simulated_iteration_seconds"] / seq["simulated_iteration_seconds"] - 1) <= 0.02:
            print(f"- {model} x{world}: both plans are {graph['depth']} deep with {graph['micro_batches']} "
                  "micro-batches and simulated within 2% of each other: graphpipe/graph vs graphpipe/sequential "
                  "is a parity check, its ratio the noise of this machine")
    short = mode.split(",")[0]
    raw, calibrated = [], []
    for r in rows:
        if r["variant"].startswith("graphpipe/") and "plan" in r and "median_seconds" in r:
            p = r["plan"]
            error = r["median_seconds"] / p["simulated_iteration_seconds"] - 1.0
            raw.append(error)
            line = (f"- {r['model']} x{r['world']} {r['variant']}: {p['partitioner']}, {p['stages']} stages, depth "
                    f"{p['depth']}, {p['micro_batches']} x {p['micro_batch_size']}; simulated "
                    f"{1e3 * p['simulated_iteration_seconds']:.1f} ms vs {short} {1e3 * r['median_seconds']:.1f} ms "
                    f"({100 * error:+.1f}%)")
            if "simulator_error" in p:
                calibrated.append(p["simulator_error"])
                line += (f"; with the runtime's zero-compute cost ({1e3 * p['zero_compute_seconds']:.1f} ms measured, "
                         f"{1e3 * p['simulated_zero_compute_seconds']:.1f} ms simulated) the simulator predicts "
                         f"{1e3 * p['simulated_calibrated_seconds']:.1f} ms ({100 * p['simulator_error']:+.1f}%)")
            print(line)
    for label, errors in (("simulator", raw), ("simulator + zero-compute calibration", calibrated)):
        if errors:
            print(f"- {label} vs {short}: within 10% in {sum(abs(e) <= 0.10 for e in errors)} of {len(errors)} "
                  f"runs, within 20% in {sum(abs(e) <= 0.20 for e in errors)}, worst {100 * max(errors, key=abs):+.1f}%")


def write_png(rows: list[dict], path: Path, mode: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["model"], r["world"]) for r in rows})
    variants = list(dict.fromkeys(r["variant"] for r in rows if "unavailable" not in r))  # no bar for no number
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4))
    width = 0.8 / max(1, len(variants))
    for i, v in enumerate(variants):
        values = []
        for g in groups:
            r = next((x for x in rows if (x["model"], x["world"]) == g and x["variant"] == v), None)
            values.append(r.get("samples_per_second", 0.0) if r else 0.0)
        ax.bar([j + i * width for j in range(len(groups))], values, width, label=v)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([f"{m}\nx{w}" for m, w in groups])
    ax.set_ylabel("samples/s")
    ax.set_title(f"graph vs sequential pipelines ({mode})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
