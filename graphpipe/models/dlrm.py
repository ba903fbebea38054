"""DLRM-style recommender: parallel dense MLP and sparse embedding branches with dot interaction."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .layers import (
    MLP,
    _check_batch,
    _check_positive,
    _make_config,
    _module_device,
    _rand,
    _randint,
    _randn,
)

__all__ = ["DLRM", "DLRMConfig"]


@dataclass(frozen=True)
class DLRMConfig:
    """Configuration of :class:`DLRM`.

    The defaults are the small size; :meth:`paper` gives the paper size
    (7 dense branches of 4 FF layers of 4096 on 1024 inputs, 7 embedding bags of
    1M x 64 with bag size 100, top MLP 3 x 4096).
    """

    dense_branches: int = 4
    sparse_branches: int = 4
    dense_in: int = 16
    dense_width: int = 32
    dense_depth: int = 2
    emb_rows: int = 100
    emb_dim: int = 8
    bag: int = 4
    top_width: int = 32
    top_depth: int = 2

    def __post_init__(self) -> None:
        _check_positive(
            self,
            (
                "dense_branches",
                "sparse_branches",
                "dense_in",
                "dense_width",
                "dense_depth",
                "emb_rows",
                "emb_dim",
                "bag",
                "top_width",
                "top_depth",
            ),
        )

    @property
    def num_features(self) -> int:
        """Number of interacting feature vectors ``F = dense_branches + sparse_branches``."""
        return self.dense_branches + self.sparse_branches

    @property
    def num_pairs(self) -> int:
        """Number of pairwise interactions ``F * (F - 1) / 2`` (strict upper triangle)."""
        f = self.num_features
        return f * (f - 1) // 2

    @classmethod
    def small(cls, **overrides: int) -> DLRMConfig:
        """Small size for fast CPU tests, with field overrides."""
        return _make_config(cls, {}, overrides)  # type: ignore[return-value]

    @classmethod
    def paper(cls, **overrides: int) -> DLRMConfig:
        """Paper size, with field overrides (about 1.8 GB of embedding weights)."""
        base = dict(
            dense_branches=7,
            sparse_branches=7,
            dense_in=1024,
            dense_width=4096,
            dense_depth=4,
            emb_rows=1_000_000,
            emb_dim=64,
            bag=100,
            top_width=4096,
            top_depth=3,
        )
        return _make_config(cls, base, overrides)  # type: ignore[return-value]


class DLRM(nn.Module):
    """Multi-branch DLRM.

    ``forward(dense, sparse)``:

    * ``dense``: float ``(batch, dense_branches, dense_in)``; dense branch ``i``
      (``self.dense[i]``: :class:`MLP` of ``dense_depth`` Linear+ReLU layers of
      ``dense_width``, then a Linear to ``emb_dim``) is applied to ``dense[:, i]``.
    * ``sparse``: int64 ``(batch, sparse_branches, bag)`` indices in
      ``[0, emb_rows)``; sparse branch ``i`` (``self.sparse[i]``:
      ``nn.EmbeddingBag(emb_rows, emb_dim, mode="sum")``) is applied to
      ``sparse[:, i]`` (2-D input form, no offsets).

    The ``F`` feature vectors are stacked to ``z`` of shape ``(batch, F, emb_dim)``;
    interactions are ``bmm(z, z^T)`` restricted to the strict upper triangle
    (via the non-persistent index buffer ``triu_idx`` of shape ``(2, F*(F-1)/2)``),
    concatenated with ``z.mean(1)``, then ``self.top`` (``top_depth`` Linear+ReLU
    layers of ``top_width``) and ``self.out`` (Linear to 1), giving ``(batch, 1)``.
    """

    triu_idx: Tensor

    def __init__(self, config: DLRMConfig | None = None) -> None:
        super().__init__()
        self.config: DLRMConfig = config if config is not None else DLRMConfig()
        c = self.config
        self.dense = nn.ModuleList(
            nn.Sequential(
                MLP(c.dense_in, [c.dense_width] * c.dense_depth),
                nn.Linear(c.dense_width, c.emb_dim),
            )
            for _ in range(c.dense_branches)
        )
        self.sparse = nn.ModuleList(
            nn.EmbeddingBag(c.emb_rows, c.emb_dim, mode="sum") for _ in range(c.sparse_branches)
        )
        f = c.num_features
        self.register_buffer("triu_idx", torch.triu_indices(f, f, offset=1), persistent=False)
        self.top = MLP(c.num_pairs + c.emb_dim, [c.top_width] * c.top_depth)
        self.out = nn.Linear(c.top_width, 1)

    @classmethod
    def small(cls, **overrides: int) -> DLRM:
        """Build the small size (see :class:`DLRMConfig`), with config overrides."""
        return cls(DLRMConfig.small(**overrides))

    @classmethod
    def paper(cls, **overrides: int) -> DLRM:
        """Build the paper size (see :meth:`DLRMConfig.paper`), with config overrides."""
        return cls(DLRMConfig.paper(**overrides))

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        """Map dense ``(B, Dn, dense_in)`` and sparse ``(B, Sp, bag)`` inputs to ``(B, 1)``."""
        feats = [branch(dense[:, i]) for i, branch in enumerate(self.dense)]
        feats += [bag(sparse[:, i]) for i, bag in enumerate(self.sparse)]
        z = torch.stack(feats, dim=1)  # (B, F, emb_dim)
        zz = torch.bmm(z, z.transpose(1, 2))  # (B, F, F)
        pairs = zz[:, self.triu_idx[0], self.triu_idx[1]]  # (B, F*(F-1)/2)
        x = torch.cat([pairs, z.mean(dim=1)], dim=1)
        return self.out(self.top(x))

    def example_inputs(
        self, batch: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, ...]:
        """Random ``(dense, sparse)``: float ``(batch, dense_branches, dense_in)`` and
        int64 ``(batch, sparse_branches, bag)`` indices in ``[0, emb_rows)``."""
        _check_batch(batch)
        c = self.config
        device = _module_device(self)
        dense = _randn((batch, c.dense_branches, c.dense_in), device, generator)
        sparse = _randint(c.emb_rows, (batch, c.sparse_branches, c.bag), device, generator)
        return dense, sparse

    def example_targets(self, batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random float targets in ``[0, 1)`` (click probabilities) of shape ``(batch, 1)`` for MSE."""
        _check_batch(batch)
        return _rand((batch, 1), _module_device(self), generator)
