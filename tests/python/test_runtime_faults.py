"""No hangs: a rank killed (or stuck) in the middle of an iteration makes every surviving rank
raise a named graphpipe error (PeerError / PipelineTimeout, naming the peer rank and the
instruction) within twice the configured timeout; the suite itself never waits without bound."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest
import torch

from graphpipe.runtime.testing import run_ranks
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan

TIMEOUT = 5.0
VICTIM = 1


def _fault_worker(rank: int, world: int, mode: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"),
                          plan=hand_plan(model, example, world), timeout=TIMEOUT)
    if rank == VICTIM:
        calls = {"n": 0}

        def hook(module: Any, args: Any, output: Any) -> None:
            calls["n"] += 1
            if calls["n"] == pipe.num_micro_batches + 2:  # second iteration, second micro-batch
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                else:
                    time.sleep(2.5 * TIMEOUT)

        first = next(m for m in pipe.module.modules() if isinstance(m, torch.nn.Linear))
        first.register_forward_hook(hook)
    start = time.monotonic()
    try:
        for inputs, targets in batches:
            start = time.monotonic()
            pipe.step(inputs, targets)
    except graphpipe.GraphpipeError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


@pytest.mark.parametrize("mode", ["kill", "stuck"])
def test_dead_or_stuck_peer_raises_named_error(mode: str) -> None:
    started = time.monotonic()
    results = run_ranks(_fault_worker, 3, mode, timeout=60 + 8 * TIMEOUT)
    assert time.monotonic() - started < 120
    for r in results:
        if r.rank == VICTIM:
            continue
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        got = r.value
        assert got["error"] in ("PeerError", "PipelineTimeout"), got
        assert got["elapsed"] < 2 * TIMEOUT, got
        assert re.search(r"peer rank \d", got["message"]), got["message"]
        assert re.search(r"\b\d(RF|SF|RB|SB)\d+e\d+\b", got["message"]), got["message"]
        assert "edge" in got["message"]
    if mode == "stuck":
        # the rank waiting on the stuck one times out (PipelineTimeout), not a connection error
        assert any(r.value["error"] == "PipelineTimeout" for r in results if r.rank != VICTIM and r.ok)
