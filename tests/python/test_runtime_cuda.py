"""The runtime's CUDA path on a GPU: pipelined training with stages on the GPU equals
single-process training on the GPU.

- Two ranks sharing one GPU over Gloo: every transfer is host-staged (transport.h), while the
  stages compute on the GPU and the executor orders its transfer stream against the compute
  stream with events (runtime/cuda). This is the multi-rank check that a one-GPU machine allows:
  NCCL refuses two ranks on one device.
- One rank over NCCL: the stage, its micro-batches and the loss on the GPU, through NCCL's group.
- Two ranks over NCCL, one GPU each, where the machine has two GPUs.
- bf16 autocast (``wrap(autocast=torch.bfloat16)``) on one GPU, two ranks over Gloo and one over
  NCCL: equal to single-process autocast training over the same micro-batches.

These run only where a GPU is present and graphpipe was built with its CUDA path
(GRAPHPIPE_WITH_CUDA=1); CI has no GPU, the sessions lent a GPU machine run them there.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

# The gold test's model, batches and training constants: the GPU runs are the CPU gold cases.
from test_runtime_gold import LR, MICRO_BATCHES, make_model

from graphpipe import _C
from graphpipe.testing import run_ranks

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and bool(getattr(_C, "runtime_with_cuda", False))),
    reason="needs a GPU and graphpipe built with GRAPHPIPE_WITH_CUDA=1",
)

# Stages run micro-batches of BATCH / MICRO_BATCHES where the reference runs the whole batch;
# GPU kernels for other batch sizes may sum in another order, so float32 agrees to rounding.
TOL = {"rtol": 1e-4, "atol": 1e-5}


def _reference(name: str) -> dict[str, Any]:
    """Plain single-process SGD on the GPU over the same batches."""
    from graphpipe.models import default_loss
    from graphpipe.runtime.microbatch import to_device as _to_device

    torch.backends.cuda.matmul.allow_tf32 = False
    model, _, batches = make_model(name)
    model = model.cuda()
    loss_fn = default_loss(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for inputs, targets in batches:
        opt.zero_grad()
        loss = loss_fn(model(*_to_device(inputs, torch.device("cuda"))), _to_device(targets, torch.device("cuda")))
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    return {"losses": torch.stack(losses), "params": {k: v.detach().cpu() for k, v in model.named_parameters()}}


def _reference_autocast(name: str) -> dict[str, Any]:
    """Single-process SGD on the GPU under bf16 autocast over the same micro-batches (each
    micro-batch's loss / MICRO_BATCHES, accumulated), as the pipeline runs them."""
    from graphpipe.models import default_loss
    from graphpipe.runtime.microbatch import to_device as _to_device

    model, _, batches = make_model(name)
    model = model.cuda()
    loss_fn = default_loss(name)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    cuda = torch.device("cuda")
    for inputs, targets in batches:
        opt.zero_grad()
        total = torch.zeros((), device=cuda)
        for m in range(MICRO_BATCHES):
            size = targets.shape[0] // MICRO_BATCHES
            rows = slice(m * size, (m + 1) * size)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(*_to_device([t[rows] for t in inputs], cuda)), _to_device(targets[rows], cuda))
            (loss / MICRO_BATCHES).backward()
            total += loss.detach().float() / MICRO_BATCHES
        opt.step()
        losses.append(total.cpu())
    return {"losses": torch.stack(losses), "params": {k: v.detach().cpu() for k, v in model.named_parameters()}}


