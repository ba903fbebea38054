"""Traceable building blocks (Transformer encoder block, MLP) shared by the benchmark models."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MLP", "TransformerBlock"]


class TransformerBlock(nn.Module):
    """Pre-LayerNorm Transformer encoder block built from plain ops.

    ``x -> x + Proj(SDPA(heads(Q(LN(x))), heads(K(LN(x))), heads(V(LN(x)))))``
    followed by ``x -> x + W2(GELU(W1(LN(x))))``.

    Unlike ``nn.TransformerEncoderLayer``/``nn.MultiheadAttention`` this block has
    no data-dependent Python control flow, so ``torch.fx.symbolic_trace`` traces
    it into a static graph.  All reshapes use sizes taken from the constructor
    (``view(-1, seq, heads, head_dim)``) so only the batch dimension is dynamic.
    No dropout is used.

    Input and output shape: ``(batch, seq, hidden)``.
    """

    def __init__(self, seq: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        if min(seq, hidden, heads, ffn) <= 0:
            raise ValueError(
                f"seq, hidden, heads, ffn must be positive, got {seq}, {hidden}, {heads}, {ffn}"
            )
        if hidden % heads != 0:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.seq = seq
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.ffn_dim = ffn

        self.norm1 = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def _split_heads(self, t: Tensor) -> Tensor:
        # (B, S, H) -> (B, heads, S, head_dim)
        return t.view(-1, self.seq, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the block to ``x`` of shape ``(batch, seq, hidden)``."""
        h = self.norm1(x)
        q = self._split_heads(self.q(h))
        k = self._split_heads(self.k(h))
        v = self._split_heads(self.v(h))
        a = F.scaled_dot_product_attention(q, k, v)
        # (B, heads, S, head_dim) -> (B, S, hidden); transpose makes it
        # non-contiguous, so reshape (not view) is required.
        a = a.transpose(1, 2).reshape(-1, self.seq, self.hidden)
        x = x + self.proj(a)
        h = self.fc2(self.act(self.fc1(self.norm2(x))))
        return x + h

    def extra_repr(self) -> str:
        return f"seq={self.seq}, hidden={self.hidden}, heads={self.heads}, ffn={self.ffn_dim}"


class MLP(nn.Sequential):
    """Stack of ``Linear + ReLU`` layers with the given output widths.

    ``MLP(16, [32, 32])`` is ``Linear(16, 32), ReLU, Linear(32, 32), ReLU``.
    With ``final_activation=False`` the ReLU after the last Linear is omitted.
    An empty ``widths`` gives an identity (empty ``nn.Sequential``).
    """

    def __init__(
        self, in_features: int, widths: Sequence[int], final_activation: bool = True
    ) -> None:
        layers: list[nn.Module] = []
        prev = in_features
        widths = list(widths)
        for idx, width in enumerate(widths):
            if width <= 0:
                raise ValueError(f"MLP widths must be positive, got {widths}")
            layers.append(nn.Linear(prev, width))
            if final_activation or idx != len(widths) - 1:
                layers.append(nn.ReLU())
            prev = width
        super().__init__(*layers)
        self.in_features = in_features
        self.out_features = prev


# ---------------------------------------------------------------------------
# Helpers shared by the model files (private).
# ---------------------------------------------------------------------------


def _module_device(module: nn.Module) -> torch.device:
    """Device of the first parameter (or buffer) of ``module``; CPU if none."""
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def _randn(
    shape: Sequence[int], device: torch.device, generator: torch.Generator | None
) -> Tensor:
    """Standard-normal float tensor on ``device`` (empty on meta)."""
    if device.type == "meta":
        return torch.empty(tuple(shape), device=device)
    if generator is None:
        return torch.randn(tuple(shape), device=device)
    out = torch.randn(tuple(shape), generator=generator, device=generator.device)
    return out.to(device)


def _rand(
    shape: Sequence[int], device: torch.device, generator: torch.Generator | None
) -> Tensor:
    """Uniform ``[0, 1)`` float tensor on ``device`` (empty on meta)."""
    if device.type == "meta":
        return torch.empty(tuple(shape), device=device)
    if generator is None:
        return torch.rand(tuple(shape), device=device)
    out = torch.rand(tuple(shape), generator=generator, device=generator.device)
    return out.to(device)


def _randint(
    high: int,
    shape: Sequence[int],
    device: torch.device,
    generator: torch.Generator | None,
) -> Tensor:
    """int64 tensor with values in ``[0, high)`` on ``device`` (empty on meta)."""
    if device.type == "meta":
        return torch.empty(tuple(shape), dtype=torch.long, device=device)
    if generator is None:
        return torch.randint(0, high, tuple(shape), device=device)
    out = torch.randint(0, high, tuple(shape), generator=generator, device=generator.device)
    return out.to(device)


def _check_batch(batch: int) -> None:
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise ValueError(f"batch must be a positive int, got {batch!r}")


def _check_positive(config: object, names: Sequence[str]) -> None:
    """Raise ``ValueError`` if any of the named int fields of ``config`` is not positive."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(
                f"{type(config).__name__}.{name} must be a positive int, got {value!r}"
            )


def _make_config(cls: type, base: dict[str, object], overrides: dict[str, object]) -> object:
    """Instantiate dataclass ``cls`` from ``base`` values updated by ``overrides``.

    Unknown override keys raise ``ValueError`` listing the valid field names.
    """
    import dataclasses

    valid = [f.name for f in dataclasses.fields(cls)]
    for key in overrides:
        if key not in valid:
            raise ValueError(
                f"unknown {cls.__name__} field {key!r}; valid fields: {', '.join(valid)}"
            )
    return cls(**{**base, **overrides})
