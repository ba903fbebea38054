"""benchmarks/sim_gap_bench.py's analysis: fed the simulator's own timeline as the ranks'
records it finds no gap at all, and an instruction that waits for another rank's output, made
late, shows as that much more lag on that wait and as that much more idle on its rank."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

import graphpipe
from graphpipe.models import build_model

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SPEC = "transformer:depth=4,seq=8,hidden=32,heads=2,ffn=64,batch=8"


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("sim_gap_bench")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def v_run(bench: Any) -> tuple[Any, Any]:
    """The V plan the benchmark runs (the sequential cut for 4 ranks, in a V on 2), simulated."""
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(2, "cpu")
    doubled = bench.compare.doubled_sequential_cut(graph, devices, None)
    assert not doubled.reason, doubled.reason
    plan = graphpipe.plan(graph, devices, "manual", manual=doubled.labels, stage_devices=bench.compare.v_placement(2),
                          micro_batches=4, schedule="zb_graph", replicate=False)
    return plan, graphpipe.simulate(plan, devices, "zb_graph")


def records_of(sim: Any, bench: Any, late: tuple[str, int, int] | None = None, by: float = 0.0) -> list[dict]:
    """The simulated compute tasks as each rank's flight records of one step; ``late``: that
    instruction (kind, stage, micro-batch) and everything after it on its rank ``by`` seconds
    later (the rank's own order kept)."""
    ranks: dict[int, list[dict]] = {}
    for t in sim.tasks:
        if t.kind in bench.COMPUTE:
            ranks.setdefault(t.rank, []).append({"run": 1, "kind": t.kind, "stage": t.stage,
                                                 "micro_batch": t.micro_batch, "start": t.start, "end": t.end})
    if late is not None:
        for items in ranks.values():
            items.sort(key=lambda r: r["start"])
            hit = [i for i, r in enumerate(items) if (r["kind"], r["stage"], r["micro_batch"]) == late]
            if hit:
                for r in items[hit[0]:]:
                    r["start"] += by
                    r["end"] += by
    return [{"seconds": [sim.iteration_seconds], "records": ranks[r], "steps": {1: (0.0, sim.iteration_seconds)}}
            for r in sorted(ranks)]


def test_the_simulators_own_timeline_has_no_gap(bench: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    out = bench.analyse(plan, sim, records_of(sim, bench))
    assert out["simulator_error"] == pytest.approx(0.0)
    assert out["instructions"]
    for i in out["instructions"]:
        assert i["measured_seconds"] == pytest.approx(i["simulated_seconds"]), i
    for r in out["ranks"]:
        assert r["measured_compute_seconds"] == pytest.approx(r["simulated_compute_seconds"])
        assert r["measured_idle_seconds"] == pytest.approx(r["simulated_idle_seconds"])
        assert r["measured_before_first_seconds"] == pytest.approx(r["simulated_before_first_seconds"])
        assert r["measured_after_last_seconds"] == pytest.approx(r["simulated_after_last_seconds"])
    # A V on 2 ranks crosses ranks at every stage boundary: some instruction waits for one.
    waits = out["waits_on_transfers"]
    assert waits["count"] > 0
    assert all(0.0 <= w["lag_seconds"] < 0.1 for w in waits["waits"]), waits
    # Replayed in the ranks' orders, the step is the simulated one (its compute's span; the
    # replay prices every transfer at the median one), whichever durations it takes: here they
    # are all the simulator's.
    compute = [t for t in sim.tasks if t.kind in bench.COMPUTE]
    span = max(t.end for t in compute) - min(t.start for t in compute)
    replays = out["replays"]
    assert replays["recorded_seconds"] == pytest.approx(span, rel=0.02)
    assert replays["medians_seconds"] == pytest.approx(replays["recorded_seconds"])
    assert replays["simulated_durations_seconds"] == pytest.approx(replays["recorded_seconds"])


def test_a_late_input_shows_as_lag_and_idle(bench: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    base = bench.analyse(plan, sim, records_of(sim, bench))
    # An instruction that waited for another rank's output in the simulated step, made 5 ms late
    # with everything after it on its rank (its input landing late, say): the same wait, 5 ms
    # more lag; its rank 5 ms more idle; the other rank and every duration as before.
    first = base["waits_on_transfers"]["waits"][0]
    key = (first["kind"], first["stage"], first["micro_batch"])
    delayed = bench.analyse(plan, sim, records_of(sim, bench, late=key, by=0.005))
    again = [w for w in delayed["waits_on_transfers"]["waits"]
             if (w["kind"], w["stage"], w["micro_batch"]) == key]
    assert len(again) == 1
    assert again[0]["lag_seconds"] == pytest.approx(first["lag_seconds"] + 0.005, abs=1e-9)
    idle0 = {r["rank"]: r["measured_idle_seconds"] for r in base["ranks"]}
    idle = {r["rank"]: r["measured_idle_seconds"] for r in delayed["ranks"]}
    for rank in idle0:
        assert idle[rank] == pytest.approx(idle0[rank] + (0.005 if rank == first["rank"] else 0.0), abs=1e-9)
    for before, after in zip(base["instructions"], delayed["instructions"]):
        assert after["measured_seconds"] == pytest.approx(before["measured_seconds"])
    # The replay starts every instruction as early as its rank and inputs allow: a step made
    # late by a wait alone replays as the step without it.
    assert delayed["replays"]["recorded_seconds"] == pytest.approx(base["replays"]["recorded_seconds"])


def test_a_longer_instruction_lengthens_the_replay_with_recorded_durations_only(bench: Any,
                                                                               v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    ranks = records_of(sim, bench)
    base = bench.analyse(plan, sim, ranks)
    # One instruction 5 ms longer in the records (everything after it on its rank moved along):
    # the replay with the recorded durations grows, and by at most those 5 ms; with the medians
    # it stays (one of the stage's micro-batches moves no median of 4).
    target = ranks[0]["records"][0]
    key = (target["kind"], target["stage"], target["micro_batch"])
    longer = records_of(sim, bench, late=None)
    for value in longer:
        items = sorted(value["records"], key=lambda r: r["start"])
        hit = [i for i, r in enumerate(items) if (r["kind"], r["stage"], r["micro_batch"]) == key]
        if hit:
            items[hit[0]]["end"] += 0.005
            for r in items[hit[0] + 1:]:
                r["start"] += 0.005
                r["end"] += 0.005
    out = bench.analyse(plan, sim, longer)
    grown = out["replays"]["recorded_seconds"] - base["replays"]["recorded_seconds"]
    assert 0.0 < grown <= 0.005 + 1e-9
    assert out["replays"]["medians_seconds"] == pytest.approx(base["replays"]["medians_seconds"])
