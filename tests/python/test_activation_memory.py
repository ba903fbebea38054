"""Measured activation memory per schedule against the simulator's prediction.

``step(record=True)`` counts the bytes autograd stashes for each rank's backward
(``Pipeline.peak_saved_activation_bytes``, through saved-tensor hooks). On 2 ranks with 4
micro-batches, 1F1B holds 2 micro-batches on the first stage and 1 on the last; fill-drain holds
4 on both: their measured peaks must scale exactly as the simulator's peak micro-batches in
flight. zb_graph, with memory to defer every W, holds all 4 until their W, but after its I a
micro-batch keeps only what its W reads (runtime/split_backward.h releases the rest): its peak
lies above the predicted count less one whole micro-batch and at most at the predicted count.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_runtime_gold import make_model

from graphpipe.testing import run_ranks

SCHEDULES = ["1f1b", "fill_drain", "zb_graph"]


def _worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    out = {}
    for schedule in SCHEDULES:
        model, example, batches = make_model("candle_uno")
        with graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential", schedule=schedule,
                            micro_batches=4, timeout=60) as pipe:
            pipe.step(*batches[0], record=True)
            predicted = graphpipe.simulate(pipe.plan, None, schedule)
            out[schedule] = {"measured": pipe.peak_saved_activation_bytes, "stage": pipe.stage,
                             "in_flight": [s.peak_in_flight for s in predicted.stages]}
    return out


def test_measured_activation_peaks_scale_as_predicted() -> None:
    results = run_ranks(_worker, 2, timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        got = r.value
        stage = got["1f1b"]["stage"]
        base_measured = got["1f1b"]["measured"]
        base_in_flight = got["1f1b"]["in_flight"][stage]
        assert base_measured > 0
        for schedule in SCHEDULES:
            ratio = got[schedule]["measured"] / base_measured
            predicted = got[schedule]["in_flight"][stage] / base_in_flight
            if schedule == "zb_graph":
                assert predicted - 1 / base_in_flight < ratio <= predicted + 1e-9, (schedule, got)
            else:
                assert ratio == pytest.approx(predicted), (schedule, got)
        assert got["fill_drain"]["measured"] > got["1f1b"]["measured"]
