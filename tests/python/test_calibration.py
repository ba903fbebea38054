"""Measured runtime costs (graphpipe.calibration): what they measure, that the device
description carries them through JSON, and that planner and simulator both charge them."""

from __future__ import annotations

import time

import pytest

import graphpipe
from graphpipe.calibration import RuntimeCosts, _fit, apply_runtime_costs, runtime_costs
from graphpipe.models import build_model

SPEC = "candle_uno:size=small"


def test_fit_separates_instruction_and_step_costs() -> None:
    # 3 ms per step and 40 us per instruction (2M instructions at M micro-batches).
    steps = {m: 3e-3 + 2 * m * 40e-6 for m in (2, 8)}
    instruction, step = _fit(steps)
    assert instruction == pytest.approx(40e-6)
    assert step == pytest.approx(3e-3)
    # Noise that makes the line fall gives no negative cost.
    assert _fit({2: 2e-3, 8: 1e-3}) == (0.0, pytest.approx(1.5e-3))


def test_measured_devices_carry_runtime_costs_through_json(tmp_path) -> None:
    # A zero-compute step of the real runtime costs something per instruction and per step.
    devices = graphpipe.devices(2, "cpu", measure=True)
    assert 0.0 < devices.instruction_overhead_seconds < 0.01
    assert 0.0 < devices.step_overhead_seconds < 0.1
    path = tmp_path / "devices.json"
    devices.save(str(path))
    loaded = graphpipe.devices(2, str(path))
    assert loaded.instruction_overhead_seconds == devices.instruction_overhead_seconds
    assert loaded.step_overhead_seconds == devices.step_overhead_seconds
    again = graphpipe.Devices.from_json(devices.to_json())
    assert again.step_overhead_seconds == devices.step_overhead_seconds


def test_two_ranks_at_once_include_the_closing_all_reduce() -> None:
    costs = runtime_costs(2, steps=4, timeout=120)
    assert costs.concurrency == 2
    assert costs.instruction_overhead_seconds > 0.0 and costs.step_overhead_seconds > 0.0
    assert costs.bucket_all_reduce_seconds > 0.0  # measured for the reports


def test_measurement_is_bounded_by_its_timeout() -> None:
    # Half a second is too short to start a rank: its process is killed and the error says so.
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="runtime cost calibration failed on rank 0: .*gave no result"):
        runtime_costs(1, timeout=0.5)
    assert time.monotonic() - start < 30


def test_planner_and_simulator_charge_the_runtime_costs() -> None:
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    base = graphpipe.devices(2, "cpu")
    seq = graphpipe.plan(graph, base, "sequential", micro_batches=4, replicate=False)
    k, m = seq.num_stages, seq.num_micro_batches
    assert k == 2
    labels = {graph.node(n).name: stage.id for stage in seq.stages for n in stage.nodes}
    x, s = 1e-3, 5e-3

    def figures(instruction: float, step: float) -> tuple[float, float]:
        devices = apply_runtime_costs(graphpipe.devices(2, "cpu"), costs=RuntimeCosts(instruction, step, 1))
        # The same stages (a manual plan of the sequential cut), priced under these devices.
        p = graphpipe.plan(graph, devices, "manual", manual=labels, micro_batches=m)
        return p.predicted_iteration_seconds, graphpipe.simulate(p, devices).iteration_seconds

    planned0, simulated0 = figures(0.0, 0.0)
    planned1, simulated1 = figures(x, 0.0)
    planned2, simulated2 = figures(0.0, s)
    # 1F1B's critical path runs M + k - 1 forwards and as many backwards: each costs x more.
    assert simulated1 - simulated0 == pytest.approx(2 * (m + k - 1) * x, rel=1e-6)
    assert planned1 - planned0 == pytest.approx(2 * (m + k - 1) * x, rel=1e-6)
    # The step's fixed cost comes once.
    assert simulated2 - simulated0 == pytest.approx(s, rel=1e-6)
    assert planned2 - planned0 == pytest.approx(s, rel=1e-6)
