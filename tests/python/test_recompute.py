"""Activation recomputation: a plan that fits its memory limit only by recomputing a stage's
forward in its backward trains equal to single-process training, under 1F1B and zb_graph; and
the automatic partitioners' DPs find such plans themselves (partition/recompute.h).

The model's stage 0 holds wide elementwise activations and few parameters: under a 60 kB limit
its two micro-batches in flight do not fit, but its received inputs (none: it reads the model
input) plus one micro-batch's activations do, so the planner marks it ``recompute`` and charges
the forward again in its backward. The runtime recomputes it with torch's non-reentrant
checkpoint.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from graphpipe.testing import run_ranks, train_pipeline

LIMIT = 60_000
ASSIGNMENT = {"blocks.0": 0, "blocks.1": 0, "blocks.2": 1, "blocks.3": 1, "head": 1}
STEPS, LR, MICRO_BATCHES = 3, 0.05, 4


class Wide(nn.Module):
    """Residual blocks of elementwise layers: many activations per parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.GELU(), nn.Tanh(), nn.GELU(), nn.Tanh()) for _ in range(4)])
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) * 2.0 + x
        return self.head(x)


def _setup() -> tuple[nn.Module, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = Wide()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(64, 32, generator=g), torch.randn(64, 4, generator=g)) for _ in range(STEPS)]
    return model, batches[0][0], batches


def _plan(model: nn.Module, example: torch.Tensor, limit: float | None) -> Any:
    import graphpipe
    from graphpipe.runtime import manual_plan

    graph = graphpipe.trace(model, (example,))
    return manual_plan(graph, ASSIGNMENT, MICRO_BATCHES, optimizer="sgd", memory_limit=limit), graph


def test_the_planner_recomputes_only_the_stage_that_does_not_fit() -> None:
    model, example, _ = _setup()
    roomy, _ = _plan(model, example, None)
    tight, _ = _plan(model, example, LIMIT)
    assert not any(s.recompute for s in roomy.stages)
    assert [s.recompute for s in tight.stages] == [True, False]
    assert roomy.stages[0].memory_bytes > LIMIT >= tight.stages[0].memory_bytes
    # The forward runs again in the backward: charged there, and in the predicted step.
    assert tight.stages[0].backward_seconds == pytest.approx(roomy.stages[0].backward_seconds + roomy.stages[0].forward_seconds)
    assert tight.predicted_iteration_seconds > roomy.predicted_iteration_seconds
    # Split for zero-bubble: stage 0 reads the model input, so its I walks nothing and the
    # recomputation runs in its W (which uses the activations first).
    assert tight.stages[0].backward_input_seconds == roomy.stages[0].backward_input_seconds == 0.0
    assert tight.stages[0].backward_weight_seconds == pytest.approx(
        roomy.stages[0].backward_weight_seconds + roomy.stages[0].forward_seconds)


def _worker(rank: int, world: int, schedule: str) -> dict[str, Any]:
    import graphpipe

    model, example, batches = _setup()
    plan, graph = _plan(model, example, LIMIT)
    with graphpipe.wrap(model, (example,), nn.functional.mse_loss, plan=plan.to_json(graph), schedule=schedule,
                        timeout=60) as pipe:
        return train_pipeline(pipe, batches, LR)


@pytest.mark.parametrize("schedule", ["1f1b", "zb_graph"])
def test_a_recomputed_stage_trains_like_one_process(schedule: str) -> None:
    _check_like_one_process(run_ranks(_worker, 2, schedule, timeout=120))


def _check_like_one_process(results: list[Any]) -> None:
    model, _, batches = _setup()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in batches:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    ref = dict(model.named_parameters())
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        torch.testing.assert_close(r.value["losses"], torch.stack(losses))
        for k, v in r.value["params"].items():
            torch.testing.assert_close(v, ref[k].detach(), msg=lambda m, k=k: f"{k}: {m}")


def _planned(partitioner: str) -> tuple[Any, Any]:
    import graphpipe

    model, example, _ = _setup()
    graph = graphpipe.trace(model, (example,))
    return graphpipe.plan(graph, 2, partitioner, micro_batches=MICRO_BATCHES, memory_limit=LIMIT,
                          optimizer="sgd"), graph


