"""Multi-Modal Transformer (MMT): parallel Transformer branches, one per modality, joined by a head."""

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

__all__ = ["MMTConfig", "MultiModalTransformer"]


@dataclass(frozen=True)
class MMTConfig:
    """Configuration of :class:`MultiModalTransformer`.

    The defaults are the small (fast CPU test) size; :meth:`paper` gives the
    paper size (4 branches x 8 layers, seq 256, hidden 1024, 16 heads, FFN 4096).
    """

    branches: int = 4
    depth: int = 2
    seq: int = 8
    hidden: int = 32
    heads: int = 4
    ffn: int = 64
    classes: int = 10

    def __post_init__(self) -> None:
        _check_positive(self, ("branches", "depth", "seq", "hidden", "heads", "ffn", "classes"))
        if self.hidden % self.heads != 0:
            raise ValueError(
                f"MMTConfig.hidden ({self.hidden}) must be divisible by heads ({self.heads})"
            )

    @classmethod
    def small(cls, **overrides: int) -> MMTConfig:
        """Small size for fast CPU tests, with field overrides."""
        return _make_config(cls, {}, overrides)  # type: ignore[return-value]

    @classmethod
    def paper(cls, **overrides: int) -> MMTConfig:
        """Paper size, with field overrides."""
        base = dict(branches=4, depth=8, seq=256, hidden=1024, heads=16, ffn=4096, classes=10)
        return _make_config(cls, base, overrides)  # type: ignore[return-value]


class MultiModalTransformer(nn.Module):
    """Multi-branch Transformer: ``branches`` independent stacks of ``depth`` blocks.

    ``forward(*inputs)`` takes ``branches`` float tensors, each of shape
    ``(batch, seq, hidden)`` (one modality each).  Branch ``i`` runs
    ``self.branches[i]`` (an ``nn.Sequential`` of :class:`TransformerBlock`) on
    ``inputs[i]`` and mean-pools over ``seq``; the pooled branch outputs are
    concatenated on dim 1 and ``self.head`` (Linear) gives ``(batch, classes)`` logits.
    """

    def __init__(self, config: MMTConfig | None = None) -> None:
        super().__init__()
        self.config: MMTConfig = config if config is not None else MMTConfig()
        c = self.config
        self.branches = nn.ModuleList(
            nn.Sequential(*(TransformerBlock(c.seq, c.hidden, c.heads, c.ffn) for _ in range(c.depth)))
            for _ in range(c.branches)
        )
        self.head = nn.Linear(c.branches * c.hidden, c.classes)

    @classmethod
    def small(cls, **overrides: int) -> MultiModalTransformer:
        """Build the small size (see :class:`MMTConfig`), with config overrides."""
        return cls(MMTConfig.small(**overrides))

    @classmethod
    def paper(cls, **overrides: int) -> MultiModalTransformer:
        """Build the paper size (see :meth:`MMTConfig.paper`), with config overrides."""
        return cls(MMTConfig.paper(**overrides))

    def forward(self, *inputs: Tensor) -> Tensor:
        """Map ``branches`` tensors of shape ``(batch, seq, hidden)`` to ``(batch, classes)`` logits."""
        if isinstance(inputs, tuple) and len(inputs) != self.config.branches:
            # Only checked eagerly; under fx tracing ``inputs`` is a single Proxy.
            raise ValueError(
                f"MultiModalTransformer expects {self.config.branches} inputs, got {len(inputs)}"
            )
        pooled = [branch(inputs[i]).mean(dim=1) for i, branch in enumerate(self.branches)]
        return self.head(torch.cat(pooled, dim=1))

    def example_inputs(
        self, batch: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, ...]:
        """Random float inputs: ``branches`` tensors of shape ``(batch, seq, hidden)``."""
        _check_batch(batch)
        c = self.config
        device = _module_device(self)
        return tuple(_randn((batch, c.seq, c.hidden), device, generator) for _ in range(c.branches))

    def example_targets(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random class labels (int64, shape ``(batch,)``) for cross-entropy."""
        _check_batch(batch)
        return _randint(self.config.classes, (batch,), _module_device(self), generator)
