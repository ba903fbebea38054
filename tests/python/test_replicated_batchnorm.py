"""BatchNorm in replicated stages, on torchvision's ResNet-18 (float64, 32x32 images).

(a) Default semantics are DDP's (``broadcast_buffers=True``): each replica normalises with the
    statistics of its own rows, gradients are summed over the replicas, and the running
    statistics are the first replica's. The gold: ResNet-18 as one stage replicated on 2 ranks
    against torch DDP on the same 2 ranks fed the same rows (each micro-batch's replica rows, the
    gradients accumulated under ``no_sync`` until the last), compared after 2 SGD steps:
    parameters, and every rank's buffers against DDP's first rank's.
(b) ``nn.SyncBatchNorm`` (the model converted with ``convert_sync_batchnorm``) synchronises over
    the stage's replica group: BatchNorm over the union of the replicas' rows is BatchNorm over
    the whole micro-batch. The gold: ResNet-18 cut in two stages, the first replicated on ranks
    0 and 1 and the second on rank 2 (so the group is the stage's, not the world), against plain
    single-process training with BatchNorm and gradient accumulation over the same micro-batches:
    losses, parameters and running statistics.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
import corpus_models as cm

from graphpipe.testing import run_ranks

MICRO_BATCHES, ROWS, STEPS, LR = 2, 4, 2, 0.05  # ROWS per micro-batch: 2 per replica


def _model(sync: bool) -> nn.Module:
    torch.manual_seed(0)
    model = cm.torchvision_models().resnet18(num_classes=10).double()
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync else model


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(MICRO_BATCHES * ROWS, 3, 32, 32, dtype=torch.float64, generator=g),
             torch.randint(0, 10, (MICRO_BATCHES * ROWS,), generator=g)) for _ in range(STEPS)]


def _plan(model: nn.Module, example: tuple, placement: list[list[int]]) -> dict[str, Any]:
    import json

    import graphpipe
    from graphpipe.runtime.sync_batchnorm import StageSyncBatchNorm, adopt_sync_batchnorm
    from graphpipe.trace import trace_module

    # As wrap traces a model with SyncBatchNorm: its modules adopted, each one operator.
    leaves = (StageSyncBatchNorm,) if adopt_sync_batchnorm(model) else ()
    graph = trace_module(model, example, leaf_modules=leaves).graph
    plan = graphpipe.plan(graph, len(placement), "sequential", micro_batches=MICRO_BATCHES)
    assert plan.num_stages == len(placement)
    doc = json.loads(plan.to_json(graph))
    for stage, ranks in zip(doc["stages"], placement):
        stage["devices"] = ranks
    doc["num_devices"] = sum(len(r) for r in placement)
    doc.pop("device_nodes", None)  # placed by hand on other devices: their nodes are unknown
    return doc


def _pipeline(rank: int, sync: bool, placement: list[list[int]]) -> dict[str, Any]:
    """wrap + STEPS SGD steps on this rank: losses and this rank's state (parameters, buffers)."""
    import graphpipe

    model, batches = _model(sync), _batches()
    example = (batches[0][0],)
    plan = _plan(_model(sync), example, placement)
    with graphpipe.wrap(model, example, nn.functional.cross_entropy, plan=plan, timeout=60) as pipe:
        params = list(pipe.parameters())
        opt = torch.optim.SGD(params, lr=LR) if params else None
        losses = []
        for x, y in batches:
            losses.append(pipe.step(x, y))
            if opt:
                opt.step()
                opt.zero_grad()
        return {"losses": torch.stack(losses), "state": {k: v.detach().clone() for k, v in pipe.state_dict().items()}}


def _ddp_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    got = _pipeline(rank, False, [[0, 1]])
    model = DDP(_model(False), broadcast_buffers=True)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    half = ROWS // world
    for x, y in _batches():
        for m in range(MICRO_BATCHES):
            rows = slice(m * ROWS + rank * half, m * ROWS + (rank + 1) * half)
            # DDP averages over its ranks; the pipeline sums its replicas' shares of the mean.
            ctx = model.no_sync() if m < MICRO_BATCHES - 1 else contextlib.nullcontext()
            with ctx:
                (nn.functional.cross_entropy(model(x[rows]), y[rows]) / MICRO_BATCHES).backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    return got | {"ddp": {k: v.detach().clone() for k, v in model.module.state_dict().items()}}


def test_default_batchnorm_in_a_replicated_stage_is_ddps() -> None:
    results = run_ranks(_ddp_worker, 2, timeout=150)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    first_ddp = results[0].value["ddp"]
    for r in results:
        state, ddp = r.value["state"], r.value["ddp"]
        assert set(state) == set(first_ddp)
        for k, v in state.items():
            if "running" in k or "num_batches" in k:
                # Buffers: DDP's first rank's (its replicas keep their own until the next forward).
                torch.testing.assert_close(v, first_ddp[k], rtol=1e-9, atol=1e-12, msg=lambda m, k=k: f"{k}: {m}")
            else:
                torch.testing.assert_close(v, ddp[k], rtol=1e-9, atol=1e-12, msg=lambda m, k=k: f"{k}: {m}")
    # The replicas really saw different rows: DDP's second rank ends with other statistics.
    assert not torch.equal(results[1].value["ddp"]["bn1.running_mean"], first_ddp["bn1.running_mean"])


def _sync_worker(rank: int, world: int) -> dict[str, Any]:
    return _pipeline(rank, True, [[0, 1], [2]])


def test_sync_batchnorm_over_a_stages_replicas_is_batchnorm_over_the_micro_batch() -> None:
    results = run_ranks(_sync_worker, 3, timeout=150)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    model = _model(False)  # plain BatchNorm, one process, the whole micro-batch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches():
        total = 0.0
        for m in range(MICRO_BATCHES):
            rows = slice(m * ROWS, (m + 1) * ROWS)
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows]) / MICRO_BATCHES
            loss.backward()
            total += loss.item()
        losses.append(total)
        opt.step()
        opt.zero_grad()
    want = model.state_dict()
    seen: set[str] = set()
    for r in results:
        torch.testing.assert_close(r.value["losses"], torch.tensor(losses, dtype=r.value["losses"].dtype),
                                   rtol=1e-9, atol=1e-12)
        for k, v in r.value["state"].items():
            torch.testing.assert_close(v, want[k], rtol=1e-8, atol=1e-10, msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")
            seen.add(k)
    assert seen == set(want)
    # The first stage (ranks 0 and 1) holds SyncBatchNorm modules: what was synchronised.
    assert any("bn1.running_mean" == k for k in results[0].value["state"])
