"""Measured runtime costs (graphpipe.calibration): what they measure, that the device
description carries them through JSON, and that planner and simulator both charge them; the
same for the collective link figures fitted to real all-reduces."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import graphpipe
from graphpipe.calibration import (
    COLLECTIVE_SIZES,
    LINK_ATTEMPTS,
    MOST_PLAUSIBLE_BANDWIDTH,
    PAIR_LARGE,
    SMALL,
    RuntimeCosts,
    _fit,
    _link_figures,
    _measured_link,
    apply_runtime_costs,
    link,
    ring_link,
    runtime_costs,
)
from graphpipe.models import build_model
from graphpipe.runtime import stage_assignment

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
    # Two ranks at once: the collective link fitted to their real all-reduces comes along.
    assert devices.collective_bandwidth_bytes_per_second > 0.0 and devices.collective_latency_seconds >= 0.0
    assert loaded.collective_bandwidth_bytes_per_second == devices.collective_bandwidth_bytes_per_second
    assert loaded.collective_latency_seconds == devices.collective_latency_seconds
    # ... and what each extra tensor of a transfer adds, measured between the two ranks.
    assert devices.extra_tensor_seconds is not None and 0.0 <= devices.extra_tensor_seconds < 0.01
    assert loaded.extra_tensor_seconds == devices.extra_tensor_seconds
    # ... and every optimizer's price per parameter tensor (torch's CPU optimizers loop over them).
    assert set(devices.optimizer_tensor_seconds) == set(graphpipe.OPTIMIZERS)
    assert all(0.0 < p < 1e-3 for p in devices.optimizer_tensor_seconds.values())
    assert loaded.optimizer_tensor_seconds == devices.optimizer_tensor_seconds
    # ... and how long the slower of the two keeps the other waiting, per second of compute.
    assert 0.0 <= devices.rank_skew_fraction < 1.0
    assert loaded.rank_skew_fraction == devices.rank_skew_fraction


def test_two_ranks_at_once_include_the_closing_all_reduce() -> None:
    costs = runtime_costs(2, steps=4, timeout=120)
    assert costs.concurrency == 2
    assert costs.instruction_overhead_seconds > 0.0 and costs.step_overhead_seconds > 0.0
    assert costs.bucket_all_reduce_seconds > 0.0  # measured for the reports
    assert costs.collective_bandwidth_bytes_per_second > 0.0 and costs.collective_latency_seconds >= 0.0
    assert costs.extra_tensor_seconds is not None and costs.extra_tensor_seconds >= 0.0
    assert costs.collective_overlap_loss >= 0.0


def _overlap_loss_on_one_core(rank: int, world: int) -> float:
    import os

    from graphpipe._ext import _C
    from graphpipe.calibration import _overlap_seconds, timed_all_reduces

    # Every thread of the rank (Gloo's, started with the process group, among them) on core 0.
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {0})
    torch.set_num_threads(1)
    measured = _overlap_seconds(world, 6)
    # The compute lost per second of a lone all-reduce of the first bucket, the one that runs
    # beside the backward (the rest is ready at its end).
    first = _C.gradient_bucket_sizes(measured["bytes"])[0]
    lone = timed_all_reduces((int(first),), 12)[int(first)]
    return measured["lost"] / lone


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="needs Linux's sched_setaffinity")
def test_overlap_loss_sees_a_collective_that_shares_the_compute_core() -> None:
    # Two ranks whose every thread runs on one core: the all-reduce's work can only take the
    # compute's time, so an all-reduce posted beside the compute lengthens it by a good part of
    # its own time (2 ranks on 2 cores read 0.8-2.0; a loss near 0 would mean the timing missed
    # the collective). Both ranks share that core, so one rank's compute also waits on the
    # other's: under a busy machine one rank alone read 0.17 beside 0.91 (CI) and 0.168 beside
    # 0.908 (here, with a third process spinning), so the pair's mean is the figure checked.
    from graphpipe.local_ranks import run_ranks

    results = run_ranks(_overlap_loss_on_one_core, 2, timeout=120)
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]
    losses = [r.value for r in results]
    assert all(0.0 <= loss < 20.0 for loss in losses), losses
    assert sum(losses) / len(losses) > 0.25, losses
    # The figure travels with the description, and only where it was measured.
    devices = graphpipe.devices(2, "cpu")
    assert "collective_overlap_loss" not in devices.to_json()
    devices.collective_overlap_loss = losses[0]
    assert graphpipe.Devices.from_json(devices.to_json()).collective_overlap_loss == losses[0]


def test_dispatch_measured_between_emulated_waits_leaves_the_waits_out() -> None:
    # Emulated runs' ranks wait between instructions (compare.py --emulate calibrates that way):
    # each measured forward and backward waits 4 ms, and the fit takes the waits off again, so
    # the figure is the runtime's per instruction, not the emulated compute's. The line runs
    # through 1 and 8 micro-batches here: its intercept (the step's fixed cost, under 1 ms on one
    # rank) is then extrapolated over 2 instructions of 4 ms, not over 4 as from 2 micro-batches,
    # where 1 of 5 such fits fell to 0 (the 8-rank calibration keeps MICRO_BATCHES: from 1 and 8
    # it read 30% lower per instruction, the line not being straight under contention).
    costs = runtime_costs(1, steps=8, micro_batches=(1, 8), timeout=120, wait=4e-3)
    assert 0.0 < costs.instruction_overhead_seconds < 2e-3
    assert 0.0 < costs.step_overhead_seconds < 0.1
    with pytest.raises(ValueError, match="wait must be a non-negative number of seconds"):
        runtime_costs(1, wait=-1e-3)


def test_measurement_is_bounded_by_its_timeout() -> None:
    # Half a second is too short to start a rank: its process is killed and the error says so.
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="runtime cost calibration failed on rank 0: .*gave no result"):
        runtime_costs(1, timeout=0.5)
    assert time.monotonic() - start < 30


def _skew_of_unequal_ranks(rank: int, world: int) -> float:
    from graphpipe.calibration import _rank_skew

    # Rank r waits 10 ms x (r + 1): each round's slowest rank (the last) takes 10 x world ms
    # against a mean of 10 x (world + 1) / 2.
    return _rank_skew(lambda: time.sleep(0.01 * (rank + 1)), 12)


def test_the_wait_for_the_slowest_rank_is_measured_per_second_of_compute() -> None:
    from graphpipe.testing import run_ranks

    results = run_ranks(_skew_of_unequal_ranks, 3, timeout=120)
    assert all(r.ok for r in results), [(r.error_type, r.message) for r in results]
    figures = [r.value for r in results]
    assert len(set(figures)) == 1, figures  # every rank computed it from the same gathered times
    assert figures[0] == pytest.approx((30 - 20) / 20, abs=0.08), figures  # slowest 30 ms, mean 20 ms
    # The simulator charges it in proportion to the busiest rank's compute, on two ranks or more.
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.plan(graph, graphpipe.devices(2, "cpu"), "sequential", micro_batches=4, replicate=False)
    devices = graphpipe.devices(2, "cpu")
    base = graphpipe.simulate(plan, devices)
    devices.rank_skew_fraction = 0.05
    skewed = graphpipe.simulate(plan, devices)
    compute = [sum(t.end - t.start for t in base.tasks if t.rank == r and t.kind in ("forward", "backward"))
               for r in (0, 1)]
    assert skewed.iteration_seconds == pytest.approx(base.iteration_seconds + 0.05 * max(compute), rel=1e-9)
    # ... and the planner's own estimate of the same stages too, of its own figures for them.
    labels = stage_assignment(plan, graph)
    unskewed = graphpipe.plan(graph, graphpipe.devices(2, "cpu"), "manual", manual=labels, micro_batches=4)
    planned = graphpipe.plan(graph, devices, "manual", manual=labels, micro_batches=4)
    busiest = max(s.forward_seconds + s.backward_seconds for s in planned.stages) * planned.num_micro_batches
    assert planned.predicted_iteration_seconds == pytest.approx(unskewed.predicted_iteration_seconds
                                                                + 0.05 * busiest, rel=1e-9)


def test_each_optimizer_is_priced_per_trained_tensor_of_each_stage() -> None:
    from graphpipe.calibration import TORCH_OPTIMIZERS, _optimizer_tensor_seconds

    # Every optimizer the planner names is timed, by the torch optimizer it stands for.
    assert set(TORCH_OPTIMIZERS) == set(graphpipe.OPTIMIZERS)
    prices = {name: _optimizer_tensor_seconds(name, 12) for name in TORCH_OPTIMIZERS}
    assert all(0.0 < p < 1e-3 for p in prices.values()), prices
    # The simulator charges the plan's optimizer's price (or the one it is told the run steps)
    # once per trained parameter tensor, on the stage that holds it.
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    plan = graphpipe.plan(graph, graphpipe.devices(2, "cpu"), "sequential", micro_batches=4, replicate=False)
    assert plan.optimizer == "adam"  # the planner's default

    def optimizer_steps(prices: dict[str, float], optimizer: str | None = None) -> list[float]:
        devices = graphpipe.devices(2, "cpu")
        devices.optimizer_tensor_seconds = prices
        result = graphpipe.simulate(plan, devices, optimizer=optimizer)
        return [t.end - t.start for t in result.tasks if t.kind == "optimizer"]

    def added(steps: list[float], base: list[float], price: float) -> list[int]:
        return [round((b - a) / price) for a, b in zip(base, steps)]

    base = optimizer_steps({})
    assert len(base) == plan.num_stages == 2
    both = {"sgd": 1e-4, "adam": 1e-3}
    adam = added(optimizer_steps(both), base, 1e-3)
    assert all(n > 0 for n in adam) and sum(adam) == tensors, (adam, tensors)
    assert added(optimizer_steps(both, "sgd"), base, 1e-4) == adam
    assert optimizer_steps(both, "momentum") == base  # not measured: its bytes alone
    # The description refuses a price under a name no plan gives, and is read-only in place.
    devices = graphpipe.devices(2, "cpu")
    devices.optimizer_tensor_seconds = {"adamw": 1e-6}
    with pytest.raises(graphpipe.PlanningError, match="'adamw' is priced as 'adam'"):
        devices.validate()
    with pytest.raises(TypeError):
        devices.optimizer_tensor_seconds["sgd"] = 1e-6
    with pytest.raises(graphpipe.PlanningError, match="unknown optimizer 'lion'"):
        graphpipe.simulate(plan, optimizer="lion")


def test_planner_and_simulator_charge_the_runtime_costs() -> None:
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    base = graphpipe.devices(2, "cpu")
    seq = graphpipe.plan(graph, base, "sequential", micro_batches=4, replicate=False)
    k, m = seq.num_stages, seq.num_micro_batches
    assert k == 2
    labels = stage_assignment(seq, graph)
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


def test_simulator_charges_extra_tensors_by_the_measured_figure() -> None:
    # DLRM cut in two: the stage edge carries several tensors (branch outputs), which the runtime
    # posts together. Unmeasured, each extra tensor costs a link latency; measured, its figure.
    model, inputs = build_model("dlrm")
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(2, "cpu")
    latency = devices.link_latency[0][1]
    p = graphpipe.plan(graph, devices, "sequential", micro_batches=4, replicate=False)
    extra = max(e.tensors for e in p.edges) - 1
    assert p.num_stages == 2 and extra >= 1

    def simulated(figure: float | None) -> float:
        devices.extra_tensor_seconds = figure
        return graphpipe.simulate(p, devices).iteration_seconds

    unmeasured, at_latency, free = simulated(None), simulated(latency), simulated(0.0)
    assert unmeasured == pytest.approx(at_latency, rel=1e-12)
    # Every micro-batch's activations and gradients cross the edge on the critical path of
    # fill-drain's ends at least once each way: the extra tensors' latencies come off.
    assert unmeasured - free >= 2 * extra * latency * (1 - 1e-9)
    assert graphpipe.Devices.from_json(devices.to_json()).extra_tensor_seconds == 0.0


def test_ring_link_inverts_the_cost_models_all_reduce() -> None:
    # Whatever two all-reduce times were measured, the fitted figures make the cost model (C++)
    # price the all-reduce at exactly those times, at both sizes.
    small, large = COLLECTIVE_SIZES
    for world, measured in ((4, {small: 6e-3, large: 20e-3}), (8, {small: 18e-3, large: 70e-3}),
                            (2, {small: 2.2e-3, large: 5e-3})):
        latency, bandwidth = ring_link(world, measured)
        devices = graphpipe.devices(world, "cpu")
        devices.collective_latency_seconds, devices.collective_bandwidth_bytes_per_second = latency, bandwidth
        for size, seconds in measured.items():
            assert graphpipe.all_reduce_cost(devices, list(range(world)), size).seconds == pytest.approx(seconds)
    # A time that does not grow with the size: no negative or infinite figure.
    latency, bandwidth = ring_link(4, {small: 2e-3, large: 1e-3})
    assert latency >= 0.0 and 0.0 < bandwidth < float("inf")
    with pytest.raises(ValueError, match="two ranks or more"):
        ring_link(1, {small: 1e-3, large: 2e-3})


def test_link_figures_refuse_what_cannot_be_a_link() -> None:
    # The calibration that once read 1266 us of latency and a 4 MiB message in less: no figures,
    # where the old fit gave 4 PB/s.
    assert _link_figures(1266e-6, 1000e-6, PAIR_LARGE) is None
    assert _link_figures(100e-6, 100e-6, PAIR_LARGE) is None
    # Slower by a hair: a bandwidth no link has.
    assert _link_figures(100e-6, 100e-6 + 0.5 * PAIR_LARGE / MOST_PLAUSIBLE_BANDWIDTH, PAIR_LARGE) is None
    latency, bandwidth = _link_figures(100e-6, 1.1e-3, PAIR_LARGE)
    assert latency == 100e-6 and bandwidth == pytest.approx(PAIR_LARGE / 1e-3)


def test_an_inconsistent_link_is_measured_again_then_refused() -> None:
    # Each measurement: every rank's {size: seconds}; a rank without a pair gives {}.
    bad = [{SMALL: 1266e-6, PAIR_LARGE: 1000e-6}, {SMALL: 1300e-6, PAIR_LARGE: 900e-6}, {}]
    good = [{SMALL: 100e-6, PAIR_LARGE: 1.1e-3}, {SMALL: 120e-6, PAIR_LARGE: 1.3e-3}, {}]
    calls = []

    def once_bad_then_good() -> list[dict[int, float]]:
        calls.append(1)
        return bad if len(calls) == 1 else good

    latency, bandwidth = _measured_link("link", once_bad_then_good, PAIR_LARGE)
    assert len(calls) == 2  # measured again, once
    assert latency == pytest.approx(110e-6) and bandwidth == pytest.approx(PAIR_LARGE / 1.09e-3)
    calls.clear()

    def always_bad() -> list[dict[int, float]]:
        calls.append(1)
        return bad

    with pytest.raises(graphpipe.CalibrationError, match=r"link: the large message was no slower .* 1283 us for 4 bytes"):
        _measured_link("link", always_bad, PAIR_LARGE)
    assert len(calls) == LINK_ATTEMPTS


def test_a_spawned_link_measures_two_ranks() -> None:
    latency, bandwidth = link(repeats=5, concurrency=2, timeout=120.0)
    assert 0.0 < latency < 0.1 and 0.0 < bandwidth <= MOST_PLAUSIBLE_BANDWIDTH


def test_collective_link_round_trips_and_is_checked() -> None:
    devices = graphpipe.devices(4, "cpu")
    assert devices.collective_latency_seconds == 0.0 and devices.collective_bandwidth_bytes_per_second == 0.0
    assert "collective_bandwidth" not in devices.to_json()  # not given: files stay as they were
    devices.collective_latency_seconds, devices.collective_bandwidth_bytes_per_second = 150e-6, 0.6e9
    back = graphpipe.Devices.from_json(devices.to_json())
    assert (back.collective_latency_seconds, back.collective_bandwidth_bytes_per_second) == (150e-6, 0.6e9)
    devices.collective_bandwidth_bytes_per_second = 0.0  # a latency alone prices nothing
    with pytest.raises(graphpipe.PlanningError, match="collective_bandwidth_bytes_per_second"):
        devices.validate()


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.fc2 = nn.Linear(512, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def test_planner_and_simulator_price_a_replicated_stages_all_reduce_from_the_collective_link() -> None:
    model = _Mlp()
    graph = graphpipe.trace(model, torch.randn(64, 256))
    params = sum(p.numel() * 4 for p in model.parameters())
    one_bucket = 1 << 30  # every gradient in one bucket: one all-reduce of `params` bytes
    group = [0, 1, 2, 3]

    def priced(latency: float, bandwidth: float) -> tuple[float, float, float]:
        devices = graphpipe.devices(4, "cpu")
        devices.collective_latency_seconds, devices.collective_bandwidth_bytes_per_second = latency, bandwidth
        p = graphpipe.plan(graph, devices, "manual", manual={"": 0}, stage_devices={0: group},
                           micro_batches=2, bucket_bytes=one_bucket)
        (stage,) = p.stages
        result = graphpipe.simulate(p, devices, bucket_bytes=one_bucket)
        reduces = [t for t in result.tasks if t.kind == "all_reduce" and t.rank == 0]
        return stage.all_reduce_seconds, sum(t.end - t.start for t in reduces), p.predicted_iteration_seconds

    links = graphpipe.devices(4, "cpu")
    from_links = 2 * 3 * (links.link_latency[0][1] + params / 4 / links.link_bandwidth[0][1])
    planned0, simulated0, step0 = priced(0.0, 0.0)  # not given: priced from the links, as before
    assert planned0 == pytest.approx(from_links) and simulated0 == pytest.approx(from_links)
    latency, bandwidth = 400e-6, 0.3e9
    planned1, simulated1, step1 = priced(latency, bandwidth)
    # The ring formula on the collective figures: 2 (n - 1) steps of params / n.
    expected = 2 * 3 * (latency + params / 4 / bandwidth)
    assert planned1 == pytest.approx(expected) and simulated1 == pytest.approx(expected)
    # The all-reduce ends the step (nothing to overlap with on one stage): the step grows by it.
    assert step1 - step0 == pytest.approx(expected - from_links, rel=1e-3)


def test_the_all_reduce_sweep_prices_the_fitted_sizes_as_measured(tmp_path) -> None:
    # benchmarks/calibrate.py --sweep: lone all-reduces across sizes on 2 spawned ranks, and the
    # collective link fitted in each launch prices the two sizes it was fitted at as measured
    # (the runtime's default gradient buckets), whatever the others do.
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate.py"
    out = tmp_path / "sweep.json"
    result = subprocess.run([sys.executable, str(script), "--sweep", "2", "--out", str(out)], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = json.loads(out.read_text())["sweeps"]
    assert sweep["fitted_at"] == list(COLLECTIVE_SIZES) and len(sweep["launches"]) == 3
    for launch in sweep["launches"]:
        measured, priced = launch["measured_seconds"], launch["priced_seconds"]
        assert len(measured) == len(priced) == 8 and all(t > 0.0 for t in measured.values())
        # (A launch whose larger size did not take longer, or whose line crosses zero, gets the
        # clamped figures of ring_link, which match neither: test_ring_link_inverts... covers them.)
        small, large = (measured[str(size)] for size in COLLECTIVE_SIZES)
        if launch["collective_latency_seconds"] > 0.0 and launch["collective_bandwidth_bytes_per_second"] < 1e15:
            assert large > small
            for size in COLLECTIVE_SIZES:
                assert priced[str(size)] == pytest.approx(measured[str(size)], rel=1e-9)
    assert "| 1048576 |" in result.stdout
