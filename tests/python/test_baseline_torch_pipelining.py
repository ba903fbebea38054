"""The torch.distributed.pipelining baseline of the benchmarks trains like a single process.

A benchmark against a baseline that computes something else would be meaningless: this checks
that the chain split (with skip tensors forwarded) gives the single-process losses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "torch_pipelining.py"


def _script_env() -> dict[str, str]:
    """The script's environment: the baselines, and the graphpipe this test imported (the installed
    one under CI, the source tree where PYTHONPATH names it), so the script never runs another copy."""
    import graphpipe

    package_root = Path(graphpipe.__file__).resolve().parents[1]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(SCRIPT.parents[1]), str(package_root)]))


@pytest.mark.parametrize(
    ("spec", "world", "schedule"),
    [("mmt:branches=2,depth=1", 2, "1f1b"), ("dlrm", 3, "1f1b"), ("candle_uno", 2, "fill_drain")],
)
def test_chain_pipeline_matches_single_process(spec: str, world: int, schedule: str, tmp_path) -> None:
    env = _script_env()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), spec, "--world", str(world), "--schedule", schedule],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(losses["pipelined"]), torch.tensor(losses["reference"]))


@pytest.mark.parametrize(("spec", "schedule"), [("mmt:branches=2,depth=1", "1f1b"), ("dlrm", "fill_drain")])
def test_emulated_stages_run_on_four_ranks(spec: str, schedule: str, tmp_path) -> None:
    # compare.py --emulate --world 4: graphpipe's EmulatedStage returns zeros that all require
    # grad, where the real stage relays model inputs (and DLRM's indices) without a history; the
    # next stage, built from the real examples, sends back None for those, and torch's stage
    # backward failed ("grad can be implicitly created only for scalar outputs"). These specs
    # have such relayed outputs at 4 stages (checked in test_grads_as_example_detaches_...).
    env = _script_env()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), spec, "--world", "4", "--schedule", schedule, "--micro-batches", "4",
         "--steps", "2", "--emulate", "0.001"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(losses["pipelined"]) == 2


def test_grads_as_example_detaches_what_the_example_does_not_differentiate() -> None:
    sys.path.insert(0, str(SCRIPT.parents[1]))
    from baselines.torch_pipelining import (
        GradsAsExample,
        balanced_chain_labels,
        chain_stage_modules,
        pin_integer_consumers,
        stage_examples,
    )

    from graphpipe.emulation import EmulatedStage
    from graphpipe.testing import seeded_batches
    from graphpipe.trace import trace_module

    model, inputs, _ = seeded_batches("mmt:branches=2,depth=1", 1)
    traced = trace_module(model, inputs)
    labels = pin_integer_consumers(traced.module, balanced_chain_labels(traced.graph, 4), traced.placeholder_values)
    stages = chain_stage_modules(traced.module, labels, 4)
    args, example_out = stage_examples(stages, tuple(inputs), 2)[0]
    wanted = [t.requires_grad for t in example_out]
    assert False in wanted and True in wanted  # stage 0 relays an input: the case that failed
    emulated = EmulatedStage(stages[0], 0.0, 0.0)
    assert all(t.requires_grad for t in emulated(*args))  # the emulated stage on its own
    wrapped = GradsAsExample(emulated, example_out)
    assert [t.requires_grad for t in wrapped(*args)] == wanted
    real = GradsAsExample(stages[0], example_out)  # a real stage is unchanged
    assert [t.requires_grad for t in real(*args)] == wanted
    assert {id(p) for p in real.parameters()} == {id(p) for p in stages[0].parameters()}


@pytest.mark.parametrize(("spec", "points", "micro_batches"),
                         [("transformer:size=small", ["blocks.2"], 2),
                          ("mmt:branches=3,depth=1", ["branches.1", "branches.2"], 4)])
def test_front_end_trains_like_a_single_process(spec: str, points: list[str], micro_batches: int) -> None:
    # torch's own front end (pipeline() over torch.export, Pipe.build_stage, Schedule1F1B): the
    # last rank's losses are single-process training's, on a chain and on a multi-input model
    # whose inputs enter at stage 0 (EnterAtStageZero) and are sent on to the stages that read them.
    sys.path.insert(0, str(SCRIPT.parents[1]))
    from baselines.torch_pipeline_frontend import train_rank

    from graphpipe.models import default_loss
    from graphpipe.testing import reference_training, run_ranks, seeded_batches

    world = len(points) + 1
    results = run_ranks(train_rank, world, spec, points, micro_batches, 2, 0.01, timeout=180)
    assert all(r.ok for r in results), [f"{r.error_type}: {r.message[-500:]}" for r in results if not r.ok]
    model, _, batches = seeded_batches(spec, 2)
    reference = reference_training(model, batches, default_loss(spec), 0.01)
    torch.testing.assert_close(torch.tensor(results[-1].value), torch.tensor(reference), rtol=1e-5, atol=1e-6)


def test_front_end_says_why_it_cannot_take_a_split() -> None:
    sys.path.insert(0, str(SCRIPT.parents[1]))
    from baselines.torch_pipeline_frontend import refusal, split_points

    from graphpipe.models import build_model

    assert split_points([["a", "a.x"], ["b.y", "b"], [None, "c"]]) == ["b.y", "c"]
    with pytest.raises(ValueError, match="module calls only"):
        split_points([["a"], ["b"], ["b"]])
    model, inputs = build_model("mmt:branches=2,depth=1")
    assert refusal(model, tuple(inputs), ["branches.1"], 2) == ""
    model, inputs = build_model("mmt:branches=4,depth=1")
    reason = refusal(model, tuple(inputs), ["branches.1", "branches.2", "branches.3"], 4)
    assert "ordered the stages 0 -> 2 -> 1 -> 3" in reason
    model, inputs = build_model("transformer:size=small")
    assert refusal(model, tuple(inputs), ["blocks.2"], 2) == ""
