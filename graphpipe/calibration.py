"""Measured runtime costs: the figures of a device description that only a run can give.

The cost model knows compute and transfers from profiles and link figures; two costs of
graphpipe's own runtime it cannot know, and both planner and simulator charge them from the
device description (``Devices.instruction_overhead_seconds``, ``Devices.step_overhead_seconds``):

- the dispatch cost of one forward or backward instruction (the executor's bookkeeping, the call
  into the stage module, autograd's graph), and
- the fixed cost of one training step (binding the batch, splitting it into micro-batches, the
  loss callbacks, the step's closing loss sum over the ranks).

Both come from one-rank pipelines whose stage compute is emulated by zero-length waits, so only
the runtime works: a step of M micro-batches runs 2M instructions, and its time is
``step + 2M x instruction``; timing it at two values of M gives both (a straight-line fit of the
medians). For runs whose compute is itself emulated by waits (benchmarks/compare.py
--emulate), each measured forward and backward waits EMULATED_WAIT and the fit takes it off
again: the figure then holds what those runs pay per instruction, late wake-ups included. The
step's closing collective over several ranks is then timed on its own (an all-reduce of one
number over the measuring ranks) and added to the step's cost.

A third pair of figures prices collectives (``Devices.collective_latency_seconds``,
``Devices.collective_bandwidth_bytes_per_second``; cost/devices.h says why the point-to-point
links cannot): real all-reduces over the measuring ranks are timed at two sizes
(COLLECTIVE_SIZES: the runtime's default gradient buckets), and the ring formula the cost model
prices them by (2 (n - 1) steps of size / n, each latency + bytes / bandwidth) is inverted, so
that the priced all-reduce equals the measured one at both sizes. (The smaller is one gradient
bucket, whose all-reduce the reports print.)

Another figure prices a transfer of several tensors (``Devices.extra_tensor_seconds``): the
runtime posts them together, so they share one latency, and each extra tensor costs only the
backend's work for one more message. Pairs of ranks ping-pong one small tensor and then
EXTRA_TENSORS of them, posted at once; the difference per extra tensor is the figure (on 8 Gloo
ranks on 2 cores 126-160 us, against a 250-306 us one-way latency, which the cost model charged
per tensor before it was measured).

One more figure prices what a collective beside the compute costs it
(``Devices.collective_overlap_loss``): the runtime posts a gradient bucket's all-reduce while the
backward goes on, and the cost model would hide it behind that backward, but on Gloo CPU ranks
the collective's threads share the cores the backward computes on. The ranks run one stage of
OVERLAP_SPEC replicated on all of them, with its gradients summed in the runtime's buckets and
without (local SGD), steps alternating; the backward's lengthening (for emulated runs, of an
emulated wait) over the seconds of those sums that the cost model puts beside it
(cost::bucket_spans, cost::overlap_loss_seconds) is the figure
(0: the collective hides for free; 1: not at all; docs/results.md has its readings).

The last figure prices the optimizer step per parameter tensor (``Devices.optimizer_tensor_seconds``):
torch's optimizers on CPU step their tensors one by one (the fused and foreach paths are for
accelerators), so a step over many small tensors costs far more than its bytes. Each rank times
``optimizer.step()`` and ``zero_grad()`` (what ``Pipeline.step(optimizer=...)`` runs) over one
tiny tensor and over OPTIMIZER_TENSORS of them, interleaved; the difference per extra tensor is the
figure, one per optimizer a plan can name (TORCH_OPTIMIZERS: SGD 1.4-1.6 us a tensor, SGD with
momentum 5.4 us, Adam 19 us, on 2 ranks on 2 cores), so that a plan made for Adam is priced
Adam's loop. Runs that emulate compute by waits step no real optimizer (benchmarks/compare.py
waits the simulated step), so there none is measured.

And one prices the wait for the slowest rank (``Devices.rank_skew_fraction``): a rank's compute
varies from step to step, and a step that ends in collectives lasts as long as its slowest rank,
while the simulator replays mean durations. The ranks run the same compute (real work, or an
emulated wait) between barriers RANK_SKEW_REPEATS times; the slowest rank's time less the ranks'
mean, per second of that mean, is the figure (medians over rounds: 0.006-0.024 on 2 ranks on 2
cores).

All are measured with ``concurrency`` ranks working at once, as many as the runs they describe
would have (with more ranks than cores every rank's CPU work is slowed by the others), on
freshly spawned ranks, or on the ranks of the current process group (``in_group=True``). Every
measurement is short (a few seconds, most of it spawning the ranks) and bounded by ``timeout``.

:func:`link` measures the point-to-point link (latency and bandwidth of a Gloo send/recv pair,
pairs of ranks at once) the same way, and :func:`collective_link` the link of one ring exchange
(every rank sending to the next at once, no reduction); benchmarks/calibrate.py prints them.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from graphpipe.errors import CalibrationError

__all__ = ["RuntimeCosts", "runtime_costs", "apply_runtime_costs", "link", "collective_link", "ring_link",
           "timed_all_reduces"]

#: The model the dispatch is timed on: small, several operators per stage, zero-length compute.
DISPATCH_SPEC = "candle_uno:batch=16"
#: The two micro-batch counts of the straight-line fit (the batch of DISPATCH_SPEC divides by both).
MICRO_BATCHES = (2, 8)
#: Seconds each forward and each backward of the measuring pipelines waits when the runs they
#: describe emulate compute by waits (benchmarks/compare.py --emulate); subtracted from the
#: fitted figure. Such runs' ranks sleep between instructions and wake late on a busy machine:
#: measured without waits (every rank dispatching non-stop), 8 ranks on 2 cores read 89 to 947
#: us per instruction across runs and 129-200 us in three back-to-back calls; with these waits,
#: 323-359 us in the three calls beside them, the late wake-ups included.
EMULATED_WAIT = 2e-3
SMALL, LARGE = 4, 512 << 10  # bytes, of the ring exchange's two messages (a ring chunk of a few MiB)
PAIR_LARGE = 4 << 20  # bytes, of the ping-pong's large message
#: Times a link is measured again when its figures cannot be a link's (_link_figures): a burst of
#: load on a shared machine once set a 2-rank link's latency to 1266 us, above its 4 MiB
#: message's time, and the bandwidth to the 1e-9 s floor's 4 PB/s; the simulator then read the
#: run's transfers as free.
LINK_ATTEMPTS = 3
#: Bandwidth above this (bytes/s) is not a link's but a timing's artefact: ten times NVLink 5's
#: 1.8 TB/s.
MOST_PLAUSIBLE_BANDWIDTH = 2e13
#: Tensors of the transfer whose extra cost over one tensor is timed (_extra_tensor_seconds).
EXTRA_TENSORS = 8
#: The runtime's first gradient bucket (1 MiB; cost/gradient_buckets.h), whose all-reduce is timed
#: for the reports.
BUCKET_BYTES = 1 << 20
#: The two all-reduce sizes (bytes) the collective link figures are fitted to: the runtime's
#: default gradient buckets (a 1 MiB first one, then the rest: 4 MiB of gradients is one of each),
#: which carry most of what a step's collectives move. Why not a small size, where latency would
#: dominate: Gloo's CPU all-reduce steps up between 64 KiB and 256 KiB (2 ranks here: 0.23 ms at
#: 64 KiB, 2.2-3.8 ms at 256 KiB, 1.9-4.2 ms at 1 MiB), and 64 KiB itself read 0.43, 2.0 or 3.1 ms
#: from one launch to the next, so the line through 64 KiB and 4 MiB priced the 1 MiB bucket at
#: 1.2 ms where it took 2.1-2.5 ms, and moved with the launch. All-reduces below the step are
#: priced dear instead; the step's closing sum of one number is timed on its own (step overhead).
COLLECTIVE_SIZES = (BUCKET_BYTES, 4 << 20)
#: The model whose replicated step times the overlap loss (_overlap_seconds): the main job's
#: Transformer (benchmarks/compare.py's BENCH_SPECS), 4.2 MB of gradients in the runtime's two
#: default buckets, a backward of about 25 ms on half its batch here; the steps of each variant
#: (with sums, without); the backward's length where compute is emulated by waits; and a local-SGD
#: period no run reaches, so that the variant without sums never averages.
OVERLAP_SPEC = "transformer:depth=8,seq=32,hidden=128,heads=4,ffn=256,batch=32"
OVERLAP_REPEATS = 12
OVERLAP_COMPUTE_SECONDS = 0.02
NEVER_AVERAGE = 10**9
#: Tensors of the optimizer step whose extra cost over one tensor is timed (_optimizer_tensor_seconds),
#: and the elements of each (tiny: the step's memory traffic is priced apart, by its bytes).
OPTIMIZER_TENSORS = 128
OPTIMIZER_TENSOR_ELEMENTS = 16
#: The compute (seconds) the ranks run between barriers to time how long the slowest keeps the
#: others waiting (_rank_skew), and the rounds: a step's compute is tens of milliseconds, and the
#: figure is a median over rounds of a maximum less a mean, which needs more rounds than a median
#: of one time.
RANK_SKEW_COMPUTE_SECONDS = 0.04
RANK_SKEW_REPEATS = 40
#: All-reduces timed per size (at least): a median of 8 under 4 ranks on 2 busy cores moved the
#: fitted 1 MiB price by 20% from run to run.
ALL_REDUCE_REPEATS = 24


@dataclass(frozen=True)
class RuntimeCosts:
    """graphpipe's runtime costs on this machine, with ``concurrency`` ranks working at once."""

    instruction_overhead_seconds: float  # per forward or backward instruction
    step_overhead_seconds: float  # per training step, on top of its instructions
    concurrency: int
    # Measured for reports, not part of the description: one all-reduce of a gradient bucket
    # (BUCKET_BYTES) over the ``concurrency`` ranks (0 for one rank), to set beside what the
    # cost model prices it at.
    bucket_all_reduce_seconds: float = 0.0
    # The link a ring all-reduce over the ``concurrency`` ranks sees (0 for one rank): what
    # ``Devices.collective_latency_seconds`` and ``collective_bandwidth_bytes_per_second`` take.
    collective_latency_seconds: float = 0.0
    collective_bandwidth_bytes_per_second: float = 0.0
    # What each tensor of one transfer after the first adds (``Devices.extra_tensor_seconds``;
    # None for one rank, which has no peer to send to).
    extra_tensor_seconds: float | None = None
    # The compute a rank loses per second of an all-reduce beside it
    # (``Devices.collective_overlap_loss``; 0 for one rank, which sums nothing).
    collective_overlap_loss: float = 0.0
    # What the optimizer step costs per parameter tensor, per optimizer of TORCH_OPTIMIZERS
    # (``Devices.optimizer_tensor_seconds``; empty where the runs described step no real
    # optimizer: emulated compute).
    optimizer_tensor_seconds: dict[str, float] = field(default_factory=dict)
    # How long the slowest rank keeps the others waiting per second of compute
    # (``Devices.rank_skew_fraction``; 0 for one rank).
    rank_skew_fraction: float = 0.0


