"""The culprit is named: rank 1 of a 3-stage chain stuck in its forward (or its backward) for
three timeouts, timeout=5. Without the flight recorder, the first rank to time out (2) blamed
itself and rank 0 named rank 2's timeout. Now:

- every rank's error names rank 1 as stuck, what it was doing (instruction, micro-batch) and
  what rank 0 and rank 2 waited for; the survivors within the timeout + 5 s, rank 1 itself once
  it wakes (naming itself, not a peer that left);
- every rank wrote a flight recorder dump, and ``python -m graphpipe diagnose`` on them prints
  the first transfer no peer matched and rank 1 as the culprit;
- afterwards every rank's pipeline refuses to step, naming the failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest
import torch
from test_runtime_gold import make_model

from graphpipe.testing import run_ranks

TIMEOUT = 5.0
STUCK = 1
STALL = 3 * TIMEOUT
HERE = os.path.dirname(os.path.abspath(__file__))


def _stuck_worker(rank: int, world: int, where: str, folder: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential", replicate=False,
                          micro_batches=4, timeout=TIMEOUT, flight_recorder_dir=folder)
    calls = {"n": 0}
    if rank == STUCK and where == "forward":
        def stall_forward(module: Any, args: Any, output: Any) -> None:
            calls["n"] += 1
            if calls["n"] == 1:  # micro-batch 0's forward
                time.sleep(STALL)

        next(m for m in pipe.module.modules() if isinstance(m, torch.nn.Linear)).register_forward_hook(stall_forward)
    if rank == STUCK and where == "backward":
        def stall_backward(grad: torch.Tensor) -> torch.Tensor:
            calls["n"] += 1
            if calls["n"] == 1:  # micro-batch 0's backward
                time.sleep(STALL)
            return grad

        next(iter(pipe.parameters())).register_hook(stall_backward)
    out: dict[str, Any] = {"stage": pipe.stage}
    start = time.monotonic()
    try:
        pipe.step(*batches[0])
        out["error"] = None
    except Exception as exc:
        out.update(error=type(exc).__name__, message=str(exc), seconds=time.monotonic() - start)
    try:
        pipe.step(*batches[1])
    except Exception as exc:
        out["after"] = (type(exc).__name__, str(exc))
    return out


@pytest.mark.parametrize("where,token", [("forward", "1F0"), ("backward", "1B0")])
def test_every_rank_names_the_stuck_rank(tmp_path: Any, where: str, token: str) -> None:
    folder = str(tmp_path / "flight")
    results = run_ranks(_stuck_worker, 3, where, folder, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        got = r.value
        assert got["error"] == "PipelineTimeout", (r.rank, got)
        message = got["message"]
        # the culprit, what it was doing, and what each other rank waited for
        assert f"the pipeline failed on rank {STUCK}: PipelineTimeout: rank {STUCK} is stuck" in message, message
        assert f"rank {STUCK} is running {token} (" in message and "micro-batch 0" in message, message
        for other in (0, 2):  # each waits for rank 1 (in a transfer, or in the loss sum with the others)
            assert re.search(rf"rank {other} waits for ranks? ([0-9]+, )*{STUCK}\b", message), message
        if r.rank != STUCK:
            assert got["seconds"] < TIMEOUT + 5.0, got
        else:
            assert STALL <= got["seconds"] < STALL + TIMEOUT + 5.0, got
        assert got["after"][0] == "InputError" and f"rank {STUCK}: PipelineTimeout" in got["after"][1], got["after"]
    dumps = sorted(os.listdir(folder))
    assert dumps == ["rank0.json", "rank1.json", "rank2.json"], dumps
    # Run from tests/python, as the suite runs: `python -m graphpipe` then imports the installed
    # package (with its extension), not the repository's source folder.
    run = subprocess.run([sys.executable, "-m", "graphpipe", "diagnose", folder], capture_output=True, text=True,
                         timeout=60, cwd=HERE)
    assert run.returncode == 0, run.stderr
    assert f"culprit: rank {STUCK}: rank {STUCK} is running {token}" in run.stdout, run.stdout
    assert "first unmatched instruction: rank " in run.stdout, run.stdout
    assert f"rank {STUCK} never posted {STUCK}" in run.stdout, run.stdout
    print(f"\n{where}: " + "\n".join(f"rank {r.rank} after {r.value['seconds']:.1f} s" for r in results)
          + "\n" + run.stdout)
