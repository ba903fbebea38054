"""The torch FSDP2 baseline of the benchmarks trains like a single process, and its emulated
form (compare.py --emulate) runs FSDP2's real collectives on zero gradients with the cost
model's waits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from baselines.torch_ddp import emulation_segments, shard_inputs  # noqa: E402
from baselines.torch_fsdp import emulated_model, layer_names, make_stepper, memory_bytes, train_rank  # noqa: E402

from graphpipe.models import build_model, default_loss  # noqa: E402
from graphpipe.testing import reference_training, run_ranks, seeded_batches  # noqa: E402

LR = 0.05
STEPS = 3
SPEC = "mmt:branches=2,depth=1"


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_fsdp2_on_two_ranks_equals_single_process_float64(micro_batches: int) -> None:
    model, _, batches = seeded_batches(SPEC, STEPS)
    model = model.double()
    double = [(tuple(t.double() for t in x), y.double() if y.is_floating_point() else y) for x, y in batches]
    losses = reference_training(model, double, default_loss(SPEC), LR)
    params = {n: p.detach() for n, p in model.named_parameters()}
    results = run_ranks(train_rank, 2, SPEC, STEPS, LR, "float64", micro_batches, timeout=120)
    assert all(r.ok for r in results), [f"{r.error_type}: {r.message}" for r in results if not r.ok]
    for r in results:
        assert set(r.value["parameters"]) == set(params)
        for name, value in r.value["parameters"].items():
            torch.testing.assert_close(value, params[name], rtol=1e-10, atol=1e-12, msg=name)
        torch.testing.assert_close(torch.tensor(r.value["losses"]), torch.tensor(losses), rtol=1e-10, atol=0.0)


def test_layers_are_the_blocks_of_the_branches() -> None:
    model, _ = build_model("mmt:branches=2,depth=2")
    assert layer_names(model) == ["branches.0.0", "branches.0.1", "branches.1.0", "branches.1.1"]
    assert memory_bytes(400.0, 50.0, 10.0, 4) == 100.0 + 50.0 + 20.0


def _emulated_rank(rank: int, world: int, spec: str) -> dict:
    import time

    import graphpipe

    model, inputs, batches = seeded_batches(spec, 2)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(1, 2, 4), repeats=1, warmup=0)
    emulation = emulation_segments(graph, 2, forward_seconds=0.02, backward_seconds=0.04, optimizer_seconds=0.01)
    fake = emulated_model(model, shard_inputs(tuple(inputs), rank, world), emulation)
    step = make_stepper(fake, rank, world, default_loss(spec), optimizer_wait=0.01)
    start = time.perf_counter()
    losses = [step(x, y) for x, y in batches]
    return {"seconds": time.perf_counter() - start, "losses": losses}


def test_emulated_fsdp2_runs_and_waits() -> None:
    results = run_ranks(_emulated_rank, 2, "mmt:branches=2,depth=1", timeout=120)
    assert all(r.ok for r in results), [f"{r.error_type}: {r.message}" for r in results if not r.ok]
    for r in results:
        assert r.value["seconds"] >= 2 * (0.02 + 0.04 + 0.01)
        assert r.value["losses"] == pytest.approx([r.value["losses"][0]] * 2)
