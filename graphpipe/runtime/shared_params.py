"""Tied weights across stages: each stage that uses a parameter holds its own copy, and before
every optimizer step the copies' gradients are summed over the ranks that hold them.

In one process a tied parameter (say an input embedding reused as the output projection) gets
one gradient, the sum of what each use contributes. With its users on different stages, each
stage's rank computes the contribution of its own uses; an all-reduce (sum) in a process group
of exactly those ranks gives every copy the full gradient, so identical optimizers keep the
copies identical, as one parameter. The groups are made once, in ``wrap``
(``graphpipe/runtime/process_group.py``);
each group's gradients travel as one flat tensor.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from graphpipe._ext import _C

__all__ = ["SharedParameterSync"]


class SharedParameterSync:
    """Sums the gradients of parameters held by several stages (see the module docstring).

    Args:
        shared: canonical parameter name -> {stage: that parameter's name in the stage module}
            (``StageCut.shared_params``).
        stage_ranks: ranks (in the pipeline) of each stage, its lead first (several for a
            replicated stage, whose replicas hold equal, already summed gradients).
        my_stages: this rank's stages (none, one, or several that each run on it alone).
        module: the module holding this rank's stages' state (stages.py ``local_module``).
        make_group: pipeline ranks -> their process group on a member, None elsewhere; called on
            every rank for every set of holders, in the same order.
        timeout: seconds an all-reduce may take before ``PipelineTimeout``.
        is_lead: whether this rank is its stage's lead (first replica).
    """

    def __init__(
        self,
        shared: Mapping[str, Mapping[int, str]],
        stage_ranks: list[list[int]],
        my_stages: list[int],
        module: nn.Module,
        make_group: Callable[[list[int]], Any],
        timeout: float,
        is_lead: bool = True,
    ) -> None:
        self.timeout = timeout
        by_ranks: dict[tuple[int, ...], list[str]] = {}
        # Every replica of a holding stage joins (each needs the total); only the lead of each
        # stage contributes its gradient, the other replicas zeros, so each stage counts once.
        self._contributes = is_lead
        for name, users in sorted(shared.items()):
            # Two holders on one rank hold one tensor (their stage modules share the traced
            # module's parameter), whose gradient autograd already sums there: a rank counts once,
            # and a parameter all of whose holders are on one rank needs no group.
            ranks = tuple(sorted({r for s in users for r in stage_ranks[s]}))
            if len(ranks) > 1:
                by_ranks.setdefault(ranks, []).append(name)
        self._syncs: list[tuple[tuple[int, ...], Any, list[nn.Parameter]]] = []
        # Every rank asks for every group, in the same order: torch's group names depend on it
        # (graphpipe/runtime/process_group.py); non-members get None.
        for ranks, names in sorted(by_ranks.items()):
            sub = make_group(list(ranks))
            if sub is None:
                continue
            params = [module.get_parameter(next(shared[n][s] for s in my_stages if s in shared[n])) for n in names]
            self._syncs.append((ranks, sub, params))

    @property
    def active(self) -> bool:
        """Whether this rank holds a parameter shared with another stage."""
        return bool(self._syncs)

    def broadcast_from_first(self) -> None:
        """Every copy of each tied parameter becomes its first holder's (the lowest rank of its
        group), so that copies built from different seeds start as one parameter."""
        with torch.no_grad():
            for ranks, sub, params in self._syncs:
                flat = _flatten_dense_tensors([p.detach() for p in params])
                self._wait(dist.broadcast(flat, group=sub, group_src=0, async_op=True), ranks, "broadcasting")
                for p, value in zip(params, _unflatten_dense_tensors(flat, params)):
                    p.copy_(value)

    def _wait(self, work: Any, ranks: tuple[int, ...], doing: str) -> None:
        try:
            completed = work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            raise _C.PeerError(f"graphpipe: {doing} tied parameters with ranks {list(ranks)} failed: {exc}") from exc
        if completed is False:
            raise _C.PipelineTimeout(f"graphpipe: {doing} tied parameters with ranks {list(ranks)} did not finish "
                                     f"within {self.timeout:g} s")

    def all_reduce(self) -> None:
        """Sums each shared parameter's gradient over its holders (a rank whose uses produced no
        gradient contributes zeros)."""
        for ranks, sub, params in self._syncs:
            grads = [p.grad if p.grad is not None and self._contributes else torch.zeros_like(p) for p in params]
            flat = _flatten_dense_tensors(grads)
            self._wait(dist.all_reduce(flat, group=sub, async_op=True), ranks, "summing the gradients of")
            for p, summed in zip(params, _unflatten_dense_tensors(flat, grads)):
                if p.grad is None:
                    p.grad = summed
                else:
                    p.grad.copy_(summed)
