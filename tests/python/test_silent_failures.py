"""Nothing silently wrong: the failures where every rank goes on and the model would be wrong.

- Replicas start equal: ranks that build the model from different seeds hold, after ``wrap``,
  their first replica's parameters and BatchNorm buffers (and the first holder's copy of a tied
  parameter), exactly; ``check_replicas`` names a replica that drifted.
- A load is all-or-nothing: one rank given a wrong-shape entry makes every rank raise naming
  that rank and entry, with every rank's parameters bit-identical to before.
- A non-finite gradient skips the optimizer step on every rank (parameters and buffers
  unchanged, ``skipped_steps == 1``), and the next good step trains exactly as if the bad batch
  had never come; a GradScaler with an infinity on the last stage only skips on all stages.
- An empty batch and a rank asking for another partitioner are named ``InputError``s.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from graphpipe.testing import run_ranks

CLASSES = 10
BATCH = 8
MICRO_BATCHES = 2


class TiedNet(nn.Module):
    """Token embedding -> (Linear, BatchNorm) -> Linear -> head tied to the embedding."""

    def __init__(self, batch_norm: bool = True) -> None:
        super().__init__()
        self.emb = nn.Embedding(CLASSES, 8)
        self.a = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8) if batch_norm else nn.Identity(), nn.ReLU())
        self.b = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.head = nn.Linear(8, CLASSES, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.head(self.b(self.a(self.emb(tokens) * weights[:, None])))


def _batch(seed: int, nan_sample: bool = False) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((tokens, per-sample weights), targets); ``nan_sample``: one sample's weight is NaN."""
    g = torch.Generator().manual_seed(seed)
    tokens, weights = torch.randint(0, CLASSES, (BATCH,), generator=g), torch.rand(BATCH, generator=g) + 0.5
    if nan_sample:
        weights[3] = float("nan")
    return (tokens, weights), torch.randint(0, CLASSES, (BATCH,), generator=g)


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, target)


def _plan(model: nn.Module, rules: dict[str, int], placement: list[list[int]]) -> Any:
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace_module

    graph = trace_module(model, _batch(0)[0]).graph
    return manual_plan(graph, rules, MICRO_BATCHES, stage_devices=placement)


def _ok(results: list[Any]) -> list[Any]:
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return [r.value for r in results]


def _snapshot(pipe: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in pipe.module.state_dict().items()}


# ---- replicas start equal ---------------------------------------------------------------------
def _replicas_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe

    torch.manual_seed(100 + rank)  # every rank its own seed, as a script seeding by rank does
    model = TiedNet()
    with torch.no_grad():
        model.a[1].running_mean.uniform_()  # BatchNorm statistics that differ per rank too
    plan = _plan(model, {"emb": 0, "a": 0, "b": 1, "head": 1}, [[0, 1], [2]])
    built = {k: v.clone() for k, v in model.state_dict().items()}
    pipe = graphpipe.wrap(model, _batch(0)[0], _loss, plan=plan, timeout=60)
    after_wrap = _snapshot(pipe)
    pipe.check_replicas()  # passes: the replicas are equal
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1)
    for k in range(3):
        pipe.step(*_batch(k), optimizer=opt)
    pipe.check_replicas()
    if rank == 1:  # one replica drifts
        with torch.no_grad():
            pipe.module.get_parameter("a.0.bias")[0] += 1e-6
    try:
        pipe.check_replicas()
        drift = None
    except graphpipe.InputError as exc:
        drift = str(exc)
    return {"built": built, "after_wrap": after_wrap, "drift": drift}


def test_replicas_from_different_seeds_are_equal_after_wrap() -> None:
    out = _ok(run_ranks(_replicas_worker, 3, timeout=180))
    first, second, last = out
    assert first["built"]["a.0.weight"].ne(second["built"]["a.0.weight"]).any()  # they did differ
    for k, v in first["after_wrap"].items():
        assert torch.equal(second["after_wrap"][k], v), k  # max difference 0.0
        assert torch.equal(v, first["built"][k]), k  # the first replica's values
    assert torch.equal(second["after_wrap"]["a.1.running_mean"], first["built"]["a.1.running_mean"])
    # The tied head on rank 2 holds the embedding of the first holder (rank 0).
    assert torch.equal(last["after_wrap"]["head.weight"], first["built"]["emb.weight"])
    for r in out:
        assert r["drift"] is not None and "stage 0" in r["drift"] and "rank 1" in r["drift"] and "a.0.bias" in r["drift"]


