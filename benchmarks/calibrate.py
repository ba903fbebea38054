"""Calibration of the simulator's machine description from micro-benchmarks on this machine.

Two figures the simulator cannot know: the point-to-point link of the process group (latency
and bandwidth of a Gloo send/recv pair between two local ranks, by ping-pong), and graphpipe's
runtime cost of dispatching one forward or backward (a one-rank pipeline whose stage compute is
emulated with zero-length waits, so only the runtime's own work is timed). Both are measured
with as many ranks running at once as the runs they describe (``concurrency``): with more ranks
than cores, every rank's own CPU work is slowed by the others, and so are these figures.
compare.py uses them for the simulated figures it sets beside measured ones; neither comes from
the runs compared.

    python benchmarks/calibrate.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import graphpipe
from graphpipe.models import build_model, default_loss
from graphpipe.testing import run_ranks

SMALL, LARGE = 4, 4 << 20  # bytes


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _pingpong(rank: int, world: int, repeats: int, device: str = "cpu", rounds: int = 5) -> dict[int, float]:
    """Per message size, one-way seconds: the median ping-pong of each of ``rounds`` rounds of
    ``repeats``, 50 ms apart, and of those the quietest round's. A shared machine's hiccups come
    in bursts; one that lasts a whole round would otherwise set the planner's link latency (a
    2-rank calibration once read 1.8 ms where 0.1 ms is usual, and the plans changed shape)."""
    import torch.distributed as dist

    # Ranks pair up (0-1, 2-3, ...) and ping-pong at the same time.
    peer = rank ^ 1
    if peer >= world:
        for _ in range(2 * rounds * repeats):
            dist.barrier()
        return {}
    out = {}
    for size in (SMALL, LARGE):
        buf = torch.zeros(size // 4, device=device)
        medians = []
        for _ in range(rounds):
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
            medians.append(statistics.median(samples))
            time.sleep(0.05)
        out[size] = min(medians)
    return out


def _in_group(fn: Any, *args: Any) -> list[Any]:
    """Runs ``fn(rank, world, *args)`` on every rank of the initialised default process group
    (a ``torchrun`` launch) and returns every rank's value, on every rank."""
    import torch.distributed as dist

    value = fn(dist.get_rank(), dist.get_world_size(), *args)
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def link(repeats: int = 20, concurrency: int = 2, *, in_group: bool = False,
         device: str = "cpu") -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of one point-to-point transfer between two ranks,
    with ``concurrency`` ranks ping-ponging in pairs at once (medians over the pairs).
    ``in_group``: measure on the ranks of the current process group instead of spawning."""
    if in_group:
        timed = [v for v in _in_group(_pingpong, repeats, device) if v]
    else:
        results = run_ranks(_pingpong, max(2, concurrency), repeats, device, timeout=300)
        if not all(r.ok for r in results):
            raise RuntimeError(f"link calibration failed: {[r.message for r in results if not r.ok]}")
        timed = [r.value for r in results if r.value]
    latency = statistics.median(t[SMALL] for t in timed)
    large = statistics.median(t[LARGE] for t in timed)
    bandwidth = LARGE / max(large - latency, 1e-9)
    return latency, bandwidth


def _dispatch(rank: int, world: int, spec: str, micro_batches: int, steps: int, device: str = "cpu") -> float:
    import torch.distributed as dist

    from graphpipe.testing.emulate import emulate_stage

    # Every rank runs its own one-rank pipeline (a group of its own), all at the same time.
    groups = [dist.new_group([r]) for r in range(world)]
    torch.manual_seed(0)
    model, inputs = build_model(spec)
    pipe = graphpipe.wrap(model.to(device), inputs, default_loss(spec), group=groups[rank],
                          micro_batches=micro_batches, partitioner="sequential")
    emulate_stage(pipe, 0.0, 0.0)
    targets = model.example_targets(inputs[0].shape[0])
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        pipe.step(inputs, targets)
        _sync(device)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:]) / (2 * micro_batches)


def dispatch_overhead(spec: str = "candle_uno:batch=16", micro_batches: int = 8, steps: int = 12,
                      concurrency: int = 1, *, in_group: bool = False, device: str = "cpu") -> float:
    """Seconds of runtime work per forward or backward task (zero-length compute), with
    ``concurrency`` one-rank pipelines running at once (median over them). ``in_group``: one
    pipeline on every rank of the current process group instead of spawning."""
    if in_group:
        return float(statistics.median(_in_group(_dispatch, spec, micro_batches, steps, device)))
    results = run_ranks(_dispatch, max(1, concurrency), spec, micro_batches, steps, device, timeout=300)
    if not all(r.ok for r in results):
        raise RuntimeError(f"dispatch calibration failed: {[r.message for r in results if not r.ok]}")
    return float(statistics.median(r.value for r in results))


def calibrated_devices(count: int) -> tuple[Any, float, dict[str, float]]:
    """CPU devices with measured links, the measured dispatch overhead, and the raw figures,
    all measured with ``count`` ranks at once (throughput and memory bandwidth: one process)."""
    latency, bandwidth = link(concurrency=count)
    overhead = dispatch_overhead(concurrency=count)
    devices = graphpipe.devices(count, "cpu", measure=True)
    devices.set_node_links(count, bandwidth, latency, bandwidth, latency)
    # The description carries the runtime's measured dispatch cost: planner and simulator read it.
    devices.instruction_overhead_seconds = overhead
    return devices, overhead, {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                               "task_overhead_seconds": overhead}


if __name__ == "__main__":
    import sys

    for count in [int(a) for a in sys.argv[1:]] or [2]:
        _, _, figures = calibrated_devices(count)
        print(f"{count} ranks: " + ", ".join(f"{key} {value:.6g}" for key, value in figures.items()))
