"""The torch DDP baseline of the benchmarks trains like a single process.

compare.py sets graphpipe's pipelines against plain data parallelism; that is only fair if the
DDP baseline computes the same training: N steps on 2 ranks (each on its share of the batch,
the losses weighted so the averaged gradient is the global batch's) must give the parameters of
single-process SGD on the same batches, in float64 to a tight tolerance. The emulated DDP model
(compare.py --emulate) must hand DDP a zero gradient for every parameter and wait as long as
the cost model says.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from baselines.torch_ddp import EmulatedDDPModel, emulation_segments, shard, shard_inputs, train_rank  # noqa: E402

from graphpipe.models import default_loss  # noqa: E402
from graphpipe.testing import reference_training, run_ranks, seeded_batches  # noqa: E402

LR = 0.05
STEPS = 3


def single_process(spec: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    model, _, batches = seeded_batches(spec, STEPS)
    model = model.double()
    double = [(tuple(t.double() if t.is_floating_point() else t for t in x), y.double() if y.is_floating_point() else y)
              for x, y in batches]
    losses = reference_training(model, double, default_loss(spec), LR)
    return losses, {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("spec", ["mmt:branches=2,depth=1", "dlrm", "candle_uno:batch=7"])
def test_ddp_on_two_ranks_equals_single_process_float64(spec: str) -> None:
    # candle_uno:batch=7 cuts the batch 4 + 3: an unweighted mean per rank would be wrong there.
    losses, params = single_process(spec)
    results = run_ranks(train_rank, 2, spec, STEPS, LR, "float64", timeout=120)
    assert all(r.ok for r in results), [f"{r.error_type}: {r.message}" for r in results if not r.ok]
    moved = 0
    for r in results:
        got = r.value["parameters"]
        assert set(got) == set(params)
        for name, value in got.items():
            assert value.dtype == torch.float64
            torch.testing.assert_close(value, params[name], rtol=1e-12, atol=1e-14, msg=name)
        torch.testing.assert_close(torch.tensor(r.value["losses"]), torch.tensor(losses), rtol=1e-12, atol=0.0)
    # the check has teeth: training moved the parameters far beyond the tolerance
    initial = {n: p.detach().double() for n, p in seeded_batches(spec, 0)[0].named_parameters()}
    moved = max(float((params[n] - initial[n]).abs().max()) for n in params)
    assert moved > 1e-6


def test_shards_cover_the_batch_once() -> None:
    assert [shard(7, r, 2) for r in range(2)] == [(0, 4), (4, 3)]
    assert [shard(8, r, 4) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    x = torch.arange(10).reshape(5, 2)
    rows = torch.cat([shard_inputs((x,), r, 3)[0] for r in range(3)])
    assert torch.equal(rows, x)
    with pytest.raises(ValueError, match="at least 4 rows"):
        shard(3, 0, 4)


def test_emulated_model_waits_and_gives_every_parameter_a_zero_gradient() -> None:
    import graphpipe

    spec = "candle_uno:size=small"
    model, inputs, _ = seeded_batches(spec, 0)
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(1, 2, 4), repeats=1, warmup=0)
    emulation = emulation_segments(graph, 4, forward_seconds=0.02, backward_seconds=0.04, optimizer_seconds=0.0)
    names = [n for segment, _, _ in emulation.segments for n in segment]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())  # each parameter once
    assert emulation.forward_seconds == pytest.approx(0.02) and emulation.backward_seconds == pytest.approx(0.04)
    assert len(emulation.segments) > 1  # the backward releases gradients step by step
    (x,) = shard_inputs(inputs, 0, 2)[:1]
    emulated = EmulatedDDPModel(model, emulation, torch.Size((4, 1)), torch.float32)
    start = time.perf_counter()
    out = emulated(x)
    forward = time.perf_counter() - start
    assert out.shape == (4, 1) and torch.count_nonzero(out) == 0
    start = time.perf_counter()
    out.sum().backward()
    backward = time.perf_counter() - start
    assert forward >= 0.02 and backward >= 0.04
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0, name
