"""No hangs: a rank killed (or stuck) in the middle of an iteration makes every surviving rank
raise a named graphpipe error (PeerError / PipelineTimeout, naming the peer rank and the
instruction) within twice the configured timeout; the suite itself never waits without bound."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan

from graphpipe.testing import fail_in_second_step, run_ranks, steps_until_error, survivor_errors

TIMEOUT = 5.0
VICTIM = 1


def _fault_worker(rank: int, world: int, mode: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"),
                          plan=hand_plan(model, example, world), timeout=TIMEOUT)
    if rank == VICTIM:
        fail_in_second_step(pipe, mode, stall_seconds=2.5 * TIMEOUT)
    return steps_until_error(pipe, batches)


@pytest.mark.parametrize("mode", ["kill", "stuck"])
def test_dead_or_stuck_peer_raises_named_error(mode: str) -> None:
    started = time.monotonic()
    results = run_ranks(_fault_worker, 3, mode, timeout=60 + 8 * TIMEOUT)
    assert time.monotonic() - started < 120
    for got in survivor_errors(results, VICTIM, TIMEOUT):
        assert re.search(r"peer rank \d", got["message"]), got["message"]
        assert re.search(r"\b\d(RF|SF|RB|SB)\d+e\d+\b", got["message"]), got["message"]
        assert "edge" in got["message"]
    if mode == "stuck":
        # the rank waiting on the stuck one times out (PipelineTimeout), not a connection error
        assert any(r.value["error"] == "PipelineTimeout" for r in results if r.rank != VICTIM and r.ok)