def _train(rank: int, world: int, name: str, partitioner: str, schedule: str,
           autocast: torch.dtype | None = None) -> dict[str, Any]:
    """Runs on every rank: the model on this rank's GPU, wrapped (under ``autocast``), STEPS SGD
    steps."""
    import graphpipe
    from graphpipe.models import default_loss

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    model, example, batches = make_model(name)
    model = model.to(device)
    with graphpipe.wrap(model, example, default_loss(name), partitioner=partitioner, schedule=schedule,
                        micro_batches=MICRO_BATCHES, timeout=60.0, device=device, autocast=autocast) as pipe:
        params = list(pipe.parameters())
        assert all(p.device == device for p in params), "the stage must stay on this rank's GPU"
        opt = torch.optim.SGD(params, lr=LR) if params else None
        losses = []
        for inputs, targets in batches:
            if opt:
                opt.zero_grad()
            losses.append(pipe.step(inputs, targets).detach().cpu())
            if opt:
                opt.step()
        torch.cuda.synchronize()
        return {
            "losses": torch.stack(losses),
            "params": {k: v.detach().cpu() for k, v in pipe.named_parameters()},
            "stages": pipe.plan.num_stages,
        }


def _check(results: list[Any], name: str, min_stages: int, ref: dict[str, Any] | None = None,
           tol: dict[str, float] = TOL) -> None:
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    ref = ref if ref is not None else _reference(name)
    seen: dict[str, torch.Tensor] = {}
    for r in results:
        assert r.value["stages"] >= min_stages, f"the plan has {r.value['stages']} stages"
        torch.testing.assert_close(r.value["losses"], ref["losses"], **tol)
        for k, v in r.value["params"].items():
            assert k not in seen, f"parameter {k} is held by two ranks"
            seen[k] = v
    assert set(seen) == set(ref["params"]), "the ranks together must hold every parameter exactly once"
    for k, v in seen.items():
        torch.testing.assert_close(v, ref["params"][k], **tol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("name,partitioner,schedule", [
    ("mmt", "sequential", "1f1b"),
    ("candle_uno", "metis", "fill_drain"),
    ("dlrm", "sequential", "1f1b"),
])
def test_two_ranks_share_one_gpu_over_gloo(name: str, partitioner: str, schedule: str) -> None:
    results = run_ranks(_train, 2, name, partitioner, schedule, timeout=300.0, backend="gloo")
    _check(results, name, min_stages=2)


def test_one_rank_over_nccl() -> None:
    results = run_ranks(_train, 1, "mmt", "graphpipe", "1f1b", timeout=300.0, backend="nccl")
    _check(results, "mmt", min_stages=1)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (NCCL refuses two ranks on one GPU)")
def test_two_ranks_over_nccl() -> None:
    results = run_ranks(_train, 2, "mmt", "sequential", "1f1b", timeout=300.0, backend="nccl")
    _check(results, "mmt", min_stages=2)


# bf16 turns a float32 reordering (other GPU kernels for a stage's shapes) into up to one bf16
# unit in the last place, 2^-8 relative, in a value it rounds (test_mixed_precision.py says more).
BF16_TOL = {"rtol": 1e-2, "atol": 1e-3}


def test_bf16_autocast_two_ranks_share_one_gpu_over_gloo() -> None:
    results = run_ranks(_train, 2, "mmt", "sequential", "1f1b", torch.bfloat16, timeout=300.0, backend="gloo")
    _check(results, "mmt", 2, _reference_autocast("mmt"), BF16_TOL)


def test_bf16_autocast_one_rank_over_nccl() -> None:
    results = run_ranks(_train, 1, "mmt", "graphpipe", "1f1b", torch.bfloat16, timeout=300.0, backend="nccl")
    _check(results, "mmt", 1, _reference_autocast("mmt"), BF16_TOL)


def _nccl_with_cpu_stage(rank: int, world: int) -> str:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, _ = make_model("mmt")
    try:
        graphpipe.wrap(model, example, default_loss("mmt"), micro_batches=MICRO_BATCHES, timeout=30.0)
    except graphpipe.InputError as exc:
        return str(exc)
    return "no error"


def test_nccl_with_a_cpu_stage_is_refused() -> None:
    (result,) = run_ranks(_nccl_with_cpu_stage, 1, timeout=120.0, backend="nccl")
    assert result.ok, result.message
    assert "NCCL" in result.value and "GPU" in result.value, result.value
