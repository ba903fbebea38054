"""benchmarks/receive_posting_bench.py's count of late landings per posting mode, fed the
simulator's own timeline of the V plan as two recorded steps, one per mode: no wait is late; a
landing 5 ms late in the one-ahead step counts there, once, and not in the other."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from test_sim_gap_bench import EXACT, LATE, records_of, v_plan

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("sim_gap_bench")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def v_run(bench: Any) -> tuple[Any, Any]:
    return v_plan(bench)


@pytest.fixture(scope="module")
def posting() -> Any:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module("receive_posting_bench")
    finally:
        sys.path.remove(str(BENCHMARKS))


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
