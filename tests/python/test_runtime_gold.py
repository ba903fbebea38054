"""Gold test of the runtime: pipelined training over Gloo ranks equals single-process training.

For the multi-modal Transformer, DLRM, CANDLE-Uno and the sequential Transformer (small sizes),
partitioners {graphpipe, metis, sequential} x schedules {1f1b, fill_drain, zb_graph} x world
sizes {2, 3, 4}: the losses of 3 SGD steps and the parameters afterwards equal plain
single-process training on the same batches (torch.testing.assert_close, float32 defaults). By
default a representative subset runs (each model at each world size, partitioner and schedule
rotating, plus zb_graph with every partitioner for each model at one world size: 24 cases);
GRAPHPIPE_FULL_MATRIX=1 runs all 108. Each world size is one spawn of ranks that runs
all of its cases in a row.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest
import torch

from graphpipe.testing import reference_state, run_cases, run_ranks, train_pipeline

MODELS = ["mmt", "dlrm", "candle_uno", "transformer"]
PARTITIONERS = ["graphpipe", "metis", "sequential"]
SCHEDULES = ["1f1b", "fill_drain", "zb_graph"]
WORLDS = [2, 3, 4]
STEPS = 3
MICRO_BATCHES = 4
BATCH = 8
LR = 0.05


def _cases() -> list[tuple[str, str, str, int]]:
    if os.environ.get("GRAPHPIPE_FULL_MATRIX") == "1":
        return list(itertools.product(MODELS, PARTITIONERS, SCHEDULES, WORLDS))
    cases = []
    for i, model in enumerate(MODELS):
        for j, world in enumerate(WORLDS):
            cases.append((model, PARTITIONERS[(i + j) % 3], SCHEDULES[(i + j) % 2], world))
        # zb_graph (split backwards) with every partitioner, at a world size that rotates
        for partitioner in PARTITIONERS:
            cases.append((model, partitioner, "zb_graph", WORLDS[(i + PARTITIONERS.index(partitioner)) % 3]))
    return cases


CASES = _cases()


def make_model(name: str) -> tuple[torch.nn.Module, tuple, list[tuple[Any, Any]]]:
    """The model (seeded), its example inputs and STEPS (inputs, targets) batches."""
    from graphpipe.models import build_model

    torch.manual_seed(1234)
    model, example = build_model(f"{name}:batch={BATCH}")
    batches = []
    for k in range(STEPS):
        g = torch.Generator().manual_seed(100 + k)
        batches.append((model.example_inputs(BATCH, generator=g), model.example_targets(BATCH, generator=g)))
    return model, example, batches


def reference(name: str) -> dict[str, Any]:
    from graphpipe.models import default_loss

    model, _, batches = make_model(name)
    return reference_state(model, batches, default_loss(name), LR)


def train_case(name: str, partitioner: str, schedule: str, timeout: float = 60.0) -> dict[str, Any]:
    """Runs on every rank: wrap, STEPS SGD steps; this rank's losses and parameters."""
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model(name)
    pipe = graphpipe.wrap(
        model, example, default_loss(name), partitioner=partitioner, schedule=schedule,
        micro_batches=MICRO_BATCHES, timeout=timeout,
    )
    return train_pipeline(pipe, batches, LR) | {"stages": pipe.plan.num_stages}


def _world_worker(rank: int, world: int, cases: list[tuple[str, str, str]]) -> dict[tuple, Any]:
    return run_cases(train_case, cases)


_RESULTS: dict[int, list[Any]] = {}
_REFERENCES: dict[str, dict[str, Any]] = {}


def _results(world: int) -> list[Any]:
    if world not in _RESULTS:
        cases = [(m, p, s) for (m, p, s, w) in CASES if w == world]
        _RESULTS[world] = run_ranks(_world_worker, world, cases, timeout=120 + 60 * len(cases))
    return _RESULTS[world]


@pytest.mark.parametrize("name,partitioner,schedule,world", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_pipeline_matches_single_process(name: str, partitioner: str, schedule: str, world: int) -> None:
    results = _results(world)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    if name not in _REFERENCES:
        _REFERENCES[name] = reference(name)
    ref = _REFERENCES[name]
    seen: dict[str, torch.Tensor] = {}
    for r in results:
        got = r.value[(name, partitioner, schedule)]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        torch.testing.assert_close(got["losses"], ref["losses"])
        for k, v in got["params"].items():
            assert k not in seen, f"parameter {k} is held by two ranks"
            seen[k] = v
    assert set(seen) == set(ref["params"]), "the ranks together must hold every parameter exactly once"
    for k, v in seen.items():
        torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k: f"{k}: {m}")
