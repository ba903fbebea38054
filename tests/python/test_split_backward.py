"""The runtime's split backward (runtime/split_backward.h through ``_C.backward_input``).

I then W gives exactly the gradients of one plain backward, for inputs and parameters, on graphs
where the parameters' paths join the input path in the ways stages do (a chain of layers, a
weight shared above and below, a bias added to the input path, an output computed from
parameters alone, a parameter nothing uses, two inputs, normalisations whose parameter gradients I
computes); and W runs no operator of the input path again: a counting operator on it runs its
backward once, in I.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from graphpipe._ext import _C

torch.manual_seed(0)
L1 = torch.nn.Linear(8, 8).double()
L2 = torch.nn.Linear(8, 8).double()
LN = torch.nn.LayerNorm(8).double()
BN = torch.nn.BatchNorm1d(8).double()
SHARED = torch.nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
BIAS = torch.nn.Parameter(torch.randn(8, dtype=torch.float64))
PARAMS = [*L1.parameters(), *L2.parameters(), *LN.parameters(), *BN.parameters(), SHARED, BIAS]


class Counted(torch.autograd.Function):
    """Identity whose backward counts its calls."""

    calls = 0

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        Counted.calls += 1
        return g


CASES: dict[str, tuple[int, Callable[..., list[torch.Tensor]]]] = {
    "chain": (1, lambda x: [L2(torch.nn.functional.gelu(L1(Counted.apply(x))))]),
    "shared_weight": (1, lambda x: [torch.tanh(Counted.apply(torch.tanh(x @ SHARED)) @ SHARED)]),
    "bias_join_and_parameter_only_output": (
        1, lambda x: [Counted.apply(x) * 2 + BIAS, (BIAS * BIAS).sum().reshape(1) * torch.ones(3, dtype=torch.float64)]),
    "two_inputs": (2, lambda x, y: [L1(Counted.apply(x)) + L2(y) * BIAS, L1(y).sum()]),
    "layer_norm_residual": (1, lambda x: [LN(L1(Counted.apply(x))).relu() + x, L2(x)]),
    # A norm on the input path has its weight and bias gradients computed in I (one fused pass);
    # a norm used twice (its parameters fed from two places) is split like any other join.
    "norms": (1, lambda x: [BN(Counted.apply(x)).tanh(), LN(LN(x * 3))]),
    "norm_only": (1, lambda x: [LN(Counted.apply(x))]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_input_then_weight_half_equals_one_backward(name: str) -> None:
    n_inputs, f = CASES[name]
    xs = [torch.randn(4, 8, dtype=torch.float64) for _ in range(n_inputs)]

    for p in PARAMS:
        p.grad = None
    plain = [x.clone().requires_grad_() for x in xs]
    outs = f(*plain)
    seeds = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, seeds)
    want_params = [None if p.grad is None else p.grad.clone() for p in PARAMS]
    want_inputs = [x.grad for x in plain]

    for p in PARAMS:
        p.grad = None
    split = [x.clone().requires_grad_() for x in xs]
    outs = f(*split)
    Counted.calls = 0
    got_inputs, pending = _C.backward_input(outs, seeds, split, PARAMS)
    del outs
    after_input = Counted.calls
    assert all(p.grad is None for p in PARAMS), "I must not touch the parameters' gradients"
    assert not pending.empty
    pending.run()
    assert Counted.calls == after_input == 1, "W ran an operator of the input path again"
    assert pending.empty
    for want, got in zip(want_inputs, got_inputs):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for p, want in zip(PARAMS, want_params):
        if want is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, want, rtol=1e-12, atol=1e-12)


def test_a_norm_parameter_hook_runs_once() -> None:
    """A tensor hook on a norm's parameter keeps the norm split (I would run the hook where it
    captures the gradient, W again where it accumulates it): the hook runs once, as in B."""
    x = torch.randn(4, 8, dtype=torch.float64)
    grads = {}
    for split in (False, True):
        calls = []
        handle = LN.weight.register_hook(lambda g: calls.append(1) or g * 2)  # noqa: B023 (runs within this iteration)
        for p in PARAMS:
            p.grad = None
        leaf = x.clone().requires_grad_()
        out = LN(Counted.apply(leaf))
        if split:
            _, pending = _C.backward_input([out], [torch.ones_like(out)], [leaf], PARAMS)
            del out
            pending.run()
        else:
            out.backward(torch.ones_like(out))
        handle.remove()
        assert len(calls) == 1
        grads[split] = LN.weight.grad.clone()
    torch.testing.assert_close(grads[True], grads[False], rtol=1e-12, atol=1e-12)


def test_without_inputs_w_is_the_whole_backward_and_without_parameters_i_is() -> None:
    x = torch.randn(4, 8, dtype=torch.float64)
    for p in PARAMS:
        p.grad = None
    out = L1(x)
    got, pending = _C.backward_input([out], [torch.ones_like(out)], [x], PARAMS)  # x needs no gradient
    assert got == [None]
    pending.run()
    torch.testing.assert_close(L1.weight.grad, torch.ones(4, 8, dtype=torch.float64).t() @ x)

    leaf = x.clone().requires_grad_()
    out = L1(leaf)
    got, pending = _C.backward_input([out], [torch.ones_like(out)], [leaf], [])
    assert pending.empty
    torch.testing.assert_close(got[0], torch.ones(4, 8, dtype=torch.float64) @ L1.weight)
