"""benchmarks/sim_gap_bench.py's analysis: fed the simulator's own timeline as the ranks'
records it finds no gap at all; a wait whose input lands 5 ms late shows as 5 ms more lag and
lateness on that wait, 5 ms more idle on its rank and among the waits the replay lacks; one
instruction 5 ms longer shows in the durations' spread, not in their medians; a stage with two
producers on two ranks waits for the later one. benchmarks/receive_posting_bench.py's count of late
landings per posting mode (the same analysis) counts a late landing in its own mode only."""

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
LATE = 0.005
# The records here are the simulator's, whose receives end where the data lands (a real
# executor's end where it lands them, just before their consumer): every gap is a wait.
EXACT = 1e-12


def import_benchmark(name: str) -> Any:
    """benchmarks/<name>.py as a module (the folder is not a package)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def bench() -> Any:
    return import_benchmark("sim_gap_bench")


@pytest.fixture(scope="module")
def v_run(bench: Any) -> tuple[Any, Any]:
    return v_plan(bench)


def v_plan(bench: Any) -> tuple[Any, Any]:
    """The V plan the benchmark runs (the sequential cut for 4 ranks, in a V on 2), simulated."""
    model, inputs = build_model(SPEC)
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(2, "cpu")
    doubled = bench.compare.doubled_sequential_cut(graph, devices, None)
    assert not doubled.reason, doubled.reason
    plan = graphpipe.plan(graph, devices, "manual", manual=doubled.labels, stage_devices=bench.compare.v_placement(2),
                          micro_batches=4, schedule="zb_graph", replicate=False)
    return plan, graphpipe.simulate(plan, devices, "zb_graph")


def records_of(plan: Any, sim: Any, bench: Any, late: tuple[str, int, int] | None = None,
               longer: bool = False) -> list[dict]:
    """The simulated step as each rank's records of one step (run 1): its compute tasks, and a
    receive per transfer task ending where the transfer lands. ``late``: that instruction
    (kind, stage, micro-batch) and everything after it on its rank LATE seconds later, and, unless
    ``longer``, its receives landing that much later too (``longer``: the instruction itself
    LATE seconds longer instead)."""
    ranks: dict[int, list[dict]] = {}
    for t in sim.tasks:
        if t.kind in bench.COMPUTE:
            ranks.setdefault(t.rank, []).append({"run": 1, "kind": t.kind, "stage": t.stage,
                                                 "micro_batch": t.micro_batch, "start": t.start, "end": t.end})
        elif t.kind in ("activation", "gradient"):
            edge = plan.edges[t.edge]
            ranks.setdefault(t.peer, []).append({
                "run": 1, "kind": "recv_activation" if t.kind == "activation" else "recv_gradient",
                "stage": edge.dst if t.kind == "activation" else edge.src, "micro_batch": t.micro_batch,
                "start": t.start, "end": t.end})
    if late is not None:
        for items in ranks.values():
            compute = sorted((r for r in items if r["kind"] in bench.COMPUTE), key=lambda r: r["start"])
            hit = [i for i, r in enumerate(compute) if (r["kind"], r["stage"], r["micro_batch"]) == late]
            if not hit:
                continue
            compute[hit[0]]["end"] += LATE if longer else 0.0
            moved = compute[hit[0] + 1:] if longer else compute[hit[0]:]
            if not longer:
                moved += [r for r in items if r["kind"] == bench.RECEIVES.get(late[0])
                          and (r["stage"], r["micro_batch"]) == late[1:]]
            for r in moved:
                r["start"] += LATE
                r["end"] += LATE
    return [{"seconds": [sim.iteration_seconds], "records": ranks[r], "steps": {1: (0.0, sim.iteration_seconds)}}
            for r in sorted(ranks)]


def test_the_simulators_own_timeline_has_no_gap(bench: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    out = bench.analyse(plan, sim, records_of(plan, sim, bench), EXACT)
    assert out["simulator_error"] == pytest.approx(0.0)
    assert out["instructions"]
    for i in out["instructions"]:
        assert i["measured_seconds"] == pytest.approx(i["simulated_seconds"]), i
    for r in out["ranks"]:
        for name in ("compute", "idle", "before_first", "after_last"):
            assert r[f"measured_{name}_seconds"] == pytest.approx(r[f"simulated_{name}_seconds"], abs=1e-12), name
    # A V on 2 ranks crosses ranks at every stage boundary: some instruction waits for a landing,
    # and it lands as the simulator's transfer does, never later than it allows.
    waits = out["waits_on_transfers"]["waits"]
    assert waits
    transfers = [t.end - t.start for t in sim.tasks if t.kind in ("activation", "gradient")]
    for w in waits:
        assert min(transfers) - 1e-12 <= w["lag_seconds"] <= max(transfers) + 1e-6, w
        assert w["late_seconds"] <= max(transfers) - min(transfers) + 1e-9, w
    # Every part of the gap is nothing; the replay's own model within 0.5% of the simulator's.
    parts = out["decomposition"]
    span = parts["simulated_step"]
    assert abs(parts["replay_against_simulator"]) < 5e-3 * span
    for name in ("medians_against_prices", "spread_around_medians"):
        assert parts[name] == pytest.approx(0.0, abs=1e-12), name
    assert abs(parts["waits_the_replay_lacks"]) < 5e-3 * span
    assert parts["set_up_and_close"] == pytest.approx(0.0, abs=1e-12)


def total(parts: dict[str, float]) -> float:
    return sum(v for k, v in parts.items() if k not in ("measured_step", "simulated_step"))


def test_a_late_landing_shows_as_lag_idle_and_waits_the_replay_lacks(bench: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    base = bench.analyse(plan, sim, records_of(plan, sim, bench), EXACT)
    first = base["waits_on_transfers"]["waits"][0]
    key = (first["kind"], first["stage"], first["micro_batch"])
    delayed = bench.analyse(plan, sim, records_of(plan, sim, bench, late=key), EXACT)
    again = [w for w in delayed["waits_on_transfers"]["waits"] if (w["kind"], w["stage"], w["micro_batch"]) == key]
    assert len(again) == 1
    assert again[0]["lag_seconds"] == pytest.approx(first["lag_seconds"] + LATE, abs=1e-9)
    assert again[0]["late_seconds"] == pytest.approx(first["late_seconds"] + LATE, abs=1e-9)
    idle0 = {r["rank"]: r["measured_idle_seconds"] for r in base["ranks"]}
    idle = {r["rank"]: r["measured_idle_seconds"] for r in delayed["ranks"]}
    for rank in idle0:
        assert idle[rank] == pytest.approx(idle0[rank] + (LATE if rank == first["rank"] else 0.0), abs=1e-9)
    # The replay starts each instruction as soon as its rank and inputs allow: the late landing
    # is among the waits it lacks, and the parts still add up to the measured gap.
    parts0, parts = base["decomposition"], delayed["decomposition"]
    assert 0.0 < parts["waits_the_replay_lacks"] - parts0["waits_the_replay_lacks"] <= LATE + 1e-9
    assert parts["spread_around_medians"] == pytest.approx(parts0["spread_around_medians"], abs=1e-12)
    assert total(parts) == pytest.approx(parts["measured_step"] - parts["simulated_step"], abs=1e-12)


def test_a_longer_instruction_shows_in_the_spread_not_the_medians(bench: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    ranks = records_of(plan, sim, bench)
    base = bench.analyse(plan, sim, ranks, EXACT)
    first = min((r for r in ranks[0]["records"] if r["kind"] in bench.COMPUTE), key=lambda r: r["start"])
    key = (first["kind"], first["stage"], first["micro_batch"])
    out = bench.analyse(plan, sim, records_of(plan, sim, bench, late=key, longer=True), EXACT)
    # One of the stage's 4 micro-batches 5 ms longer moves no median of 4; the replay with the
    # recorded durations grows, by at most those 5 ms.
    parts0, parts = base["decomposition"], out["decomposition"]
    assert parts["medians_against_prices"] == pytest.approx(parts0["medians_against_prices"], abs=1e-12)
    assert 0.0 < parts["spread_around_medians"] - parts0["spread_around_medians"] <= LATE + 1e-9
    assert total(parts) == pytest.approx(parts["measured_step"] - parts["simulated_step"], abs=1e-12)


def test_a_stage_with_two_producers_waits_for_the_later_one(bench: Any) -> None:
    """MMT's two branches on ranks 0 and 1 feed the fusion stage on rank 2: its forward waits for
    the later branch, so each of its waits lags the later producer's end by a transfer (taking the
    earlier one would read the branches' difference as lag), and the replay starts it after the
    later input too."""
    model, inputs = build_model("mmt:branches=2,depth=1")
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(3, "cpu")
    plan = graphpipe.plan(graph, devices, "graphpipe", micro_batches=4, schedule="1f1b", replicate=False)
    producers = sorted(e.src for e in plan.edges if e.dst == 2)
    assert producers == [0, 1] and [s.devices for s in plan.stages] == [[0], [1], [2]]
    sim = graphpipe.simulate(plan, devices, "1f1b")
    ends = {(t.stage, t.micro_batch): t.end for t in sim.tasks if t.kind == "forward"}
    # The branches end apart by more than any transfer lasts: the earlier end would be caught.
    transfers = [t.end - t.start for t in sim.tasks if t.kind in ("activation", "gradient")]
    assert abs(ends[(0, 0)] - ends[(1, 0)]) > max(transfers)
    out = bench.analyse(plan, sim, records_of(plan, sim, bench), EXACT)
    fusion = [w for w in out["waits_on_transfers"]["waits"] if (w["kind"], w["stage"]) == ("forward", 2)]
    assert fusion
    for w in fusion:
        assert min(transfers) - 1e-12 <= w["lag_seconds"] <= max(transfers) + 1e-9, w
    # The sending rank's compute during a lag: within it, and the sender's own timeline's.
    for w in out["waits_on_transfers"]["waits"]:
        assert 0.0 <= w["sender_busy_seconds"] <= w["lag_seconds"] + 1e-12, w
        sender = 1 if (w["kind"], w["stage"]) == ("forward", 2) else 2
        start = max(t.end for t in sim.tasks if t.kind in bench.COMPUTE and t.micro_batch == w["micro_batch"]
                    and t.rank == sender and (t.kind, t.stage) == (("forward", 1) if sender == 1 else
                                                                   ("backward", 2)))
        busy = sum(max(0.0, min(t.end, start + w["lag_seconds"]) - max(t.start, start))
                   for t in sim.tasks if t.kind in bench.COMPUTE and t.rank == sender)
        assert w["sender_busy_seconds"] == pytest.approx(busy, abs=1e-12), w
    parts = out["decomposition"]
    assert abs(parts["replay_against_simulator"]) < 5e-3 * parts["simulated_step"]
    assert abs(parts["waits_the_replay_lacks"]) < 5e-3 * parts["simulated_step"]
    assert total(parts) == pytest.approx(parts["measured_step"] - parts["simulated_step"], abs=1e-12)


# benchmarks/receive_posting_bench.py counts late landings per posting mode with this analysis.
@pytest.fixture(scope="module")
def posting() -> Any:
    return import_benchmark("receive_posting_bench")


def two_steps(one_ahead: list[dict], whole_step: list[dict]) -> list[dict]:
    """Each rank's records of two steps: run 1 (one ahead) and run 2 (the whole step), the second
    the first's records moved past its end."""
    ranks = []
    for a, b in zip(one_ahead, whole_step):
        span = max(a["steps"][1][1], b["steps"][1][1])
        moved = [dict(r, run=2, start=r["start"] + span, end=r["end"] + span) for r in b["records"]]
        ranks.append({"runs": {1: "one_ahead", 2: "whole_step"}, "steps": {1: a["steps"][1], 2: (span, 2 * span)},
                      "records": a["records"] + moved})
    return ranks


def test_late_landings_are_counted_in_their_own_mode(bench: Any, posting: Any, v_run: tuple[Any, Any]) -> None:
    plan, sim = v_run
    clean = records_of(plan, sim, bench)
    out = posting.late_waits(plan, sim, two_steps(clean, clean), EXACT)
    for mode in posting.MODES:
        assert out[mode]["steps"] == 1 and out[mode]["waits"] > 0 and out[mode]["late"] == 0, out
    first = bench.analyse(plan, sim, clean, EXACT)["waits_on_transfers"]["waits"][0]
    key = (first["kind"], first["stage"], first["micro_batch"])
    out = posting.late_waits(plan, sim, two_steps(records_of(plan, sim, bench, late=key), clean), EXACT)
    assert out["one_ahead"]["late"] == 1 and out["whole_step"]["late"] == 0, out
    assert out["one_ahead"]["late_seconds_per_step"] == pytest.approx(LATE, abs=1e-9)
