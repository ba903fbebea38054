"""A stage that owns no parameter trains with the README's quick-start loop on every rank:
``torch.optim.SGD(pipe.parameters(), ...)`` is built on every rank (a parameter-free stage's
``parameters()`` is one empty frozen placeholder, which torch's optimizers accept and which never
changes) and ``pipe.step(..., optimizer=opt)`` steps it, with the same result as one process.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
import corpus_models as cm

from graphpipe.testing import run_ranks

# direct_buffer on 3 ranks with the middle stage (tanh, a buffer read, a product) holding no
# parameter.
PARAMETER_FREE_MIDDLE = {"x": 0, "center": 0, "clone": 0, "sub": 0, "fc1": 0, "tanh": 1, "scale": 1, "mul": 1, "fc2": 2}
LR = 0.05


def _quick_start_loop(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.runtime import manual_plan

    case = cm.build("direct_buffer", 2)
    plan = manual_plan(graphpipe.trace(case.model, case.example), PARAMETER_FREE_MIDDLE, cm.MICRO_BATCHES)
    with graphpipe.wrap(case.model, case.example, case.loss_fn, plan=plan, timeout=60) as pipe:
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)  # the README's line, on every rank
        losses = [pipe.step(inputs, targets, optimizer=opt) for inputs, targets in case.batches]
        return {"losses": torch.stack(losses), "state": pipe.full_state_dict(),
                "named": [n for n, _ in pipe.named_parameters()], "shard": sorted(pipe.state_dict())}


def test_parameter_free_stage_runs_the_quick_start_loop_on_every_rank() -> None:
    results = run_ranks(_quick_start_loop, 3, timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    assert [r.value["named"] == [] for r in results] == [False, True, False], "stage 1 holds no parameter"
    ref = cm.reference("direct_buffer", 2, LR)
    for r in results:
        torch.testing.assert_close(r.value["losses"], ref["losses"], rtol=1e-9, atol=1e-10)
    state = results[0].value["state"]
    assert list(state) == list(ref["state"])  # the placeholder is in no state dict
    for k, v in state.items():
        torch.testing.assert_close(v, ref["state"][k], rtol=1e-9, atol=1e-10, msg=lambda m, k=k: f"{k}: {m}")
    cm.build("direct_buffer", 2).model.load_state_dict(state, strict=True)