def _divergent_step_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe

    torch.manual_seed(0)
    model = TiedNet()
    plan = _plan(model, {"emb": 0, "a": 0, "b": 1, "head": 1}, [[0, 1], [2]])
    pipe = graphpipe.wrap(model, _batch(0)[0], _loss, plan=plan, timeout=60, check_replicas_every=1)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1, momentum=0.9)
    for k in range(2):
        pipe.step(*_batch(k), optimizer=opt)  # checked before each step: equal
    if rank == 1:  # one replica drifts between two steps
        with torch.no_grad():
            pipe.module.get_parameter("a.0.bias")[0] += 1e-6
    before = _snapshot(pipe)
    try:
        pipe.step(*_batch(2), optimizer=opt)
        error = None
    except graphpipe.InputError as exc:
        error = str(exc)
    after = _snapshot(pipe)
    return {"error": error, "unchanged": all(torch.equal(before[k], after[k]) for k in before),
            "grads_zeroed": all(p.grad is None or not p.grad.any() for p in pipe.parameters())}


def test_check_replicas_every_refuses_a_divergent_step_before_it_lands() -> None:
    for rank, r in enumerate(_ok(run_ranks(_divergent_step_worker, 3, timeout=180))):
        assert r["error"] is not None and "rank 1" in r["error"] and "a.0.bias" in r["error"], (rank, r["error"])
        assert "not applied" in r["error"], r["error"]
        assert r["unchanged"], rank  # the divergent step never landed, on any rank
        assert r["grads_zeroed"], rank


# ---- loads, non-finite steps, empty batches -----------------------------------------------------
def _reference(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = TiedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()
        parts = zip(x[0].chunk(MICRO_BATCHES), x[1].chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES))
        sum(_loss(model(t, w), ym) / MICRO_BATCHES for t, w, ym in parts).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _guard_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe

    torch.manual_seed(0)
    model = TiedNet()
    plan = _plan(model, {"emb": 0, "a": 0, "b": 1, "head": 2}, [[0], [1], [2]])
    pipe = graphpipe.wrap(model, _batch(0)[0], _loss, plan=plan, timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1, momentum=0.9)
    out: dict[str, Any] = {}

    # A load where rank 1 alone gets a wrong-shape entry: nothing changes anywhere.
    full = pipe.full_state_dict()
    before = _snapshot(pipe)
    bad = {k: v + 1 for k, v in full.items()}
    if rank == 1:
        bad["b.0.weight"] = torch.zeros(3, 3)
    start = time.perf_counter()
    try:
        pipe.load_state_dict(bad)
        out["load_error"] = None
    except graphpipe.InputError as exc:
        out["load_error"] = str(exc)
    out["load_seconds"] = time.perf_counter() - start
    out["load_unchanged"] = all(torch.equal(v, before[k]) for k, v in _snapshot(pipe).items())
    try:  # sync state given to rank 2 alone, which holds no replicated stage
        pipe.load_sync_state_dict({"method": "AllReduce()"} if rank == 2 else {})
        out["sync_load_error"] = None
    except graphpipe.InputError as exc:
        out["sync_load_error"] = str(exc)

    # A NaN sample: the step is skipped on every rank (parameters, momentum and BatchNorm
    # statistics as they were), the loss comes back NaN.
    start = time.perf_counter()
    pipe.step(*_batch(1), optimizer=opt)
    out["good_step_seconds"] = time.perf_counter() - start
    after_good = _snapshot(pipe)
    start = time.perf_counter()
    out["nan_loss"] = float(pipe.step(*_batch(2, nan_sample=True), optimizer=opt))
    out["skipped_step_seconds"] = time.perf_counter() - start
    out["nan_unchanged"] = all(torch.equal(v, after_good[k]) for k, v in _snapshot(pipe).items())
    # A NaN gradient on the first stage alone (the loss is finite): skipped everywhere too.
    hook = pipe.module.get_parameter("emb.weight").register_hook(
        lambda g: g.index_fill(0, torch.tensor([0]), float("nan"))) if rank == 0 else None
    out["first_stage_nan_loss"] = float(pipe.step(*_batch(2), optimizer=opt))
    if hook is not None:
        hook.remove()
    out["first_stage_unchanged"] = all(torch.equal(v, after_good[k]) for k, v in _snapshot(pipe).items())
    out["skipped"] = pipe.skipped_steps
    # ... and the next good step trains as if the bad batch had never come.
    pipe.step(*_batch(3), optimizer=opt)
    # An empty batch is refused on every rank; the pipeline stays usable.
    try:
        pipe.step((torch.zeros(0, dtype=torch.long), torch.zeros(0)), torch.zeros(0, dtype=torch.long), optimizer=opt)
        out["empty_error"] = None
    except graphpipe.InputError as exc:
        out["empty_error"] = str(exc)
    out["full"] = pipe.full_state_dict()
    return out


