"""Calibration of the simulator's machine description from micro-benchmarks on this machine.

Two figures the simulator cannot know: the point-to-point link of the process group (latency
and bandwidth of a Gloo send/recv pair between two local ranks, by ping-pong), and graphpipe's
runtime cost of dispatching one forward or backward (a one-rank pipeline whose stage compute is
emulated with zero-length waits, so only the runtime's own work is timed). compare.py uses them
for the simulated figures it sets beside measured ones; neither comes from the runs compared.

    python benchmarks/calibrate.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import graphpipe
from graphpipe.models import build_model, default_loss
from graphpipe.runtime.testing import run_ranks

SMALL, LARGE = 4, 4 << 20  # bytes


def _pingpong(rank: int, world: int, repeats: int) -> dict[int, float]:
    import torch.distributed as dist

    out = {}
    for size in (SMALL, LARGE):
        buf = torch.zeros(size // 4)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            samples.append((time.perf_counter() - start) / 2)
        out[size] = statistics.median(samples)
    return out


def link(repeats: int = 30) -> tuple[float, float]:
    """(latency seconds, bandwidth bytes/s) of one point-to-point transfer between two ranks."""
    results = run_ranks(_pingpong, 2, repeats, timeout=120)
    if not all(r.ok for r in results):
        raise RuntimeError(f"link calibration failed: {[r.message for r in results if not r.ok]}")
    times = results[0].value
    latency = times[SMALL]
    bandwidth = LARGE / max(times[LARGE] - latency, 1e-9)
    return latency, bandwidth


def _dispatch(rank: int, world: int, spec: str, micro_batches: int, steps: int) -> float:
    from graphpipe.runtime.emulate import emulate_stage

    torch.manual_seed(0)
    model, inputs = build_model(spec)
    pipe = graphpipe.wrap(model, inputs, default_loss(spec), micro_batches=micro_batches, partitioner="sequential")
    emulate_stage(pipe, 0.0, 0.0)
    targets = model.example_targets(inputs[0].shape[0])
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        pipe.step(inputs, targets)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples[1:]) / (2 * micro_batches)


def dispatch_overhead(spec: str = "candle_uno:batch=16", micro_batches: int = 8, steps: int = 12) -> float:
    """Seconds of runtime work per forward or backward task (one rank, zero-length compute)."""
    results = run_ranks(_dispatch, 1, spec, micro_batches, steps, timeout=120)
    if not results[0].ok:
        raise RuntimeError(f"dispatch calibration failed: {results[0].message}")
    return float(results[0].value)


def calibrated_devices(count: int) -> tuple[Any, float, dict[str, float]]:
    """CPU devices with measured links, the measured dispatch overhead, and the raw figures."""
    latency, bandwidth = link()
    overhead = dispatch_overhead()
    devices = graphpipe.devices(count, "cpu")
    devices.set_node_links(count, bandwidth, latency, bandwidth, latency)
    return devices, overhead, {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                               "task_overhead_seconds": overhead}


if __name__ == "__main__":
    _, _, figures = calibrated_devices(2)
    for key, value in figures.items():
        print(f"{key}: {value:.6g}")
