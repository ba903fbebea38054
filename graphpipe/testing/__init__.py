"""Helpers for graphpipe's tests (and the benchmarks that reuse them): seeded models and
batches, reference training, gold comparisons and fault helpers. The launcher of local ranks
they use is :mod:`graphpipe.local_ranks` (re-exported here), which shipped code uses too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from graphpipe.local_ranks import RankResult, expect_ok, run_ranks

__all__ = ["RankResult", "expect_ok", "reference_state", "reference_training", "run_cases", "run_ranks",
           "seeded_batches"]


def run_cases(train: Callable[..., Any], cases: list[tuple]) -> dict[tuple, Any]:
    """On one rank: ``train(*case)`` for each case in order, by case. The first case that raises
    is reported as ``{"error": "Type: message"}`` and ends the run: its pipeline may have left the
    ranks out of step, so later cases would only report that."""
    out: dict[tuple, Any] = {}
    for case in cases:
        try:
            out[case] = train(*case)
        except Exception as exc:
            out[case] = {"error": f"{type(exc).__name__}: {exc}"}
            break
    return out


def seeded_batches(spec: str, steps: int, model_seed: int = 0, data_seed: int = 1) -> tuple[Any, tuple, list]:
    """(model, example inputs, [(inputs, targets)] * steps) of a ``graphpipe.models`` spec, the
    same in every process that asks: the model from ``model_seed``, the batches from ``data_seed``."""
    from graphpipe.models import build_model

    torch.manual_seed(model_seed)
    model, inputs = build_model(spec)
    generator = torch.Generator().manual_seed(data_seed)
    batch = inputs[0].shape[0]
    data = [(model.example_inputs(batch, generator), model.example_targets(batch, generator)) for _ in range(steps)]
    return model, inputs, data


def reference_state(model: Any, batches: list, loss_fn: Callable[..., Any], lr: float) -> dict[str, Any]:
    """Plain single-process SGD over ``batches``: each step's loss (a tensor) and the parameters
    afterwards, what every pipeline must reproduce (:func:`train_pipeline` returns the same)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def reference_training(model: Any, batches: list, loss_fn: Callable[..., Any], lr: float) -> list[float]:
    """Plain single-process SGD over ``batches``: the losses every pipeline must reproduce."""
    return [float(loss) for loss in reference_state(model, batches, loss_fn, lr)["losses"]]


def train_pipeline(pipe: Any, batches: list, lr: float) -> dict[str, Any]:
    """On one rank: SGD over ``batches`` with ``pipe`` (a rank without parameters steps nothing);
    the losses every rank got and this rank's parameters afterwards, what a gold test compares
    with :func:`reference_training`."""
    params = list(pipe.parameters())
    optimizer = torch.optim.SGD(params, lr=lr) if params else None
    losses = []
    for inputs, targets in batches:
        if optimizer:
            optimizer.zero_grad()
        losses.append(pipe.step(inputs, targets))
        if optimizer:
            optimizer.step()
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in pipe.named_parameters()}}


def fail_in_second_step(pipe: Any, mode: str, stall_seconds: float = 0.0) -> None:
    """Makes this rank die (``mode="kill"``: SIGKILL) or stall for ``stall_seconds``
    (``"stuck"``) in the second micro-batch's forward of the second iteration: a fault in the
    middle of a step, for the failure tests. Any other mode raises ValueError naming it: a
    misspelt mode must not arm a fault that never fires."""
    import signal

    if mode not in ("kill", "stuck"):
        raise ValueError(f"fail_in_second_step: mode must be 'kill' or 'stuck', got {mode!r}")

    calls = {"n": 0}

    def hook(module: Any, args: Any, output: Any) -> None:
        calls["n"] += 1
        if calls["n"] == pipe.num_micro_batches + 2:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                time.sleep(stall_seconds)

    first = next(m for m in pipe.module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(hook)


def steps_until_error(pipe: Any, batches: list) -> dict[str, Any]:
    """Steps ``pipe`` over ``batches``; the graphpipe error that stopped it (type and message)
    and how long the failing step took, or ``error: None``."""
    from graphpipe.errors import GraphpipeError

    start = time.monotonic()
    try:
        for inputs, targets in batches:
            start = time.monotonic()
            pipe.step(inputs, targets)
    except GraphpipeError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


def survivor_errors(results: list[RankResult], victim: int, timeout: float) -> list[dict[str, Any]]:
    """The :func:`steps_until_error` results of every rank but ``victim``, checked: each ran,
    stopped with ``PeerError`` or ``PipelineTimeout``, and within twice ``timeout``."""
    survivors = []
    for r in results:
        if r.rank == victim:
            continue
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        assert r.value["error"] in ("PeerError", "PipelineTimeout"), r.value
        assert r.value["elapsed"] < 2 * timeout, r.value
        survivors.append(r.value)
    return survivors


def reported_results(results: list[RankResult], victim: int, kind: str) -> list[RankResult]:
    """The ranks of a fault case that must have reported: all of ``results``, checked to have
    run to their end, but a ``victim`` killed (``kind == "kill"``), checked to have died so."""
    reported = []
    for r in results:
        if r.rank == victim and kind == "kill":
            assert not r.ok and r.error_type == "Killed", (r.error_type, r.message)
            continue
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        reported.append(r)
    return reported