#: The torch optimizer each optimizer name of the planner stands for (``graphpipe.OPTIMIZERS``
#: without "adamw", which it prices as "adam"), as graphpipe's benchmarks and examples build it:
#: the ones whose per-tensor price is timed.
TORCH_OPTIMIZERS: dict[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.01),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-3),
}


def _optimizer_tensor_seconds(name: str, repeats: int, device: str = "cpu") -> float:
    """On one rank: what each parameter tensor after the first adds to ``optimizer.step()`` plus
    ``zero_grad()`` of the optimizer ``name``, timed over one tensor and over OPTIMIZER_TENSORS
    tiny ones, interleaved (the gradients set before each timed step, as a backward leaves them);
    the medians' difference per extra tensor, clamped at 0."""
    counts = (1, OPTIMIZER_TENSORS)
    setups = {}
    for k in counts:
        params = [torch.zeros(OPTIMIZER_TENSOR_ELEMENTS, device=device, requires_grad=True) for _ in range(k)]
        grads = [torch.full_like(p, 1e-3) for p in params]
        setups[k] = (params, grads, TORCH_OPTIMIZERS[name](params))
    samples: dict[int, list[float]] = {k: [] for k in counts}
    for _ in range(max(repeats, 3) + 1):  # the first round builds the optimizers' state: not timed
        for k, (params, grads, optimizer) in setups.items():
            for p, g in zip(params, grads):
                p.grad = g
            start = time.perf_counter()
            optimizer.step()
            optimizer.zero_grad()
            _sync(device)
            samples[k].append(time.perf_counter() - start)
    one, many = (statistics.median(samples[k][1:]) for k in counts)
    return max(many - one, 0.0) / (OPTIMIZER_TENSORS - 1)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _in_group(fn: Any, *args: Any) -> list[Any]:
    """``fn(rank, world, *args)`` on every rank of the initialised default process group (a
    ``torchrun`` launch); every rank's value, on every rank."""
    import torch.distributed as dist

    value = fn(dist.get_rank(), dist.get_world_size(), *args)
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _check_pairs(what: str) -> None:
    """A link is measured between two ranks: a one-rank process group has none (a torchrun
    launch of one process measures on spawned ranks instead, as compare.py does)."""
    import torch.distributed as dist

    if dist.get_world_size() < 2:
        raise ValueError(f"{what}(in_group=True) needs two ranks or more in the process group to time a link "
                         f"between; this group has {dist.get_world_size()} (measure on spawned ranks: "
                         f"in_group=False)")