def test_loads_are_all_or_nothing_and_nonfinite_steps_are_skipped_everywhere() -> None:
    out = _ok(run_ranks(_guard_worker, 3, timeout=180))
    for r in out:
        assert r["load_error"] is not None and "rank 1" in r["load_error"] and "b.0.weight" in r["load_error"]
        assert r["load_unchanged"]
        assert r["sync_load_error"] is not None and "rank 2" in r["sync_load_error"]
        assert r["nan_unchanged"] and r["first_stage_unchanged"] and r["skipped"] == 2
        assert r["empty_error"] is not None and "0 samples" in r["empty_error"]
    assert all(r["nan_loss"] != r["nan_loss"] for r in out)  # NaN returned on every rank
    print(f"refused load: {max(r['load_seconds'] for r in out) * 1e3:.1f} ms on the slowest rank; "
          f"good step {out[0]['good_step_seconds'] * 1e3:.1f} ms, skipped step {out[0]['skipped_step_seconds'] * 1e3:.1f} ms")
    # Only rank 0's embedding gradient was NaN (a hook there), so that loss itself was finite.
    assert all(abs(r["first_stage_nan_loss"]) < float("inf") for r in out)
    expected = _reference([_batch(1), _batch(3)])
    for k, v in expected.items():
        torch.testing.assert_close(out[0]["full"][k], v, rtol=1e-6, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")


# ---- GradScaler: an infinity on the last stage only ---------------------------------------------
def _scaler_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe

    torch.manual_seed(0)
    model = TiedNet(batch_norm=False)
    model.head.weight = nn.Parameter(model.emb.weight.detach().clone())  # untied: stage 2 alone sees its inf
    plan = _plan(model, {"emb": 0, "a": 0, "b": 1, "head": 2}, [[0], [1], [2]])
    pipe = graphpipe.wrap(model, _batch(0)[0], _loss, plan=plan, timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    pipe.step(*_batch(1), optimizer=opt, scaler=scaler)
    before = _snapshot(pipe)
    hook = pipe.module.get_parameter("head.weight").register_hook(lambda g: g * float("inf")) if rank == 2 else None
    pipe.step(*_batch(2), optimizer=opt, scaler=scaler)
    if hook is not None:
        hook.remove()
    return {"unchanged": all(torch.equal(v, before[k]) for k, v in _snapshot(pipe).items()),
            "scale": float(scaler.get_scale()), "skipped": pipe.skipped_steps}


def test_grad_scaler_with_an_inf_on_one_stage_skips_on_all() -> None:
    out = _ok(run_ranks(_scaler_worker, 3, timeout=180))
    for r in out:
        assert r["unchanged"], out
        assert r["skipped"] == 1
        assert r["scale"] == 512.0  # every rank's scaler backed off alike (growth interval not reached)


# ---- planning options must agree ----------------------------------------------------------------
def _partitioner_worker(rank: int, world: int) -> str | None:
    import graphpipe

    torch.manual_seed(0)
    model = TiedNet(batch_norm=False)
    try:
        graphpipe.wrap(model, _batch(0)[0], _loss, partitioner="metis" if rank == 1 else "sequential",
                       micro_batches=MICRO_BATCHES, timeout=60)
    except graphpipe.InputError as exc:
        return str(exc)
    return None


def test_a_rank_with_another_partitioner_is_named() -> None:
    out = _ok(run_ranks(_partitioner_worker, 2, timeout=120))
    messages = [m for m in out if m is not None]
    assert messages, out
    assert any("planning options" in m and "partitioner" in m for m in messages), messages


def test_the_local_flag_works_under_a_float64_default_dtype() -> None:
    from graphpipe.runtime.nonfinite import StepGuard

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # as the multi-node and corpus tests train
    try:
        p = nn.Parameter(torch.ones(3))
        p.grad = torch.tensor([1.0, float("inf"), 2.0])
        assert StepGuard.local_flag([p], None, None) == 1.0
        p.grad = torch.ones(3)
        assert StepGuard.local_flag([p], None, None) == 0.0
        assert torch.equal(p.grad, torch.ones(3))  # the check leaves the gradient as it was
    finally:
        torch.set_default_dtype(previous)
