"""``wrap(plan=p, schedule=<Schedule>)``: a Schedule object made for the plan (here generated under
another policy than the plan's and read back from its text form) is what the executor runs,
training equal to one process; a Schedule without its plan, or made for another plan, is
refused on every rank with the difference named (graphpipe.simulation.schedule_for, the check
``simulate`` applies too)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphpipe.testing import expect_ok, run_ranks

WORLD = 2
STEPS = 3
MICRO_BATCHES = 4
LR = 0.05


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Linear(8, 32), nn.Linear(32, 8)
        self.b1, self.b2 = nn.Linear(8, 32), nn.Linear(32, 8)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.a2(torch.relu(self.a1(x))), self.b2(torch.tanh(self.b1(x)))], dim=1))


def _data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(STEPS)]


def _worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.errors import InputError

    torch.manual_seed(0)
    model = _Branches()
    data = _data()
    plan = graphpipe.plan(model, world, example_inputs=data[0][0], micro_batches=MICRO_BATCHES, replicate=False)
    # generated under fill-drain (the plan was made for 1f1b), through its text form
    given = graphpipe.Schedule.parse(str(graphpipe.schedule(plan, "fill_drain")))
    out: dict[str, Any] = {"plan_schedule": plan.schedule}
    with graphpipe.wrap(model, data[0][0], F.cross_entropy, plan=plan, schedule=given, timeout=60) as pipe:
        out["kind"] = pipe.schedule_kind
        out["runs_given"] = all(pipe.schedule.instructions(r) == given.instructions(r) for r in range(world))
        opt = torch.optim.SGD(pipe.parameters(), lr=LR)
        for x, y in data:
            opt.zero_grad()
            pipe.step(x, y)
            opt.step()
        out["state"] = {k: v.clone() for k, v in pipe.state_dict().items()}
    try:
        graphpipe.wrap(_Branches(), data[0][0], F.cross_entropy, schedule=given, timeout=60)
        out["no_plan"] = None
    except InputError as exc:
        out["no_plan"] = str(exc)
    return out


def _other_plan_worker(rank: int, world: int) -> None:
    import graphpipe

    model = _Branches()
    x = torch.randn(16, 8)
    plan = graphpipe.plan(model, world, example_inputs=x, micro_batches=MICRO_BATCHES, replicate=False)
    other = graphpipe.plan(model, world, example_inputs=x, micro_batches=2, replicate=False)
    graphpipe.wrap(model, x, F.cross_entropy, plan=plan, schedule=graphpipe.schedule(other), timeout=60)


def _reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = _Branches()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for x, y in _data():
        opt.zero_grad()
        loss = sum(F.cross_entropy(model(xm), ym) for xm, ym in
                   zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES))) / MICRO_BATCHES
        loss.backward()
        opt.step()
    return model.state_dict()


def test_a_given_schedule_runs_and_trains_equal_to_one_process() -> None:
    results = [r.value for r in expect_ok(run_ranks(_worker, WORLD, timeout=240))]
    got: dict[str, torch.Tensor] = {}
    for out in results:
        assert out["plan_schedule"] == "1f1b" and out["kind"] == "fill_drain"
        assert out["runs_given"]
        assert "a Schedule is made for a plan" in out["no_plan"]
        got.update(out["state"])
    want = _reference()
    assert set(got) == set(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_a_schedule_for_another_plan_is_refused_on_every_rank() -> None:
    results = run_ranks(_other_plan_worker, WORLD, timeout=120)
    for r in results:
        assert not r.ok
        assert "micro-batches" in r.message, r.message
