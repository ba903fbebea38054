"""The capture front-end interface (graphpipe/capture.py): a front end added as one entry of
``graphpipe.trace.FRONT_ENDS`` is what ``trace(capture=)`` and ``wrap(capture=)`` use, its
``ModeSwitch`` is what ``Pipeline.train``/``eval`` ask, and a pipeline over its capture trains
equal to single-process training; "auto" tries the front ends in the list's order and names every
reason when none captures the model."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from graphpipe.capture import Capture, FrontEnd, ModeSwitch
from graphpipe.errors import InputError, TraceError
from graphpipe.testing import expect_ok, run_ranks

WORLD = 2
STEPS = 3
LR = 0.05


class _Branches(nn.Module):
    """Two branches joined: a small multi-branch model."""

    def __init__(self) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.b1, self.b2 = nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a2(torch.relu(self.a1(x)))
        b = self.b2(torch.tanh(self.b1(x)))
        return self.head(torch.cat([a, b], dim=1))


class _RecordingModes(ModeSwitch):
    """Records the modes the pipeline switches its stage to."""

    def __init__(self) -> None:
        self.switched: list[bool] = []

    def switch(self, module: nn.Module, training: bool) -> None:
        self.switched.append(training)


class _PlainFx(FrontEnd):
    """torch.fx's own symbolic_trace, without graphpipe's tracer: a third front end."""

    name = "plain_fx"
    title = "plain torch.fx"

    def __init__(self) -> None:
        self.calls = 0

    def capture(self, model: nn.Module, args: tuple, kwargs: dict[str, Any], *, leaf_modules: Any,
                specialized: Any) -> Capture:
        self.calls += 1
        gm = fx.symbolic_trace(model)
        for node in gm.graph.nodes:
            node.meta["grad_enabled"] = True
        return Capture(module=gm, values=list(args), modes=_RecordingModes())


class _Refuses(FrontEnd):
    name = "refuses"
    title = "the refusing front end"

    def capture(self, model: nn.Module, args: tuple, kwargs: dict[str, Any], *, leaf_modules: Any,
                specialized: Any) -> Capture:
        raise TraceError(f"{type(model).__name__} is refused here")


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]


def _worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.trace import FRONT_ENDS

    front_end = _PlainFx()
    FRONT_ENDS[front_end.name] = front_end  # the one line a new front end adds
    torch.manual_seed(0)
    model = _Branches()
    data = _data()
    with graphpipe.wrap(model, data[0][0], F.cross_entropy, capture="plain_fx", micro_batches=2, timeout=60,
                        devices=world) as pipe:
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)
        for x, y in data:
            opt.zero_grad()
            pipe.step(x, y)
            opt.step()
        pipe.eval()
        pipe.train()
        return {"state": {k: v.clone() for k, v in pipe.state_dict().items()}, "calls": front_end.calls,
                "switched": pipe._facts.modes.switched, "stages": pipe.plan.num_stages,
                "local": len(pipe._local.stages)}


def _reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = _Branches()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in _data():
        opt.zero_grad()
        # the pipeline sums the micro-batches' mean losses over the micro-batch count
        loss = sum(F.cross_entropy(model(xm), ym) for xm, ym in zip(x.chunk(2), y.chunk(2))) / 2
        loss.backward()
        opt.step()
    return model.state_dict()


def test_a_new_front_end_is_one_entry_and_trains_equal_to_one_process() -> None:
    results = expect_ok(run_ranks(_worker, WORLD, timeout=240))
    want = _reference()
    got: dict[str, torch.Tensor] = {}
    for r in results:
        assert r.value["calls"] >= 1  # wrap captured with the new front end
        assert r.value["stages"] >= WORLD  # pipelined over the ranks (the default may fold two on one)
        # Pipeline.eval() and train() asked the front end's ModeSwitch
        # once for each of this rank's stages
        assert r.value["switched"] == [False] * r.value["local"] + [True] * r.value["local"]
        got.update(r.value["state"])
    assert set(got) == set(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_auto_tries_the_front_ends_in_order_and_names_every_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphpipe

    trace_module = sys.modules["graphpipe.trace"]  # graphpipe.trace is also the function
    refusing = {"refuses": _Refuses(), "plain_fx": _PlainFx()}
    monkeypatch.setattr(trace_module, "FRONT_ENDS", refusing)
    traced = trace_module.trace_module(_Branches(), (torch.randn(4, 8),))
    assert traced.capture == "plain_fx"  # the first refused, the second captured
    assert refusing["plain_fx"].calls == 1

    monkeypatch.setattr(trace_module, "FRONT_ENDS", {"refuses": _Refuses()})
    with pytest.raises(TraceError, match="_Branches is refused here"):
        graphpipe.trace(_Branches(), torch.randn(4, 8))
    with pytest.raises(InputError, match=r"capture must be one of \['auto', 'refuses'\], got 'fx'"):
        graphpipe.trace(_Branches(), torch.randn(4, 8), capture="fx")


def test_the_shipped_list_is_fx_then_export() -> None:
    trace_module = sys.modules["graphpipe.trace"]
    assert list(trace_module.FRONT_ENDS) == ["fx", "export"]
    assert trace_module.CAPTURES == ("auto", "fx", "export")
    assert [f.takes_leaf_modules for f in trace_module.FRONT_ENDS.values()] == [True, False]
