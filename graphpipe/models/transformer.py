"""Sequential Transformer: a single chain of blocks, the non-branching control model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import (
    TransformerBlock,
    _check_batch,
    _check_positive,
    _make_config,
    _module_device,
    _randint,
    _randn,
)

__all__ = ["SequentialTransformer", "TransformerConfig"]


@dataclass(frozen=True)
class TransformerConfig:
    """Configuration of :class:`SequentialTransformer`.

    The defaults are the small size; :meth:`paper` gives the paper-like size
    (32 layers, seq 256, hidden 1024, 16 heads, FFN 4096).
    """

    depth: int = 8
    seq: int = 8
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    classes: int = 10

    def __post_init__(self) -> None:
        _check_positive(self, ("depth", "seq", "hidden", "heads", "ffn", "classes"))
        if self.hidden % self.heads != 0:
            raise ValueError(
                f"TransformerConfig.hidden ({self.hidden}) must be divisible by heads ({self.heads})"
            )

    @classmethod
    def small(cls, **overrides: int) -> TransformerConfig:
        """Small size for fast CPU tests, with field overrides."""
        return _make_config(cls, {}, overrides)  # type: ignore[return-value]

    @classmethod
    def paper(cls, **overrides: int) -> TransformerConfig:
        """Paper-like size, with field overrides."""
        base = dict(depth=32, seq=256, hidden=1024, heads=16, ffn=4096, classes=10)
        return _make_config(cls, base, overrides)  # type: ignore[return-value]


class SequentialTransformer(nn.Module):
    """One chain of ``depth`` :class:`TransformerBlock` s, mean pool, Linear head.

    ``forward(x)`` with ``x`` of shape ``(batch, seq, hidden)`` returns
    ``(batch, classes)`` logits.  Blocks live in ``self.blocks`` (``nn.Sequential``).
    """

    def __init__(self, config: TransformerConfig | None = None) -> None:
        super().__init__()
        self.config: TransformerConfig = config if config is not None else TransformerConfig()
        c = self.config
        self.blocks = nn.Sequential(
            *(TransformerBlock(c.seq, c.hidden, c.heads, c.ffn) for _ in range(c.depth))
        )
        self.head = nn.Linear(c.hidden, c.classes)

    @classmethod
    def small(cls, **overrides: int) -> SequentialTransformer:
        """Build the small size (see :class:`TransformerConfig`), with config overrides."""
        return cls(TransformerConfig.small(**overrides))

    @classmethod
    def paper(cls, **overrides: int) -> SequentialTransformer:
        """Build the paper-like size (see :meth:`TransformerConfig.paper`), with config overrides."""
        return cls(TransformerConfig.paper(**overrides))

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, seq, hidden)`` to ``(batch, classes)`` logits."""
        return self.head(self.blocks(x).mean(dim=1))

    def example_inputs(
        self, batch: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, ...]:
        """Random float input: a 1-tuple with a ``(batch, seq, hidden)`` tensor."""
        _check_batch(batch)
        c = self.config
        return (_randn((batch, c.seq, c.hidden), _module_device(self), generator),)

    def example_targets(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random class labels (int64, shape ``(batch,)``) for cross-entropy."""
        _check_batch(batch)
        return _randint(self.config.classes, (batch,), _module_device(self), generator)
