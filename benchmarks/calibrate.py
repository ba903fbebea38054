"""Calibration of the simulator's machine description from micro-benchmarks on this machine.

Three figures the simulator cannot know (graphpipe/calibration.py measures them): the
point-to-point link of the process group (latency and bandwidth of a Gloo send/recv pair between
two local ranks, by ping-pong), and graphpipe's runtime costs per forward or backward
instruction and per training step (zero-compute one-rank pipelines at two micro-batch counts).
Each is measured with as many ranks running at once as the runs it describes (``concurrency``):
with more ranks than cores, every rank's own CPU work is slowed by the others, and so are these
figures. compare.py puts them into the device description its planner and simulator read;
none comes from the runs compared.

    python benchmarks/calibrate.py 2 8      # the figures with 2, then 8 ranks at once
    python benchmarks/calibrate.py --sweep 2 [--out results/all_reduce_sweep.json]

``--sweep``: lone all-reduces over that many ranks (each bound to a core) at sizes from 4 bytes
to 8 MiB, medians of 24 per size in each of 3 launches, beside what the collective link the
calibration fits (at COLLECTIVE_SIZES) prices them at: where Gloo's CPU all-reduce is not the
straight line the cost model's ring formula draws, and how much it moves from launch to launch.
"""

from __future__ import annotations

from typing import Any

import graphpipe
from graphpipe.calibration import RuntimeCosts, apply_runtime_costs, link, runtime_costs


def calibrated_devices(count: int) -> tuple[Any, RuntimeCosts, dict[str, float]]:
    """CPU devices with measured links and runtime costs, the costs, and the raw figures, all
    measured with ``count`` ranks at once (throughput and memory bandwidth: one process)."""
    latency, bandwidth = link(concurrency=count)
    costs = runtime_costs(concurrency=count)
    devices = graphpipe.devices(count, "cpu")
    devices.set_node_links(count, bandwidth, latency, bandwidth, latency)
    apply_runtime_costs(devices, costs=costs)
    return devices, costs, {"link_latency_seconds": latency, "link_bandwidth_bytes_per_second": bandwidth,
                            "instruction_overhead_seconds": costs.instruction_overhead_seconds,
                            "step_overhead_seconds": costs.step_overhead_seconds,
                            "extra_tensor_seconds": costs.extra_tensor_seconds,
                            "collective_overlap_loss": costs.collective_overlap_loss,
                            "optimizer_tensor_seconds": dict(costs.optimizer_tensor_seconds),
                            "rank_skew_fraction": costs.rank_skew_fraction}


SWEEP_SIZES = (4, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20)
SWEEP_LAUNCHES = 3


def _sweep_rank(rank: int, world: int) -> dict[int, float]:
    import torch

    from graphpipe.calibration import timed_all_reduces

    torch.set_num_threads(1)
    return timed_all_reduces(SWEEP_SIZES, 24)


def all_reduce_sweep(count: int) -> dict[str, Any]:
    """Per launch, the median seconds of a lone all-reduce at each of SWEEP_SIZES over ``count``
    spawned ranks, and the fit of the collective link (graphpipe.calibration.ring_link) at
    COLLECTIVE_SIZES of the same launch with what it prices every size at."""
    from graphpipe.calibration import COLLECTIVE_SIZES, ring_link
    from graphpipe.local_ranks import expect_ok, run_ranks

    launches = []
    for _ in range(SWEEP_LAUNCHES):
        measured = expect_ok(run_ranks(_sweep_rank, count, timeout=300, bind_cpus=True))[0].value
        latency, bandwidth = ring_link(count, {size: measured[size] for size in COLLECTIVE_SIZES})
        devices = graphpipe.devices(count, "cpu")
        devices.collective_latency_seconds, devices.collective_bandwidth_bytes_per_second = latency, bandwidth
        priced = {size: graphpipe.all_reduce_cost(devices, list(range(count)), size).seconds for size in SWEEP_SIZES}
        launches.append({"measured_seconds": measured, "priced_seconds": priced, "collective_latency_seconds": latency,
                         "collective_bandwidth_bytes_per_second": bandwidth})
    print("| bytes | " + " | ".join(f"launch {i + 1} measured / priced ms" for i in range(len(launches))) + " |")
    print("|---" * (1 + len(launches)) + "|")
    for size in SWEEP_SIZES:
        print(f"| {size} | " + " | ".join(f"{run['measured_seconds'][size] * 1e3:.2f} / {run['priced_seconds'][size] * 1e3:.2f}"
                                         for run in launches) + " |")
    return {"ranks": count, "fitted_at": list(COLLECTIVE_SIZES), "launches": launches}


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {v:.6g}" for k, v in value.items()) + "}"
    return str(value) if value is None else f"{value:.6g}"


if __name__ == "__main__":
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", nargs="*", type=int, default=[2], help="ranks at once (one calibration each)")
    parser.add_argument("--sweep", action="store_true", help="time lone all-reduces across sizes instead")
    parser.add_argument("--out", default="results/all_reduce_sweep.json", help="JSON of --sweep")
    args = parser.parse_args()
    if args.sweep:
        sweeps = [all_reduce_sweep(count) for count in args.counts]
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"benchmark": "all_reduce_sweep", "sweeps": sweeps}, f, indent=2)
        print(f"wrote {args.out}")
    else:
        for count in args.counts:
            _, _, figures = calibrated_devices(count)
            print(f"{count} ranks: " + ", ".join(f"{key} {_shown(value)}" for key, value in figures.items()))