@pytest.mark.parametrize("partitioner", ["graphpipe", "sequential"])
def test_the_partitioners_find_a_plan_that_fits_only_recomputed(partitioner: str) -> None:
    import graphpipe

    plan, graph = _planned(partitioner)
    # Under the limit, but only with the recomputed stage: its activations of all its in-flight
    # micro-batches would not fit.
    assert [s.recompute for s in plan.stages] == [True, False]
    assert max(s.memory_bytes for s in plan.stages) <= LIMIT
    # The tree DP's family (or the chain cuts) holds it: no need for the METIS fallback.
    assert plan.partitioner != "graphpipe(fallback)"
    roomy = graphpipe.plan(graph, 2, partitioner, micro_batches=MICRO_BATCHES, optimizer="sgd")
    assert not any(s.recompute for s in roomy.stages)
    assert max(s.memory_bytes for s in roomy.stages) > LIMIT
    # The recomputed forward is paid for in the predicted step.
    assert plan.predicted_iteration_seconds > roomy.predicted_iteration_seconds


def _planned_worker(rank: int, world: int, partitioner: str) -> dict[str, Any]:
    import graphpipe

    model, example, batches = _setup()
    with graphpipe.wrap(model, (example,), nn.functional.mse_loss, partitioner=partitioner,
                        micro_batches=MICRO_BATCHES, memory_limit=LIMIT, optimizer="sgd", timeout=60) as pipe:
        assert [s.recompute for s in pipe.plan.stages] == [True, False]
        return train_pipeline(pipe, batches, LR)


@pytest.mark.parametrize("partitioner", ["graphpipe", "sequential"])
def test_a_planned_recomputed_pipeline_trains_like_one_process(partitioner: str) -> None:
    results = run_ranks(_planned_worker, 2, partitioner, timeout=120)
    _check_like_one_process(results)


# ---- replicated stages ---------------------------------------------------------------------------
# Links so fast that summing gradients is free, so the planner replicates where compute pays for
# it. Under 35 kB on 4 devices no plan fits without recomputing a replicated stage: each replica
# keeps only its shard's received tensors per micro-batch in flight (recompute.h, the rule the
# one-device DPs share).
REPLICATED_LIMIT, REPLICATED_WORLD = 35_000, 4


def _fast_devices() -> Any:
    import graphpipe

    devices = graphpipe.devices(REPLICATED_WORLD, "cpu")
    devices.set_node_links(REPLICATED_WORLD, 1e15, 0.0, 1e15, 0.0)
    return devices


@pytest.mark.parametrize("partitioner", ["graphpipe", "sequential"])
def test_replicated_dps_recompute_a_replicated_stage(partitioner: str) -> None:
    import graphpipe

    model, example, _ = _setup()
    graph = graphpipe.trace(model, (example,))
    kwargs = dict(micro_batches=MICRO_BATCHES, optimizer="sgd", replicate=True)
    plan = graphpipe.plan(graph, _fast_devices(), partitioner, memory_limit=REPLICATED_LIMIT, **kwargs)
    assert any(s.recompute and len(s.devices) > 1 for s in plan.stages), [(s.devices, s.recompute) for s in plan.stages]
    assert max(s.memory_bytes for s in plan.stages) <= REPLICATED_LIMIT
    roomy = graphpipe.plan(graph, _fast_devices(), partitioner, **kwargs)
    assert not any(s.recompute for s in roomy.stages)
    assert plan.predicted_iteration_seconds > roomy.predicted_iteration_seconds


def _replicated_worker(rank: int, world: int, partitioner: str) -> dict[str, Any]:
    import graphpipe

    model, example, batches = _setup()
    with graphpipe.wrap(model, (example,), nn.functional.mse_loss, partitioner=partitioner, replicate=True,
                        devices=_fast_devices(), micro_batches=MICRO_BATCHES, memory_limit=REPLICATED_LIMIT,
                        optimizer="sgd", timeout=60) as pipe:
        assert any(s.recompute and len(s.devices) > 1 for s in pipe.plan.stages)
        return train_pipeline(pipe, batches, LR)


@pytest.mark.parametrize("partitioner", ["graphpipe", "sequential"])
def test_a_recomputed_replicated_stage_trains_like_one_process(partitioner: str) -> None:
    _check_like_one_process(run_ranks(_replicated_worker, REPLICATED_WORLD, partitioner, timeout=180))
