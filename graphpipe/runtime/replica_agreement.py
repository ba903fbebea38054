"""Replicas that start equal and can be shown to stay equal.

A replicated stage's replicas, and the copies of a parameter tied across stages, are one set of
weights held on several ranks. Ranks build the model themselves, so their copies start equal only
if every rank seeded alike; one that did not (a script seeding by rank, or not at all) kept its
difference forever, since summed gradients move every copy by the same amount. So ``wrap`` makes
them equal as DDP does when it is built: each set is broadcast from its first holder
(``torch.distributed.utils._sync_module_states``, DDP's own function, for a stage's parameters
and buffers; one flat broadcast for tied copies, which live under other names on other stages).

``digests`` and ``first_disagreement`` are the opt-in check (``Pipeline.check_replicas``): a
hash of each parameter's and buffer's bytes, compared between the replicas of every stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn
from torch.distributed.utils import _sync_module_states, _sync_params_and_buffers

from graphpipe.runtime.checksums import digest

__all__ = ["broadcast_buffers_from_first_replica", "broadcast_from_first_replica", "digests", "first_disagreement"]

#: Bytes per coalesced broadcast (DDP's default bucket for its initial broadcast, 250 MiB).
_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def broadcast_from_first_replica(module: nn.Module, replica_group: Any) -> None:
    """Collective over a stage's replicas: every replica's parameters and buffers become its
    first replica's (group rank 0), as DDP's constructor does (``broadcast_buffers=True``)."""
    _sync_module_states(module, replica_group, _BROADCAST_BUCKET_BYTES, src=0,
                        params_and_buffers_to_ignore=set(), broadcast_buffers=True)


def broadcast_buffers_from_first_replica(buffers: Sequence[Any], replica_group: Any) -> None:
    """Collective over a stage's replicas: the first replica's ``buffers`` (the stage module's:
    BatchNorm's running statistics, which each replica updates from its own rows) to every
    replica. DDP does this before each forward; ``step`` does it at the end of each step, so that
    the replicas are equal whenever the user can look (a checkpoint, ``check_replicas``,
    evaluation)."""
    if buffers:
        _sync_params_and_buffers(replica_group, list(buffers), _BROADCAST_BUCKET_BYTES, 0)


def digests(module: nn.Module, before_step: bool = False) -> list[tuple[str, str]]:
    """(name, checksum of the bytes: the checkpoint's, checksums.digest) of each parameter and
    buffer of ``module``, in module order. ``before_step``: of each parameter and its summed
    gradient (``name.grad``) instead, what must agree before an optimizer step; the buffers are
    left out there, since each replica's BatchNorm statistics are of its own rows until the
    step's end makes them the first replica's."""
    if before_step:
        return [entry for name, p in module.named_parameters()
                for entry in ((name, digest(p)), (f"{name}.grad", digest(p.grad) if p.grad is not None else "none"))]
    return [(name, digest(tensor)) for name, tensor in [*module.named_parameters(), *module.named_buffers()]]


def first_disagreement(stage_ranks: Sequence[Sequence[int]],
                       by_rank: Mapping[int, list[tuple[str, str]]]) -> str | None:
    """Where the replicas of some stage differ, in words (stage, ranks, first entry); None when
    every replicated stage's replicas hold the same bytes. ``by_rank``: each rank's
    :func:`digests`."""
    for stage, ranks in enumerate(stage_ranks):
        if len(ranks) < 2:
            continue
        first = by_rank[ranks[0]]
        for other in ranks[1:]:
            theirs = by_rank[other]
            for (name, mine), (_, their) in zip(first, theirs):
                if mine != their:
                    return (f"stage {stage}'s replicas differ: rank {other}'s {name!r} is not rank "
                            f"{ranks[0]}'s")
            if len(first) != len(theirs):
                return f"stage {stage}'s replicas hold different entries (ranks {ranks[0]} and {other})"
    return None