def _spawned(fn: Any, concurrency: int, timeout: float, what: str, *args: Any, bind_cpus: bool = False) -> list[Any]:
    from graphpipe.local_ranks import run_ranks

    results = run_ranks(fn, concurrency, *args, timeout=timeout, bind_cpus=bind_cpus)
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{what} calibration failed on rank {failed[0].rank}: {failed[0].error_type}: "
                           f"{failed[0].message}")
    return [r.value for r in results]


def _step_samples(rank: int, world: int, spec: str, micro_batches: tuple[int, ...], steps: int,
                  device: str = "cpu", wait: float = 0.0) -> dict[str, Any]:
    """On one rank: its own one-rank pipeline's step times at each micro-batch count, every
    forward and backward an emulated compute of ``wait`` seconds (interleaved, so a burst of load
    hits every count alike), the time of the closing all-reduce of one number over all
    ``world`` ranks, and (without waits) every optimizer's per-tensor cost."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.emulation import emulate_stage
    from graphpipe.models import build_model, default_loss

    groups = [dist.new_group([r]) for r in range(world)]  # collective: every rank creates every group
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    targets = model.example_targets(inputs[0].shape[0])
    pipes = []
    for m in micro_batches:
        pipe = graphpipe.wrap(model.to(device), inputs, default_loss(spec), group=groups[rank], micro_batches=m,
                              partitioner="sequential")
        emulate_stage(pipe, wait, wait)
        pipe.step(inputs, targets)  # warm-up: the emulated stage learns its output shapes
        pipes.append(pipe)
    samples: dict[int, list[float]] = {m: [] for m in micro_batches}
    for _ in range(steps):
        for m, pipe in zip(micro_batches, pipes):
            dist.barrier()  # every rank's pipelines run at the same time
            start = time.perf_counter()
            pipe.step(inputs, targets)
            _sync(device)
            samples[m].append(time.perf_counter() - start)
    sizes = (4, *COLLECTIVE_SIZES)  # 4 bytes: the step's closing sum of one number; BUCKET_BYTES among them
    reduces = (timed_all_reduces(sizes, max(steps, ALL_REDUCE_REPEATS), device) if world > 1
               else dict.fromkeys(sizes, 0.0))
    extra = _extra_tensor_seconds(rank, world, max(steps, ALL_REDUCE_REPEATS), device) if world > 1 else None
    overlap = (_overlap_seconds(world, OVERLAP_REPEATS, device, wait) if world > 1
               else {"lost": 0.0, "compute": 0.0, "bytes": 0.0})
    per_tensor = ({name: _optimizer_tensor_seconds(name, max(steps, ALL_REDUCE_REPEATS), device)
                   for name in TORCH_OPTIMIZERS} if wait == 0.0 else {})
    skew = (_rank_skew(_compute(RANK_SKEW_COMPUTE_SECONDS, device, wait, agree=True), RANK_SKEW_REPEATS)
            if world > 1 else 0.0)
    return {"steps": {m: statistics.median(s) for m, s in samples.items()}, "closing": reduces[4],
            "all_reduce": reduces, "extra_tensor": extra, "overlap_loss": overlap, "optimizer_tensor": per_tensor,
            "rank_skew": skew}


def _compute(seconds: float, device: str = "cpu", wait: float = 0.0, agree: bool = False) -> Callable[[], None]:
    """A compute of about ``seconds``: matrix products and their backward, repeated (the count
    set by timing a few), or an emulated wait where ``wait`` > 0, as the runs it describes
    compute. ``agree``: every rank of the default group (each calls it) runs the same count, the
    largest any rank timed, so that the ranks' times differ by their speed, not their work."""
    from graphpipe.emulation import wait as emulated_wait

    if wait > 0.0:
        return lambda: emulated_wait(seconds)
    layer = torch.nn.Linear(512, 512, device=device)
    rows = torch.randn(128, 512, device=device)

    def unit() -> None:
        layer(rows).sum().backward()

    unit()
    start = time.perf_counter()
    for _ in range(4):
        unit()
    _sync(device)
    units = max(1, round(seconds / max((time.perf_counter() - start) / 4, 1e-9)))
    if agree:
        import torch.distributed as dist

        count = torch.tensor([units])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        units = int(count.item())

    def compute() -> None:
        for _ in range(units):
            unit()
        _sync(device)

    return compute


