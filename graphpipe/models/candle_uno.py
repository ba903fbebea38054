"""CANDLE-Uno: parallel feed-forward feature branches joined by a regression MLP."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import MLP, _check_batch, _check_positive, _make_config, _module_device, _randn

__all__ = ["CandleUno", "CandleUnoConfig"]


@dataclass(frozen=True)
class CandleUnoConfig:
    """Configuration of :class:`CandleUno`.

    The defaults are the small size; :meth:`paper` gives the paper size
    (7 branches of 4 FF layers of 4096 on 1024 input features, top MLP 3 x 4096).
    """

    branches: int = 4
    feature_in: int = 16
    width: int = 32
    depth: int = 2
    top_width: int = 32
    top_depth: int = 2
    out: int = 1

    def __post_init__(self) -> None:
        _check_positive(
            self, ("branches", "feature_in", "width", "depth", "top_width", "top_depth", "out")
        )

    @classmethod
    def small(cls, **overrides: int) -> CandleUnoConfig:
        """Small size for fast CPU tests, with field overrides."""
        return _make_config(cls, {}, overrides)  # type: ignore[return-value]

    @classmethod
    def paper(cls, **overrides: int) -> CandleUnoConfig:
        """Paper size, with field overrides (the paper sweeps ``branches`` up to 16)."""
        base = dict(
            branches=7, feature_in=1024, width=4096, depth=4, top_width=4096, top_depth=3, out=1
        )
        return _make_config(cls, base, overrides)  # type: ignore[return-value]


class CandleUno(nn.Module):
    """Multi-branch MLP regressor.

    ``forward(*inputs)`` takes ``branches`` float tensors of shape
    ``(batch, feature_in)``.  Branch ``i`` is ``self.branches[i]``, an
    :class:`MLP` of ``depth`` Linear+ReLU layers of ``width``; the branch outputs
    are concatenated on dim 1, fed through ``self.top`` (``top_depth`` Linear+ReLU
    layers of ``top_width``) and ``self.out`` (Linear to ``out``), giving ``(batch, out)``.
    """

    def __init__(self, config: CandleUnoConfig | None = None) -> None:
        super().__init__()
        self.config: CandleUnoConfig = config if config is not None else CandleUnoConfig()
        c = self.config
        self.branches = nn.ModuleList(
            MLP(c.feature_in, [c.width] * c.depth) for _ in range(c.branches)
        )
        self.top = MLP(c.branches * c.width, [c.top_width] * c.top_depth)
        self.out = nn.Linear(c.top_width, c.out)

    @classmethod
    def small(cls, **overrides: int) -> CandleUno:
        """Build the small size (see :class:`CandleUnoConfig`), with config overrides."""
        return cls(CandleUnoConfig.small(**overrides))

    @classmethod
    def paper(cls, **overrides: int) -> CandleUno:
        """Build the paper size (see :meth:`CandleUnoConfig.paper`), with config overrides."""
        return cls(CandleUnoConfig.paper(**overrides))

    def forward(self, *inputs: Tensor) -> Tensor:
        """Map ``branches`` tensors of shape ``(batch, feature_in)`` to ``(batch, out)``."""
        if isinstance(inputs, tuple) and len(inputs) != self.config.branches:
            # Only checked eagerly; under fx tracing ``inputs`` is a single Proxy.
            raise ValueError(f"CandleUno expects {self.config.branches} inputs, got {len(inputs)}")
        feats = [branch(inputs[i]) for i, branch in enumerate(self.branches)]
        return self.out(self.top(torch.cat(feats, dim=1)))

    def example_inputs(
        self, batch: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, ...]:
        """Random float inputs: ``branches`` tensors of shape ``(batch, feature_in)``."""
        _check_batch(batch)
        c = self.config
        device = _module_device(self)
        return tuple(_randn((batch, c.feature_in), device, generator) for _ in range(c.branches))

    def example_targets(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random float regression targets of shape ``(batch, out)`` for MSE."""
        _check_batch(batch)
        return _randn((batch, self.config.out), _module_device(self), generator)
