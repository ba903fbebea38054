"""torch's schedules with several stages per rank (interleaved 1F1B, interleaved zero-bubble,
ZB-V, DualPipeV), as compare.py runs them through torch's front end, train like a single
process: the baseline the main job measures graphpipe against must compute the same thing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from baselines.torch_pipeline_frontend import (  # noqa: E402
    MULTI_STAGE_SCHEDULES,
    SPLIT_BACKWARD_SCHEDULES,
    make_multi_stage_stepper,
    stage_placement,
)

from graphpipe.models import default_loss  # noqa: E402
from graphpipe.testing import reference_training, run_ranks, seeded_batches  # noqa: E402

LR = 0.05
STEPS = 3
SPEC = "transformer:depth=4,batch=8"
POINTS = ["blocks.1", "blocks.2", "blocks.3"]  # 4 stages: 2 per rank on 2 ranks
# Cuts inside the blocks, between a block's activation and its second linear layer: each stage
# but the last hands on the block's residual stream, which its own norm2 saved for its backward.
INSIDE = ["blocks.0.fc2", "blocks.1.fc2", "blocks.2.fc2"]


def _train_rank(rank: int, world: int, schedule: str, points: list[str]) -> dict:
    torch.set_num_threads(1)
    model, inputs, batches = seeded_batches(SPEC, STEPS)
    model = model.double()
    batches = [(tuple(t.double() for t in x), y) for x, y in batches]
    step = make_multi_stage_stepper(model, tuple(t.double() for t in inputs), points, rank, world,
                                    default_loss(SPEC), micro_batches=4, schedule=schedule, lr=LR)
    losses = [step(x, y) for x, y in batches]
    parameters = {name.removeprefix("model."): p.detach().clone()
                  for module in step.stage_modules.values() for name, p in module.named_parameters()}
    return {"losses": losses, "parameters": parameters}


def test_stage_placement_loops_or_folds_into_a_v() -> None:
    assert stage_placement("interleaved zb", 2, 6) == [[0, 2, 4], [1, 3, 5]]
    assert stage_placement("zbv", 3, 6) == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match="exactly 2 stages per rank"):
        stage_placement("dualpipev", 2, 6)
    with pytest.raises(ValueError, match="do not divide"):
        stage_placement("interleaved 1f1b", 2, 5)


def _assert_equals_single_process(schedule: str, points: list[str]) -> None:
    model, _, batches = seeded_batches(SPEC, STEPS)
    model = model.double()
    batches = [(tuple(t.double() for t in x), y) for x, y in batches]
    losses = reference_training(model, batches, default_loss(SPEC), LR)
    expected = {n: p.detach() for n, p in model.named_parameters()}
    results = run_ranks(_train_rank, 2, schedule, points, timeout=180)
    assert all(r.ok for r in results), [f"{r.error_type}: {r.message}" for r in results if not r.ok]
    got: dict[str, torch.Tensor] = {}
    for r in results:
        got.update(r.value["parameters"])
    assert set(got) == set(expected)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], rtol=1e-10, atol=1e-12, msg=name)
    # The loss comes back on the rank holding the last stage: rank 1 when looping, rank 0 in a V.
    holder = 0 if MULTI_STAGE_SCHEDULES[schedule][1] == "v" else 1
    torch.testing.assert_close(torch.tensor(results[holder].value["losses"]), torch.tensor(losses), rtol=1e-10, atol=0.0)


@pytest.mark.parametrize("schedule", list(MULTI_STAGE_SCHEDULES))
def test_two_stages_per_rank_equal_single_process_float64(schedule: str) -> None:
    _assert_equals_single_process(schedule, POINTS)


@pytest.mark.parametrize("schedule", sorted(SPLIT_BACKWARD_SCHEDULES))
def test_split_backward_trains_on_cuts_whose_outputs_the_stage_saved(schedule: str) -> None:
    # torch detaches a stage's outputs in place between its input and weight backward; where the
    # stage saved one of them for its own backward, torch 2.13's weight backward failed ("a saved
    # tensor that has been detached in-place"). FreshOutputs hands torch copies.
    _assert_equals_single_process(schedule, INSIDE)
