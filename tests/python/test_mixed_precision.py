"""Gold tests of mixed precision: pipelined training under bf16 autocast, of a bf16 model and of
fp16 with a GradScaler equals single-process training of the same kind over the same
micro-batches; and the bytes that cross a stage edge under bf16 autocast are half float32's.

The reference accumulates each micro-batch's loss / M in order, as the pipeline does, so both
run every operator on the same values in the same dtype; they then agree to float32 rounding
(observed: 1e-10 on these cases). The tolerance is rtol=1e-3, atol=1e-4 all the same, because
bf16 turns a float32 reordering (a stage reads a received contiguous tensor where one process
reads a view, and the kernel sums in another order) into up to one bf16 unit in the last place,
2^-8 relative, in a value it rounds: that happened for MMT at micro-batch 8 (8.6e-5 after three
steps) and is no error. A gold test this loose must still fail for a pipeline that trained in
float32: each autocast case also asserts that the pipeline is 10x closer to the autocast
reference than float32 training of the same model is.

Every world size is one spawn of ranks (forkserver) that runs all of its cases in a row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from graphpipe.testing import run_cases, run_ranks

STEPS = 3
MICRO = 4
LR = 0.05
TOLERANCE = {"rtol": 1e-3, "atol": 1e-4}
BF16 = torch.bfloat16


# ---- the models -----------------------------------------------------------------------------
def _mmt(branches: int) -> tuple[nn.Module, tuple, list, Callable]:
    from graphpipe.models import default_loss
    from graphpipe.testing import seeded_batches

    spec = f"mmt:branches={branches},batch=8"
    model, example, data = seeded_batches(spec, STEPS)
    return model, example, data, default_loss(spec)


def _gpt2() -> tuple[nn.Module, dict, list, Callable]:
    """Hugging Face GPT-2 (float32), its embedding tied to the LM head."""
    import hf_models as hm

    case = hm.build("gpt2", STEPS)
    return case.model.float(), case.example, case.batches, hm.lm_loss


class Branches(nn.Module):
    """Two Linear branches and a head: every tensor that crosses a stage is a Linear's output
    (what autocast computes in bf16), so the bytes on the wire halve exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Linear(16, 32), nn.Linear(32, 32)
        self.b1, self.b2 = nn.Linear(16, 32), nn.Linear(32, 32)
        self.head = nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a2(torch.relu(self.a1(x)))
        b = self.b2(torch.relu(self.b1(x)))
        return self.head(torch.cat([a, b], dim=1))


def _branches() -> tuple[nn.Module, tuple, list, Callable]:
    torch.manual_seed(3)
    model = Branches()
    g = torch.Generator().manual_seed(4)
    data = [((torch.randn(8, 16, generator=g),), torch.randn(8, 4, generator=g)) for _ in range(STEPS)]
    return model, data[0][0], data, nn.functional.mse_loss


MODELS: dict[str, Callable[[], tuple]] = {"mmt2": lambda: _mmt(2), "mmt4": lambda: _mmt(4), "gpt2": _gpt2,
                                          "branches": _branches}


def _model(name: str, dtype: torch.dtype | None) -> tuple[nn.Module, Any, list, Callable]:
    model, example, data, loss_fn = MODELS[name]()
    if dtype is not None:  # a model in bf16: its floating inputs too
        model = model.to(dtype)
        cast = functools.partial(_cast, dtype=dtype)
        example, data = cast(example), [(cast(x), cast(y)) for x, y in data]
    return model, example, data, loss_fn


def _cast(value: Any, dtype: torch.dtype) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, value)


def _inputs(x: Any) -> tuple[tuple, dict]:
    return ((), x) if isinstance(x, dict) else (tuple(x), {})


def _micro(x: Any, m: int) -> Any:
    size = 8 // MICRO
    return torch.utils._pytree.tree_map(lambda t: t[m * size:(m + 1) * size], x)


# ---- single-process references ---------------------------------------------------------------
@functools.cache
def reference(name: str, autocast: torch.dtype | None, model_dtype: torch.dtype | None = None,
              scaler: bool = False, overflow_step: int = -1) -> dict[str, Any]:
    """Plain training over the same micro-batches: per step, each micro-batch's loss / MICRO
    under ``autocast`` (through the GradScaler when ``scaler``), then one SGD step."""
    model, _, data, loss_fn = _model(name, model_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    grad_scaler = _scaler() if scaler else None
    losses, skipped = [], 0
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        hook = _overflow(model) if step == overflow_step else None
        total = torch.zeros((), dtype=torch.float64)
        for m in range(MICRO):
            args, kwargs = _inputs(_micro(x, m))
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                loss = loss_fn(model(*args, **kwargs), _micro(y, m)) / MICRO
            (grad_scaler.scale(loss) if grad_scaler else loss).backward()
            total += loss.detach().double()
        if hook is not None:
            hook.remove()
        if grad_scaler:
            before = grad_scaler.get_scale()
            grad_scaler.step(opt)
            grad_scaler.update()
            skipped += grad_scaler.get_scale() < before
        else:
            opt.step()
        losses.append(total.to(loss.dtype).double())  # the dtype step() returns it in
    args, kwargs = _inputs(data[0][0])
    with torch.no_grad(), torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        evaluated = model(*args, **kwargs)
    # Every name of a tied parameter (GPT-2's embedding is its LM head): stages hold it by either.
    named = list(model.named_parameters(remove_duplicate=False))
    first = {id(v): k for k, v in reversed(named)}
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in named},
            "tied": {k: first[id(v)] for k, v in named}, "eval": evaluated, "scale": grad_scaler.get_scale() if grad_scaler else None, "skipped": skipped}


