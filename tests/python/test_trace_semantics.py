"""What the tracer keeps of ordinary PyTorch code: buffers under their names, grad mode, in-place
writes (as graph edges), item assignment, and arguments fixed at trace time."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

from graphpipe.errors import TraceError
from graphpipe.trace import trace_module


class _Buffered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - self.offset.clone())


def test_buffer_read_directly_is_a_named_get_attr() -> None:
    traced = trace_module(_Buffered(), (torch.ones(2, 4),))
    attrs = [n.target for n in traced.module.graph.nodes if n.op == "get_attr"]
    assert attrs == ["offset"], "the buffer must stay a named attribute, not a _tensor_constant"
    assert "offset" in traced.module.state_dict()
    # ...and it is read when the graph runs, so a later change to the buffer is seen.
    model = _Buffered()
    traced = trace_module(model, (torch.ones(2, 4),))
    model.offset.fill_(100.0)
    torch.testing.assert_close(traced.module(torch.ones(2, 4)), model(torch.ones(2, 4)))


class _Modes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = self.a(x)
        with torch.inference_mode():
            g = self.b(x)
        return self.c(h + g.clone())


def test_grad_mode_of_each_operator_is_recorded() -> None:
    with torch.no_grad():  # the caller's mode must not leak into the trace
        traced = trace_module(_Modes(), (torch.ones(2, 4),))
    modes = {n.name: n.meta["grad_enabled"] for n in traced.module.graph.nodes if n.op == "call_module"}
    assert modes == {"a": False, "b": False, "c": True}


class _Writes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x[:, 0] = 0
        x.mul_(2)
        h = self.fc(x)
        self.act(h)
        return h + 1


def test_inplace_writes_become_edges() -> None:
    model = _Writes()
    traced = trace_module(model, (torch.ones(2, 4),))
    nodes = {n.name: n for n in traced.module.graph.nodes}
    inplace = [n.name for n in traced.module.graph.nodes if n.meta.get("inplace")]
    assert inplace == ["setitem", "mul_", "act"]
    # each reader after a write reads the write, not the tensor's older name
    assert nodes["mul_"].args[0] is nodes["setitem"]
    assert nodes["fc"].args[0] is nodes["mul_"]
    add = next(n for n in traced.module.graph.nodes if n.target is operator.add)
    assert add.args[0] is nodes["act"]
    x = torch.randn(2, 4)
    torch.testing.assert_close(traced.module(x.clone()), model(x.clone()))


def test_tracing_does_not_write_into_the_example_inputs() -> None:
    x = torch.ones(2, 4)
    trace_module(_Writes(), (x,))
    torch.testing.assert_close(x, torch.ones(2, 4))


class _Optional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.ctx = nn.Linear(2, 4)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        h = self.fc(x) * scale
        if context is not None:
            h = h + self.ctx(context)
        return h


@pytest.mark.parametrize("given", ["omitted", "passed"])
def test_none_and_scalar_arguments_are_fixed_at_trace_time(given: str) -> None:
    model = _Optional()
    x, ctx = torch.randn(2, 4), torch.randn(2, 2)
    args = (x,) if given == "omitted" else (x, ctx)
    traced = trace_module(model, args)
    assert traced.specialized == ({"context": None, "scale": 1.0} if given == "omitted" else {"scale": 1.0})
    targets = {n.target for n in traced.module.graph.nodes if n.op == "call_module"}
    assert ("ctx" in targets) == (given == "passed")
    torch.testing.assert_close(traced.module(*args), model(*args))


def test_untraceable_construct_names_itself() -> None:
    class _Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(TraceError, match="control flow"):
        trace_module(_Branchy(), (torch.ones(2, 2),))
