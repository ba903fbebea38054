"""Checkpoints: 2 steps, save every rank's shard (and optimizer state), fresh processes load,
2 more steps == 4 uninterrupted steps, parameter for parameter; the gathered full state dict
loads into a plain model."""

from __future__ import annotations

import os
from typing import Any

import torch
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan

from graphpipe.testing import run_ranks

NAME = "dlrm"


def _batches() -> list[Any]:
    model, _, _ = make_model(NAME)
    out = []
    for k in range(4):
        g = torch.Generator().manual_seed(500 + k)
        out.append((model.example_inputs(8, generator=g), model.example_targets(8, generator=g)))
    return out


def _worker(rank: int, world: int, steps: range, load_dir: str | None, save_dir: str | None) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, _ = make_model(NAME)
    pipe = graphpipe.wrap(model, example, default_loss(NAME), plan=hand_plan(model, example, world), timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.05, momentum=0.9)
    if load_dir:
        ckpt = torch.load(os.path.join(load_dir, f"rank{rank}.pt"), weights_only=False)
        pipe.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    batches = _batches()
    losses = []
    for k in steps:
        opt.zero_grad()
        losses.append(pipe.step(*batches[k]))
        opt.step()
    if save_dir:
        torch.save({"model": pipe.state_dict(), "optimizer": opt.state_dict()}, os.path.join(save_dir, f"rank{rank}.pt"))
    return {"losses": losses, "full": pipe.full_state_dict()}


def _ok(results: list[Any]) -> list[dict[str, Any]]:
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return [r.value for r in results]


def test_checkpoint_resume_equals_uninterrupted(tmp_path: Any) -> None:
    straight = _ok(run_ranks(_worker, 3, range(4), None, None, timeout=180))
    _ok(run_ranks(_worker, 3, range(2), None, str(tmp_path), timeout=180))
    resumed = _ok(run_ranks(_worker, 3, range(2, 4), str(tmp_path), None, timeout=180))
    torch.testing.assert_close(resumed[0]["losses"], straight[0]["losses"][2:], rtol=0, atol=0)
    full_a, full_b = straight[0]["full"], resumed[0]["full"]
    assert list(full_a) == list(full_b)
    for k in full_a:
        torch.testing.assert_close(full_b[k], full_a[k], rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")
    model, _, _ = make_model(NAME)
    model.load_state_dict(full_b)  # the gathered dict is an ordinary state dict of the model


class _Aliased(torch.nn.Module):
    """A parameter and a module each registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(4, 4)
        self.second = torch.nn.Linear(4, 4)
        self.again = self.second  # one module, two attributes
        self.p0 = torch.nn.Parameter(torch.ones(4))
        self.p1 = self.p0  # one parameter, two names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.again(torch.relu(self.first(x))) * self.p1


def _aliased_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace_module

    torch.manual_seed(0)
    model = _Aliased()
    x = torch.randn(8, 4)
    plan = manual_plan(trace_module(model, (x,)).graph, {"x": 0, "first": 0, "": 1}, 2)
    pipe = graphpipe.wrap(model, (x,), lambda out, y: ((out - y) ** 2).mean(), plan=plan, timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1)
    pipe.step((x,), torch.zeros(8, 4), optimizer=opt)
    full = pipe.full_state_dict()
    pipe.load_state_dict(full)  # the full dict, aliases included, loads back
    return {"full": full, "shard": sorted(pipe.state_dict())}


def test_aliased_names_round_trip_into_the_plain_model() -> None:
    out = _ok(run_ranks(_aliased_worker, 2, timeout=120))
    full = out[0]["full"]
    assert list(full) == list(_Aliased().state_dict())  # every name, in the model's order
    assert torch.equal(full["p0"], full["p1"]) and torch.equal(full["second.weight"], full["again.weight"])
    plain = _Aliased()
    plain.load_state_dict(full, strict=True)
    assert "again.weight" in out[1]["shard"] and "second.weight" in out[1]["shard"]