def _scaler() -> Any:
    # growth_interval 2: the scale backs off at the overflow and grows again two steps later.
    return torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)


def _overflow(model: nn.Module) -> Any:
    """An fp16 overflow in one parameter's gradient (the head's: the last stage only)."""
    return model.get_parameter("head.weight").register_hook(lambda g: g * float("inf"))


# ---- the pipelined runs ----------------------------------------------------------------------
def train(name: str, mode: str, schedule: str) -> dict[str, Any]:
    """On every rank: ``mode`` is ``user`` (torch.autocast around pipe.step, nothing else
    changed), ``wrap`` (wrap(autocast=bf16)), ``bf16-model`` (model.to(bf16)) or ``fp16-scaler``
    (wrap(autocast=float16), a GradScaler, an overflow on the last stage in step 1)."""
    import graphpipe

    model, example, data, loss_fn = _model(name, BF16 if mode == "bf16-model" else None)
    options: dict[str, Any] = {"autocast": BF16} if mode == "wrap" else {}
    if mode == "fp16-scaler":
        options = {"autocast": torch.float16}
    with graphpipe.wrap(model, example, loss_fn, schedule=schedule, micro_batches=MICRO, timeout=60,
                        **options) as pipe:
        opt = torch.optim.SGD(list(pipe.parameters()), lr=LR)
        scaler = _scaler() if mode == "fp16-scaler" else None
        losses = []
        for step, (x, y) in enumerate(data):
            hook = None
            if mode == "fp16-scaler" and step == 1 and "head.weight" in dict(pipe.named_parameters()):
                hook = _overflow(pipe.module)
            with torch.autocast("cpu", dtype=BF16, enabled=mode == "user"):
                losses.append(pipe.step(x, y, optimizer=opt, scaler=scaler))
            if hook is not None:
                hook.remove()
        out: dict[str, Any] = {"losses": torch.stack(losses).double(),
                               "params": {k: v.detach().clone() for k, v in pipe.named_parameters()},
                               "stages": pipe.plan.num_stages, "skipped": pipe.skipped_steps,
                               "scale": scaler.get_scale() if scaler else None}
        if mode == "wrap":  # evaluation runs under wrap(autocast=) too
            out["eval"] = pipe.eval_forward(data[0][0])
        return out


def transfer_bytes(name: str, autocast: str) -> dict[str, Any]:
    """On every rank: one step with the executor's process group wrapped in a counting one;
    the bytes this rank sent over the stage edges (activations and their gradients)."""
    import graphpipe
    from graphpipe._ext import _C

    counted: list[Any] = []
    real = _C.Executor

    def counting(schedule: Any, rank: int, group: Any, timeout: Any) -> Any:
        counted.append(_C.counting_group(group))
        return real(schedule, rank, counted[-1], timeout)

    _C.Executor = counting  # connections.py makes the executor through _C.Executor
    try:
        model, example, data, loss_fn = _model(name, None)
        dtype = {"float32": None, "bfloat16": BF16}[autocast]
        with graphpipe.wrap(model, example, loss_fn, micro_batches=MICRO, timeout=60, autocast=dtype) as pipe:
            pipe.step(*data[0])
            return {"bytes": counted[0].bytes_communicated, "stages": pipe.plan.num_stages}
    finally:
        _C.Executor = real


CASES: dict[int, list[tuple]] = {
    2: [(train, "mmt2", "user", "1f1b"), (train, "mmt4", "user", "zb_graph"), (train, "branches", "user", "zb_graph")],
    3: [(train, "mmt2", "user", "zb_graph"), (train, "mmt4", "user", "1f1b"), (train, "mmt4", "wrap", "zb_graph"), (train, "gpt2", "user", "1f1b"),
        (train, "mmt4", "bf16-model", "1f1b"), (train, "branches", "fp16-scaler", "1f1b"),
        (transfer_bytes, "branches", "float32"), (transfer_bytes, "branches", "bfloat16")],
}


def _call(fn: Callable[..., Any], *case: Any) -> Any:
    return fn(*case)