def _rank_skew(compute: Callable[[], None], repeats: int) -> float:
    """On one rank (every rank of the default group calls it): how long the slowest rank keeps the
    others waiting, per second of compute. Each round every rank runs ``compute`` after a barrier;
    the rounds' times are gathered, and the figure is the median over rounds of (the slowest
    rank's time - the ranks' mean) over the median of the means: what a typical step ending in a
    collective waits, beyond its ranks' mean compute, for its slowest rank (typical: the runs it
    describes are reported by their median step; a mean let one stalled round of 40 move the
    figure from 0.016 to 0.068). 0 for one rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    times = torch.zeros(max(repeats, 3), dtype=torch.float64)
    for k in range(len(times)):
        dist.barrier()
        start = time.perf_counter()
        compute()
        times[k] = time.perf_counter() - start
    if world < 2:
        return 0.0
    every = [torch.zeros_like(times) for _ in range(world)]
    dist.all_gather(every, times)
    rounds = torch.stack(every)  # [rank, round]
    mean = rounds.mean(dim=0)
    typical = float(mean.median())
    return float((rounds.max(dim=0).values - mean).median()) / typical if typical > 0.0 else 0.0


def _overlap_seconds(world: int, repeats: int, device: str = "cpu", wait: float = 0.0) -> dict[str, float]:
    """On one rank (every rank of the default group calls it): the backward it loses to the
    gradient sums the runtime posts beside it. The ranks run OVERLAP_SPEC as one stage
    replicated on all of them (one micro-batch, the runtime's default buckets) twice: summing
    its gradients, and under local SGD with a period longer than the run, which sums none;
    steps of the two alternate, and each step's backward is read from the executor's flight
    recorder. Returns the medians' difference, clamped at 0 (``lost``), the backward's median
    without sums (``compute``) and the gradient bytes summed (``bytes``): _costs divides the loss
    by the seconds of those sums that the cost model puts beside a backward that long
    (cost::bucket_spans, cost::overlap_loss_seconds), the figure the simulator multiplies by
    those seconds. Where ``wait`` > 0 (runs whose compute is emulated by waits) the stage's
    forward waits ``wait`` and its backward OVERLAP_COMPUTE_SECONDS, as those runs compute.

    Why the runtime's own step, not a synthetic compute with all-reduces posted through it (the
    method before this one): the loss is not one number per second of a collective. The
    synthetic method read 0.53-0.67 per priced second with both buckets posted early, and 1.0-1.9
    with each posted at its ready time, while in the runtime's step on the main job's
    Transformer the first bucket lengthened the backward by 3.3 ms against its 1.2 ms price
    (docs/results.md, "The overlap loss measured on the runtime's own step")."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe.emulation import emulate_stage
    from graphpipe.models import build_model, default_loss
    from graphpipe.sync import LocalSGD

    torch.manual_seed(0)
    model, inputs = build_model(OVERLAP_SPEC)
    targets = model.example_targets(inputs[0].shape[0])
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.plan(graph, world, "manual", manual={"": 0}, stage_devices={0: list(range(world))},
                          micro_batches=1)
    # Both pipelines wrap one model, so they share its parameters: harmless, since the buckets'
    # hooks fire only during their own pipeline's last backward (runtime/gradient_buckets.h),
    # so the variant under local SGD sums nothing, and the rate of 0 leaves the parameters alone.
    pipes = []
    for sync in (None, LocalSGD(period=NEVER_AVERAGE)):
        pipe = graphpipe.wrap(model.to(device), inputs, default_loss(OVERLAP_SPEC), plan=plan, device=device,
                              skip_nonfinite=False, sync=sync)
        if wait > 0.0:
            emulate_stage(pipe, wait, OVERLAP_COMPUTE_SECONDS)
        # A rate of 0: local SGD steps inside step(), and the parameters stay as they are.
        optimizer = torch.optim.SGD(list(pipe.parameters()), lr=0.0)
        pipe.step(inputs, targets, optimizer=optimizer)  # warm-up
        pipes.append((pipe, optimizer))
    backward: list[list[float]] = [[], []]
    for _ in range(max(repeats, 3)):
        for (pipe, optimizer), seconds in zip(pipes, backward):
            dist.barrier()
            pipe.step(inputs, targets, optimizer=optimizer)
            records = pipe.executor.flight_recorder.records()
            last = max(r["run"] for r in records)
            seconds.append(sum(r["end"] - r["start"] for r in records if r["run"] == last and r["kind"] == "backward"))
    summed = float(pipes[0][0].gradient_buckets.bytes)
    for pipe, _ in pipes:
        pipe.close()
    compute = statistics.median(backward[1])
    return {"lost": max(statistics.median(backward[0]) - compute, 0.0), "compute": compute, "bytes": summed}


