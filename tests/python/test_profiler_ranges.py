"""torch.profiler sees the pipeline: every instruction a rank runs appears as a range named after
its schedule token (computes as ``graphpipe::<token>``, transfers as ``graphpipe::<token> post``
and ``... wait``), and the debug log names posted and completed transfers."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan

from graphpipe.testing import run_ranks


def _worker(rank: int, world: int, log_path: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("mmt")
    pipe = graphpipe.wrap(model, example, default_loss("mmt"), plan=hand_plan(model, example, world),
                          schedule="zb_graph", timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.01)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for k in range(2):
            pipe.step(*batches[k], optimizer=opt)
    names = [e.name for e in prof.events() if e.name.startswith("graphpipe::")]
    # The debug log: C++ writes to this process's stderr, redirected to a file for one step.
    graphpipe.set_log_level("debug")
    fd = os.open(f"{log_path}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        pipe.step(*batches[2], optimizer=opt)
    finally:
        os.dup2(saved, 2)
        os.close(fd)
        graphpipe.set_log_level("warn")
    with open(f"{log_path}.{rank}", encoding="utf-8") as f:
        log = f.read()
    return {"names": names, "log": log, "table": pipe.schedule_table()}


def test_profiler_trace_has_every_instruction_and_the_log_names_transfers() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        results = run_ranks(_worker, 3, os.path.join(tmp, "log"), timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        out = r.value
        # The schedule's own table: "rank R | 0F0 0SF0e0 ..." (zero-bubble: F, I, W, sends, receives).
        row = next(line for line in out["table"].splitlines() if line.startswith(f"rank {r.rank} |"))
        tokens = row.split("|", 1)[1].split()
        expected: list[str] = []
        for tok in tokens:
            transfer = any(code in tok for code in ("RF", "SF", "RB", "SB"))
            expected += [f"graphpipe::{tok} post", f"graphpipe::{tok} wait"] if transfer else [f"graphpipe::{tok}"]
        seen = set(out["names"])
        missing = [name for name in expected if name not in seen]
        assert not missing, f"rank {r.rank}: no profiler range for {missing[:5]}"
        # two steps: every compute range at least twice
        computes = [n for n in expected if not n.endswith(("post", "wait"))]
        assert all(out["names"].count(n) >= 2 for n in computes)
        assert "posted" in out["log"] and ("completed" in out["log"] or "waited long" in out["log"]), out["log"][-2000:]