def _world_worker(rank: int, world: int) -> dict[tuple, Any]:
    return run_cases(_call, CASES[world])


@functools.cache
def _results(world: int) -> list[Any]:
    out = run_ranks(_world_worker, world, timeout=120 + 60 * len(CASES[world]), start_method="forkserver")
    for r in out:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return out


def _case(world: int, case: tuple) -> list[Any]:
    got = [r.value[case] for r in _results(world)]
    for rank, g in enumerate(got):
        assert "error" not in g, f"rank {rank}: {g['error']}"
    return got


def _gathered(got: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    params: dict[str, torch.Tensor] = {}
    for g in got:
        for k, v in g["params"].items():
            if k in params:  # a tied parameter: every holder's copy must agree
                torch.testing.assert_close(v, params[k], rtol=0, atol=0)
            params[k] = v
    return params


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _assert_matches(got: list[dict[str, Any]], ref: dict[str, Any], float32: dict[str, Any] | None) -> None:
    params = _gathered(got)
    assert set(params) <= set(ref["params"])
    assert {ref["tied"][k] for k in params} == set(ref["tied"].values()), "every parameter is held by some stage"
    for g in got:
        torch.testing.assert_close(g["losses"], ref["losses"], **TOLERANCE)
    for k, v in params.items():
        torch.testing.assert_close(v, ref["params"][k], **TOLERANCE, msg=lambda m, k=k: f"{k}: {m}")
    if float32 is not None:
        # the pipeline trained in the reduced precision, not in float32
        assert _distance(params, ref["params"]) * 10 < _distance(float32["params"], ref["params"])


AUTOCAST_CASES = [(2, "mmt2", "user", "1f1b"), (2, "mmt4", "user", "zb_graph"), (2, "branches", "user", "zb_graph"),
                  (3, "mmt2", "user", "zb_graph"), (3, "mmt4", "user", "1f1b"), (3, "mmt4", "wrap", "zb_graph"),
                  (3, "gpt2", "user", "1f1b")]


@pytest.mark.parametrize("world,name,mode,schedule", AUTOCAST_CASES, ids=["-".join(map(str, c)) for c in AUTOCAST_CASES])
def test_bf16_autocast_equals_single_process_autocast(world: int, name: str, mode: str, schedule: str) -> None:
    got = _case(world, (train, name, mode, schedule))
    assert got[0]["stages"] >= 2
    ref = reference(name, BF16)
    _assert_matches(got, ref, reference(name, None))
    if mode == "wrap":
        for g in got:
            assert g["eval"].dtype == ref["eval"].dtype == BF16
            torch.testing.assert_close(g["eval"], ref["eval"], rtol=2e-2, atol=2e-2)  # whole batch vs micro-batches


def test_gpt2_tied_embedding_and_head_sit_on_different_stages() -> None:
    got = _case(3, (train, "gpt2", "user", "1f1b"))
    holders = [r for r, g in enumerate(got) if "transformer.wte.weight" in g["params"] or "lm_head.weight" in g["params"]]
    assert len(holders) >= 2, "the tied embedding and LM head must sit on different stages for this test"


def test_bf16_model_equals_single_process_bf16_training() -> None:
    got = _case(3, (train, "mmt4", "bf16-model", "1f1b"))
    for g in got:
        assert all(v.dtype == BF16 for v in g["params"].values())
    _assert_matches(got, reference("mmt4", None, BF16), None)


def test_fp16_grad_scaler_with_an_overflow_on_one_stage_equals_single_process() -> None:
    got = _case(3, (train, "branches", "fp16-scaler", "1f1b"))
    ref = reference("branches", torch.float16, scaler=True, overflow_step=1)
    assert ref["skipped"] == 1 and ref["scale"] == 2.0**11  # backed off at step 1, not grown back yet
    for g in got:
        assert g["skipped"] == ref["skipped"]
        assert g["scale"] == ref["scale"]
    _assert_matches(got, ref, None)


def test_bf16_autocast_halves_the_bytes_that_cross_stage_edges() -> None:
    f32 = _case(3, (transfer_bytes, "branches", "float32"))
    bf16 = _case(3, (transfer_bytes, "branches", "bfloat16"))
    assert f32[0]["stages"] == bf16[0]["stages"] >= 2
    sent32, sent16 = sum(g["bytes"] for g in f32), sum(g["bytes"] for g in bf16)
    assert sent32 > 0
    assert sent16 * 2 == sent32, (sent32, sent16)


def test_an_autocast_dtype_autocast_cannot_compute_in_is_named() -> None:
    from graphpipe import InputError, WrapOptions

    for bad in (torch.float64, torch.int8, "bf16"):
        with pytest.raises(InputError, match="autocast must be torch.bfloat16, torch.float16 or None"):
            WrapOptions(autocast=bad).autocast_context(torch.device("cpu"))