def _priced_overlap_seconds(concurrency: int, latency: float, bandwidth: float, compute: float,
                            summed: float) -> float:
    """The seconds of the sums of ``summed`` gradient bytes, in the runtime's default buckets,
    that the cost model puts beside a last backward of ``compute`` seconds (cost::bucket_spans,
    cost::overlap_loss_seconds at a loss of 1), each bucket priced as the ring all-reduce of
    cost/all_reduce.h over ``concurrency`` ranks whose collective link is (``latency``,
    ``bandwidth``). 0 for one rank or no link."""
    if concurrency < 2 or bandwidth <= 0.0 or compute <= 0.0 or summed <= 0.0:
        return 0.0
    from graphpipe._ext import _C

    devices = _C.Devices.cpu_rank(concurrency, measure=False)
    devices.collective_latency_seconds = latency
    devices.collective_bandwidth_bytes_per_second = bandwidth
    ranks = list(range(concurrency))
    sizes = _C.gradient_bucket_sizes(summed)
    comm = [_C.all_reduce_cost(devices, ranks, size, "ring").seconds for size in sizes]
    spans = _C.bucket_spans(0.0, compute, sizes, [0.0] * len(sizes), comm)
    return _C.overlap_loss_seconds(spans, compute, 1.0)


def _extra_tensor_seconds(rank: int, world: int, repeats: int, device: str = "cpu") -> float | None:
    """On one rank: what each tensor after the first adds to a transfer whose tensors are posted
    together and then waited for, as the runtime's Transport does (runtime/transport.h). Ranks
    ping-pong in pairs (0-1, 2-3, ...; all pairs at once, as a pipeline's ranks transfer side by
    side) one small tensor, then EXTRA_TENSORS of them, interleaved; the one-way difference of the
    medians per extra tensor, clamped at 0. None on a rank without a partner (the last of an odd
    count), which still joins every barrier."""
    import torch.distributed as dist

    peer = rank ^ 1
    counts = (1, EXTRA_TENSORS)
    bufs = {k: [torch.zeros(SMALL // 4, device=device) for _ in range(k)] for k in counts}
    samples: dict[int, list[float]] = {k: [] for k in counts}

    def exchange(tensors: list[torch.Tensor], send: bool) -> None:
        post = dist.isend if send else dist.irecv
        for work in [post(t, peer, tag=i) for i, t in enumerate(tensors)]:
            work.wait()

    for _ in range(repeats):
        for k in counts:
            dist.barrier()
            if peer >= world:
                continue
            start = time.perf_counter()
            exchange(bufs[k], send=rank % 2 == 0)
            exchange(bufs[k], send=rank % 2 == 1)
            _sync(device)
            samples[k].append((time.perf_counter() - start) / 2)
    if peer >= world:
        return None
    one, many = (statistics.median(samples[k]) for k in counts)
    return max(many - one, 0.0) / (EXTRA_TENSORS - 1)


def timed_all_reduces(sizes: tuple[int, ...], repeats: int, device: str = "cpu") -> dict[int, float]:
    """Per size in bytes, the median seconds of an all-reduce of that many bytes of float32 over
    the default group (every rank calls it), the sizes interleaved round by round so that a burst
    of load hits every size alike. The one timing of real all-reduces the calibration and the
    benchmarks share."""
    import torch.distributed as dist

    bufs = {size: torch.zeros(max(1, size // 4), device=device) for size in sizes}
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats):
        for size, buf in bufs.items():
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buf)
            _sync(device)
            samples[size].append(time.perf_counter() - start)
    return {size: statistics.median(s) for size, s in samples.items()}


def ring_link(world: int, seconds: dict[int, float]) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of one ring step such that the cost model's ring
    all-reduce over ``world`` ranks (2 (world - 1) steps of size / world, each latency + bytes /
    bandwidth; cost/all_reduce.h) takes ``seconds[size]`` at both of its two sizes: the inverse
    of that formula. A measured time that does not grow with the size gives an unbounded
    bandwidth's stand-in (1 PB/s), a negative intercept a zero latency."""
    if world < 2 or len(seconds) != 2:
        raise ValueError(f"ring_link: needs two ranks or more and two sizes, got {world} ranks, sizes {list(seconds)}")
    (small, t_small), (large, t_large) = sorted(seconds.items())
    steps = 2.0 * (world - 1)
    per_byte = (t_large - t_small) / steps / ((large - small) / world)
    bandwidth = 1.0 / per_byte if per_byte > 1e-15 else 1e15
    latency = max(t_small / steps - (small / world) / bandwidth, 0.0)
    return latency, bandwidth


def _fit(steps: dict[int, float]) -> tuple[float, float]:
    """(seconds per instruction, fixed seconds per step) from step times at two or more
    micro-batch counts: a least-squares line in the instruction count 2M, clamped at 0."""
    xs = [2.0 * m for m in steps]
    ys = list(steps.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = max(slope, 0.0)
    return slope, max(my - slope * mx, 0.0)


def _costs(values: list[dict[str, Any]], concurrency: int, wait: float = 0.0) -> RuntimeCosts:
    fits = [_fit(v["steps"]) for v in values]
    # Each instruction's emulated compute is the planner's to price, not the runtime's.
    instruction = max(statistics.median(f[0] for f in fits) - wait, 0.0)
    step = statistics.median(f[1] for f in fits) + statistics.median(v["closing"] for v in values)
    reduce = {size: statistics.median(v["all_reduce"][size] for v in values) for size in values[0]["all_reduce"]}
    latency, bandwidth = (ring_link(concurrency, {s: reduce[s] for s in COLLECTIVE_SIZES}) if concurrency > 1
                          else (0.0, 0.0))
    extras = [v["extra_tensor"] for v in values if v.get("extra_tensor") is not None]
    extra = statistics.median(extras) if extras else None
    # The compute lost to the sums beside it, over the seconds of them the cost model puts beside
    # that compute from the fitted ring: the loss the simulator charges per second beside. A lone
    # 1 MiB all-reduce over 2 ranks here reads 0.8 or 2.8 ms from one spawn to the next, so a timed
    # one would not do. The most any rank lost, not the ranks' median: the sums end when the
    # slowest rank's backward has ended, and the ranks' losses differ (2 ranks here: 2.4 and 3.5
    # ms in one run), so the step waits for the largest; the simulator charges every rank alike.
    lost = max(v["overlap_loss"]["lost"] for v in values)  # 0.0 from one rank
    priced = _priced_overlap_seconds(concurrency, latency, bandwidth,
                                     statistics.median(v["overlap_loss"]["compute"] for v in values),
                                     values[0]["overlap_loss"]["bytes"])
    overlap = lost / priced if priced > 0.0 else 0.0
    per_tensor = {name: statistics.median(v["optimizer_tensor"][name] for v in values)
                  for name in values[0]["optimizer_tensor"]}
    skew = values[0]["rank_skew"]  # every rank computed the same figure from the gathered times
    return RuntimeCosts(instruction, step, concurrency, reduce[BUCKET_BYTES], latency, bandwidth, extra, overlap,
                        per_tensor, skew)


def runtime_costs(concurrency: int = 1, *, steps: int = 8, spec: str = DISPATCH_SPEC,
                  micro_batches: tuple[int, ...] = MICRO_BATCHES, timeout: float = 60.0,
                  in_group: bool = False, device: str = "cpu", wait: float = 0.0,
                  bind_cpus: bool = False) -> RuntimeCosts:
    """graphpipe's runtime costs (per instruction, per step) on ``concurrency`` spawned ranks
    working at once (medians over the ranks), within ``timeout`` seconds; ``in_group``: on the
    ranks of the current process group instead (every rank calls it, every rank gets the figures;
    there ``timeout`` is not used: every barrier and collective wait is bounded by the group's own
    timeout, as ``init_process_group`` set it: ``dist.barrier`` takes no timeout of its own).
    ``wait``: an emulated compute of that many seconds in each measured forward and backward,
    taken off the figure again (0: the runtime alone, every rank dispatching without a pause, as
    ranks that compute for real are busy; EMULATED_WAIT for runs whose compute is emulated by
    waits). ``bind_cpus``: each spawned rank on a CPU of its own (local_ranks.run_ranks), as the
    runs it describes."""
    if concurrency < 1:
        raise ValueError(f"runtime_costs: concurrency must be at least 1, got {concurrency}")
    if not wait >= 0.0:
        raise ValueError(f"runtime_costs: wait must be a non-negative number of seconds, got {wait}")
    if len(set(micro_batches)) < 2:
        raise ValueError(f"runtime_costs: needs two different micro-batch counts, got {micro_batches}")
    if in_group:
        values = _in_group(_step_samples, spec, tuple(micro_batches), steps, device, wait)
    else:
        values = _spawned(_step_samples, concurrency, timeout, "runtime cost", spec, tuple(micro_batches), steps,
                          device, wait, bind_cpus=bind_cpus)
    return _costs(values, len(values), wait)


@functools.cache
def _cached_runtime_costs(concurrency: int) -> RuntimeCosts:
    return runtime_costs(concurrency)


def apply_runtime_costs(devices: Any, concurrency: int = 1, costs: RuntimeCosts | None = None) -> Any:
    """Sets ``devices``' ``instruction_overhead_seconds``, ``step_overhead_seconds``,
    collective link figures (``collective_latency_seconds``,
    ``collective_bandwidth_bytes_per_second``; 0 from one rank: collectives priced from the links),
    ``extra_tensor_seconds`` (None from one rank: a link latency per extra tensor) and
    ``collective_overlap_loss`` (0 from one rank), ``optimizer_tensor_seconds`` (every optimizer's) and
    ``rank_skew_fraction`` (0 from one rank)
    to ``costs`` (default: measured here with ``concurrency`` ranks at once, once per process and
    concurrency) and returns ``devices``. ``graphpipe.devices(..., measure=True)`` calls it."""
    costs = costs if costs is not None else _cached_runtime_costs(concurrency)
    devices.instruction_overhead_seconds = costs.instruction_overhead_seconds
    devices.step_overhead_seconds = costs.step_overhead_seconds
    devices.collective_latency_seconds = costs.collective_latency_seconds
    devices.collective_bandwidth_bytes_per_second = costs.collective_bandwidth_bytes_per_second
    devices.extra_tensor_seconds = costs.extra_tensor_seconds
    devices.collective_overlap_loss = costs.collective_overlap_loss
    devices.optimizer_tensor_seconds = costs.optimizer_tensor_seconds
    devices.rank_skew_fraction = costs.rank_skew_fraction
    return devices


def _pingpong(rank: int, world: int, repeats: int, device: str = "cpu", rounds: int = 5) -> dict[int, float]:
    """Per message size, one-way seconds: the median ping-pong of each of ``rounds`` rounds of
    ``repeats``, 50 ms apart, and of those the quietest round's. A shared machine's hiccups come
    in bursts; one that lasts a whole round would otherwise set the planner's link latency (a
    2-rank calibration once read 1.8 ms where 0.1 ms is usual, and the plans changed shape).
    Each round times both sizes, one right after the other, so that a burst slows both alike
    instead of the small message's rounds alone (which once put the latency above the large
    message's time: :data:`LINK_ATTEMPTS`)."""
    import torch.distributed as dist

    # Ranks pair up (0-1, 2-3, ...) and ping-pong at the same time.
    peer = rank ^ 1
    sizes = (SMALL, PAIR_LARGE)
    if peer >= world:
        for _ in range(len(sizes) * rounds * repeats):
            dist.barrier()
        return {}
    buffers = {size: torch.zeros(size // 4, device=device) for size in sizes}
    medians: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(rounds):
        for size, buf in buffers.items():
            samples = []
            for _ in range(repeats):
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                if rank % 2 == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
                _sync(device)
                samples.append((time.perf_counter() - start) / 2)
            medians[size].append(statistics.median(samples))
        time.sleep(0.05)
    return {size: min(m) for size, m in medians.items()}


def _ring_exchange(rank: int, world: int, repeats: int, device: str = "cpu", rounds: int = 5) -> dict[int, float]:
    """Per message size, the seconds of one step in which every rank sends a message to its
    successor and receives one from its predecessor, all at once (an all-reduce's ring step,
    and a pipeline's steady state): the median of each of ``rounds`` rounds of ``repeats``,
    50 ms apart, and the median of those. A shared machine's hiccups come in bursts; one that
    lasts a whole round does not set the link's figures, and neither does the quietest round
    (the runs it describes see the machine's usual load, not its best moment).

    All ranks at once, not pairs taking turns: on one host the ranks' links share its cores,
    and with more ranks than cores a step waits for every rank to be scheduled. On 8 ranks and
    2 busy cores a ping-pong between pairs read 0.2 ms and 0.8 GB/s, from which the cost model
    priced a 1 MiB all-reduce at 5 ms where Gloo took 15-21 ms; the ring step's figures (0.8 ms,
    0.6 GB/s) price it at 14-15 ms. But a pipeline's transfers, between ranks that mostly sleep,
    are priced too high by them (an 8-stage chain simulated 46% slow): collectives and
    point-to-point transfers need figures of their own (:func:`collective_link`, :func:`link`)."""
    import torch.distributed as dist

    successor, predecessor = (rank + 1) % world, (rank - 1) % world
    buffers = {size: (torch.zeros(size // 4, device=device), torch.zeros(size // 4, device=device))
               for size in (SMALL, LARGE)}
    medians: dict[int, list[float]] = {size: [] for size in buffers}
    for _ in range(rounds):
        # Both sizes in each round, as _pingpong times them.
        for size, (send, recv) in buffers.items():
            samples = []
            for _ in range(repeats):
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                for work in (dist.isend(send, successor), dist.irecv(recv, predecessor)):
                    work.wait()
                _sync(device)
                samples.append(time.perf_counter() - start)
            medians[size].append(statistics.median(samples))
        time.sleep(0.05)
    return {size: statistics.median(m) for size, m in medians.items()}


def _link_figures(small_seconds: float, large_seconds: float, large_bytes: int) -> tuple[float, float] | None:
    """(latency seconds, bandwidth bytes/s) of a link whose 4-byte message took
    ``small_seconds`` and whose ``large_bytes`` message ``large_seconds``; None where those
    cannot be a link's: the large message no slower than the small one, or so little slower that
    the bandwidth would pass :data:`MOST_PLAUSIBLE_BANDWIDTH` (a burst of load during the small
    message's timing, not a link)."""
    if not large_seconds > small_seconds:
        return None
    bandwidth = large_bytes / (large_seconds - small_seconds)
    if bandwidth > MOST_PLAUSIBLE_BANDWIDTH:
        return None
    return small_seconds, bandwidth


def _measured_link(what: str, measure: Any, large_bytes: int) -> tuple[float, float]:
    """The figures of ``measure()`` (every rank's {size: seconds}, ranks without a pair giving
    {}), medians over the ranks, measured again up to :data:`LINK_ATTEMPTS` times while they
    cannot be a link's (_link_figures). Every rank sees every rank's values, so in a process
    group all decide alike."""
    tried = []
    for _ in range(LINK_ATTEMPTS):
        timed = [v for v in measure() if v]
        small = statistics.median(t[SMALL] for t in timed)
        large = statistics.median(t[large_bytes] for t in timed)
        figures = _link_figures(small, large, large_bytes)
        if figures is not None:
            return figures
        tried.append(f"{small * 1e6:.0f} us for {SMALL} bytes, {large * 1e6:.0f} us for {large_bytes} bytes")
    raise CalibrationError(f"{what}: the large message was no slower than the small one, or so little slower "
                           f"that the bandwidth passed {MOST_PLAUSIBLE_BANDWIDTH / 1e12:.0f} TB/s, in each of "
                           f"{LINK_ATTEMPTS} measurements ({'; '.join(tried)}); the machine is too loaded to "
                           f"time a link, and no latency or bandwidth is returned")


def link(repeats: int = 20, concurrency: int = 2, *, in_group: bool = False, device: str = "cpu",
         timeout: float = 120.0, bind_cpus: bool = False) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of one point-to-point transfer between two ranks,
    with ``concurrency`` ranks ping-ponging in pairs at once (medians over the pairs): what a
    pipeline's transfers see. ``in_group``: measure on the ranks of the current process group
    instead of spawning (it must have two ranks or more). ``bind_cpus``: each spawned rank on a
    CPU of its own (local_ranks.run_ranks), as the runs it describes. Figures that cannot be a
    link's are measured again, and :class:`graphpipe.CalibrationError` is raised when none of
    :data:`LINK_ATTEMPTS` measurements gives any (_measured_link)."""
    if in_group:
        _check_pairs("link")
        return _measured_link("link", lambda: _in_group(_pingpong, repeats, device), PAIR_LARGE)
    return _measured_link("link", lambda: _spawned(_pingpong, max(2, concurrency), timeout, "link", repeats, device,
                                                   bind_cpus=bind_cpus), PAIR_LARGE)


def collective_link(repeats: int = 20, concurrency: int = 2, *, in_group: bool = False, device: str = "cpu",
                    timeout: float = 120.0, bind_cpus: bool = False) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of one link of a ring step, with ``concurrency``
    ranks all sending to their successor at once (_ring_exchange; medians over the ranks):
    what a ring all-reduce over those ranks sees. ``in_group``: on the ranks of the current
    process group (two or more). ``bind_cpus``, and figures that cannot be a link's: as for
    link()."""
    if in_group:
        _check_pairs("collective_link")
        return _measured_link("collective link", lambda: _in_group(_ring_exchange, repeats, device), LARGE)
    return _measured_link("collective link", lambda: _spawned(_ring_exchange, max(2, concurrency), timeout,
                                                              "collective link", repeats, device,
                                                              bind_cpus=bind_cpus), LARGE)
