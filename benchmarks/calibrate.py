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


if __name__ == "__main__":
    import sys

    for count in [int(a) for a in sys.argv[1:]] or [2]:
        _, _, figures = calibrated_devices(count)
        def shown(value: object) -> str:
            if isinstance(value, dict):
                return "{" + ", ".join(f"{k} {v:.6g}" for k, v in value.items()) + "}"
            return str(value) if value is None else f"{value:.6g}"

        print(f"{count} ranks: " + ", ".join(f"{key} {shown(value)}" for key, value in figures.items()))
