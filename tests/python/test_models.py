"""Tests for graphpipe.models: shapes, fx traceability, backward, spec parsing, meta paper sizes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.fx
from torch import nn

from graphpipe.models import (
    DLRM,
    MLP,
    MODELS,
    CandleUno,
    CandleUnoConfig,
    DLRMConfig,
    MMTConfig,
    MultiModalTransformer,
    SequentialTransformer,
    TransformerBlock,
    TransformerConfig,
    build_model,
    default_loss,
    parse_spec,
)

NAMES = ["mmt", "dlrm", "candle_uno", "transformer"]


# --------------------------------------------------------------------------
# Parameter-count formulas (independent of the implementation).
# --------------------------------------------------------------------------


def linear_params(i: int, o: int) -> int:
    return i * o + o


def mlp_params(i: int, widths: list[int]) -> int:
    total = 0
    for w in widths:
        total += linear_params(i, w)
        i = w
    return total


def block_params(hidden: int, ffn: int) -> int:
    layer_norms = 2 * (2 * hidden)
    attention = 4 * linear_params(hidden, hidden)  # q, k, v, out proj
    feed_forward = linear_params(hidden, ffn) + linear_params(ffn, hidden)
    return layer_norms + attention + feed_forward


def expected_params(name: str, c: object) -> int:
    if name == "mmt":
        assert isinstance(c, MMTConfig)
        return c.branches * c.depth * block_params(c.hidden, c.ffn) + linear_params(
            c.branches * c.hidden, c.classes
        )
    if name == "transformer":
        assert isinstance(c, TransformerConfig)
        return c.depth * block_params(c.hidden, c.ffn) + linear_params(c.hidden, c.classes)
    if name == "candle_uno":
        assert isinstance(c, CandleUnoConfig)
        return (
            c.branches * mlp_params(c.feature_in, [c.width] * c.depth)
            + mlp_params(c.branches * c.width, [c.top_width] * c.top_depth)
            + linear_params(c.top_width, c.out)
        )
    if name == "dlrm":
        assert isinstance(c, DLRMConfig)
        f = c.dense_branches + c.sparse_branches
        pairs = f * (f - 1) // 2
        return (
            c.dense_branches
            * (mlp_params(c.dense_in, [c.dense_width] * c.dense_depth) + linear_params(c.dense_width, c.emb_dim))
            + c.sparse_branches * c.emb_rows * c.emb_dim
            + mlp_params(pairs + c.emb_dim, [c.top_width] * c.top_depth)
            + linear_params(c.top_width, 1)
        )
    raise AssertionError(name)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def expected_out_shape(model: nn.Module, batch: int) -> tuple[int, ...]:
    c = model.config  # type: ignore[attr-defined]
    if isinstance(model, (MultiModalTransformer, SequentialTransformer)):
        return (batch, c.classes)
    if isinstance(model, CandleUno):
        return (batch, c.out)
    return (batch, 1)


# --------------------------------------------------------------------------
# Small sizes: forward, tracing, backward, determinism.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_forward_shape(name: str) -> None:
    torch.manual_seed(0)
    model, inputs = build_model(f"{name}:batch=5")
    out = model(*inputs)
    assert out.shape == expected_out_shape(model, 5)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert n_params(model) == expected_params(name, model.config)


@pytest.mark.parametrize("name", NAMES)
def test_small_matches_default_spec(name: str) -> None:
    cls = MODELS[name]
    assert cls.small().config == build_model(name)[0].config  # type: ignore[attr-defined]
    assert type(cls.small().config)() == cls.small().config  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", NAMES)
def test_fx_traceable_equal_output(name: str) -> None:
    torch.manual_seed(0)
    model, inputs = build_model(name)
    model.eval()
    gm = torch.fx.symbolic_trace(model)
    with torch.no_grad():
        assert torch.equal(gm(*inputs), model(*inputs))
        # The traced graph is static except for the batch dimension.
        other = model.example_inputs(3)  # type: ignore[operator]
        assert torch.equal(gm(*other), model(*other))
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if name in ("mmt", "transformer"):
        assert torch.nn.functional.scaled_dot_product_attention in targets


@pytest.mark.parametrize("name", NAMES)
def test_backward(name: str) -> None:
    torch.manual_seed(0)
    model, inputs = build_model(name)
    targets = model.example_targets(inputs[0].shape[0])  # type: ignore[operator]
    loss = default_loss(name)(model(*inputs), targets)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname
        assert torch.isfinite(p.grad).all(), pname
    # Traced module also backpropagates.
    gm = torch.fx.symbolic_trace(model)
    default_loss(name)(gm(*inputs), targets).backward()


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_no_dropout(name: str) -> None:
    torch.manual_seed(123)
    m1, _ = build_model(name)
    torch.manual_seed(123)
    m2, _ = build_model(name)
    g = torch.Generator().manual_seed(7)
    inputs = m1.example_inputs(4, generator=g)  # type: ignore[operator]
    g = torch.Generator().manual_seed(7)
    inputs2 = m1.example_inputs(4, generator=g)  # type: ignore[operator]
    for a, b in zip(inputs, inputs2):
        assert torch.equal(a, b)
    m1.train()
    m2.train()
    assert torch.equal(m1(*inputs), m2(*inputs))
    assert torch.equal(m1(*inputs), m1(*inputs))  # train mode is deterministic too
    assert not any(isinstance(m, nn.Dropout) for m in m1.modules())


def test_seed_key_reproducible() -> None:
    m1, x1 = build_model("candle_uno:seed=3")
    m2, x2 = build_model("candle_uno:seed=3")
    for a, b in zip(x1, x2):
        assert torch.equal(a, b)
    assert torch.equal(m1(*x1), m2(*x2))


def test_example_inputs_types() -> None:
    model = DLRM.small()
    dense, sparse = model.example_inputs(6)
    c = model.config
    assert dense.shape == (6, c.dense_branches, c.dense_in) and dense.dtype == torch.float32
    assert sparse.shape == (6, c.sparse_branches, c.bag) and sparse.dtype == torch.int64
    assert int(sparse.min()) >= 0 and int(sparse.max()) < c.emb_rows
    assert model.example_targets(6).shape == (6, 1)

    mmt = MultiModalTransformer.small(branches=3)
    xs = mmt.example_inputs(2)
    assert len(xs) == 3 and all(x.shape == (2, 8, 32) for x in xs)
    y = mmt.example_targets(2)
    assert y.dtype == torch.int64 and y.shape == (2,)

    cu = CandleUno.small()
    assert [x.shape for x in cu.example_inputs(2)] == [(2, 16)] * 4
    assert cu.example_targets(2).shape == (2, 1)

    st = SequentialTransformer.small()
    (x,) = st.example_inputs(2)
    assert x.shape == (2, 8, 32)
    with pytest.raises(ValueError):
        st.example_inputs(0)


def test_wrong_number_of_inputs() -> None:
    model = MultiModalTransformer.small()
    with pytest.raises(ValueError, match="expects 4 inputs"):
        model(*model.example_inputs(2)[:3])
    cu = CandleUno.small()
    with pytest.raises(ValueError, match="expects 4 inputs"):
        cu(*cu.example_inputs(2)[:2])


def test_dlrm_interaction_buffer() -> None:
    model = DLRM.small(dense_branches=3, sparse_branches=2)
    f = 5
    assert model.triu_idx.shape == (2, f * (f - 1) // 2)
    assert bool((model.triu_idx[0] < model.triu_idx[1]).all())
    assert "triu_idx" not in model.state_dict()
    assert model(*model.example_inputs(2)).shape == (2, 1)


def test_transformer_block_reference() -> None:
    torch.manual_seed(0)
    seq, hidden, heads, ffn = 5, 12, 3, 20
    block = TransformerBlock(seq, hidden, heads, ffn)
    x = torch.randn(2, seq, hidden)
    d = hidden // heads

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(2, seq, heads, d).permute(0, 2, 1, 3)

    h = block.norm1(x)
    q, k, v = split(block.q(h)), split(block.k(h)), split(block.v(h))
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1) @ v
    ref = x + block.proj(att.permute(0, 2, 1, 3).reshape(2, seq, hidden))
    ref = ref + block.fc2(nn.functional.gelu(block.fc1(block.norm2(ref))))
    torch.testing.assert_close(block(x), ref)

    with pytest.raises(ValueError):
        TransformerBlock(seq, 10, 3, ffn)


def test_mlp() -> None:
    mlp = MLP(4, [8, 6])
    assert mlp.out_features == 6
    assert [type(m) for m in mlp] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU]
    assert [type(m) for m in MLP(4, [8, 6], final_activation=False)] == [nn.Linear, nn.ReLU, nn.Linear]


# --------------------------------------------------------------------------
# Spec parsing.
# --------------------------------------------------------------------------


def test_spec_overrides() -> None:
    model, inputs = build_model("mmt:branches=3, depth=1 ,hidden=64,batch=2")
    assert isinstance(model, MultiModalTransformer)
    assert model.config == MMTConfig(branches=3, depth=1, hidden=64)
    assert len(inputs) == 3 and inputs[0].shape == (2, 8, 64)
    assert len(model.branches) == 3 and len(model.branches[0]) == 1

    model, inputs = build_model("candle_uno:branches=16")
    assert model.config.branches == 16 and len(inputs) == 16  # type: ignore[attr-defined]
    assert inputs[0].shape[0] == 8  # default batch

    assert build_model("TRANSFORMER:")[0].config == TransformerConfig()  # type: ignore[attr-defined]


def test_parse_spec() -> None:
    ps = parse_spec("dlrm:size=paper,batch=4,device=meta,seed=1,emb_rows=10")
    assert ps.name == "dlrm" and ps.size == "paper" and ps.batch == 4 and ps.seed == 1
    assert ps.device == torch.device("meta")
    assert ps.overrides == {"emb_rows": 10}
    ps = parse_spec("transformer")
    assert ps.size == "small" and ps.batch == 8 and ps.device is None and ps.overrides == {}


def test_spec_bad_key() -> None:
    with pytest.raises(ValueError) as exc:
        build_model("mmt:branches=2,bogus=3")
    msg = str(exc.value)
    assert "'bogus'" in msg
    for key in ("branches", "depth", "seq", "hidden", "heads", "ffn", "classes", "batch", "size", "device"):
        assert key in msg
    # A key valid for one model is not valid for another.
    with pytest.raises(ValueError, match="'emb_dim'"):
        build_model("candle_uno:emb_dim=4")


@pytest.mark.parametrize(
    "spec, match",
    [
        ("resnet", "unknown model 'resnet'.*candle_uno, dlrm, mmt, transformer"),
        ("mmt:branches=four", "'branches' expects an int"),
        ("mmt:branches=2.5", "'branches' expects an int"),
        ("mmt:branches", "malformed"),
        ("mmt:branches=", "malformed"),
        ("mmt:depth=1,,seq=4", "malformed"),
        ("mmt:size=huge", "'size'"),
        ("mmt:batch=0", "'batch'"),
        ("mmt:batch=x", "'batch'"),
        ("mmt:device=nope", "'device'"),
        ("mmt:depth=1,depth=2", "more than once"),
        ("mmt:heads=5", "divisible"),
        ("dlrm:emb_dim=0", "emb_dim"),
    ],
)
def test_spec_errors(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_model(spec)


def test_classmethod_overrides() -> None:
    assert DLRM.small(bag=2).config.bag == 2
    with torch.device("meta"):  # paper sizes: never allocate real memory in tests
        assert CandleUno.paper(branches=16).config == CandleUnoConfig.paper(branches=16)
    with pytest.raises(ValueError, match="valid fields"):
        MMTConfig.small(nope=1)


def test_default_loss() -> None:
    assert isinstance(default_loss("mmt"), nn.CrossEntropyLoss)
    assert isinstance(default_loss("transformer"), nn.CrossEntropyLoss)
    assert isinstance(default_loss("dlrm"), nn.MSELoss)
    assert isinstance(default_loss("candle_uno:size=paper"), nn.MSELoss)
    with pytest.raises(ValueError, match="unknown model"):
        default_loss("nope")


# --------------------------------------------------------------------------
# Paper sizes on the meta device.
# --------------------------------------------------------------------------


def test_paper_configs_documented() -> None:
    assert MMTConfig.paper() == MMTConfig(
        branches=4, depth=8, seq=256, hidden=1024, heads=16, ffn=4096, classes=10
    )
    assert TransformerConfig.paper() == TransformerConfig(
        depth=32, seq=256, hidden=1024, heads=16, ffn=4096, classes=10
    )
    d = DLRMConfig.paper()
    assert (d.dense_branches, d.sparse_branches, d.dense_width, d.dense_depth) == (7, 7, 4096, 4)
    assert (d.emb_rows, d.emb_dim, d.bag, d.top_width) == (1_000_000, 64, 100, 4096)
    c = CandleUnoConfig.paper()
    assert (c.branches, c.feature_in, c.width, c.depth, c.top_width, c.top_depth, c.out) == (
        7, 1024, 4096, 4, 4096, 3, 1,
    )


@pytest.mark.parametrize(
    "spec",
    [
        "mmt:size=paper,device=meta",
        "dlrm:size=paper,device=meta",
        "candle_uno:size=paper,device=meta",
        "candle_uno:size=paper,device=meta,branches=16",
        "transformer:size=paper,device=meta",
    ],
)
def test_paper_meta_param_counts(spec: str) -> None:
    model, inputs = build_model(spec)
    name = spec.split(":")[0]
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(x.device.type == "meta" for x in inputs)
    assert n_params(model) == expected_params(name, model.config)
    out = model(*inputs)
    assert out.device.type == "meta" and out.shape == expected_out_shape(model, 8)
