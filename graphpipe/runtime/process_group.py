"""The pipeline's process groups (its own, and one per set of ranks holding tied parameters),
created so that every rank gets the same group.

Why a module of its own: torch names a new group in one of two ways, and both can leave ranks
waiting on each other forever when used carelessly.

- ``new_group(ranks)`` (collective over the whole world) names the group from a counter that
  every rank of the world advances alike, so names agree and never repeat. It needs every
  rank of the world to call it, which is the case when the pipeline spans the whole world
  (``wrap`` without ``group=``, the usual case).
- ``new_group(ranks, use_local_synchronization=True)`` (only the group's ranks call it) names
  the group by hashing its ranks *and the number of groups this process holds* (torch 2.13 and
  2.14, ``_hash_ranks_to_str``). Ranks that hold different numbers of groups, because the user
  made a subgroup that only some of them belong to, compute different names and wait in
  Gloo's rendezvous under different store prefixes; and after a group is destroyed the count
  falls, a name repeats, and the new group meets the old one's keys in the store. Both hung
  ``benchmarks/compare.py`` under torchrun, and the tied-parameter groups of 3 and 4 ranks (made
  by their members alone) hung the model corpus. So over the whole world every rank of the
  pipeline makes every group, members or not; over a subgroup the members first compare the
  name torch is about to give, through the failure board (whose waits time out), and refuse a
  name that differs or that this process has already used, with an error that says why.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from graphpipe.errors import InputError
from graphpipe.runtime.failure import FailureBoard

__all__ = ["Ranks", "global_ranks", "new_process_group"]

#: Names of groups this process created with local synchronization (torch never reuses a name
#: safely; see the module docstring).
_local_names_used: set[str] = set()


def new_process_group(
    global_ranks: list[int],
    member_ranks: list[int],
    whole_world: bool,
    backend: str,
    timeout: float,
    board: FailureBoard,
    purpose: str,
) -> Any:
    """A new process group of ``global_ranks`` for one pipeline; every rank of the pipeline
    calls it, members and others alike, with the same arguments and in the same order.
    ``member_ranks``: the members' ranks in the pipeline (the board's ranks). ``whole_world``:
    the pipeline spans every rank of the default group. ``purpose`` names the group in errors
    ("the pipeline", "tied parameters"). Returns the group on its members, None elsewhere."""
    deadline = datetime.timedelta(seconds=timeout)
    member = board.rank in member_ranks
    if whole_world:
        group = dist.new_group(global_ranks, timeout=deadline, backend=backend)
        return group if member else None
    if not member:
        return None
    name = _local_group_name(global_ranks)
    if name is not None:
        key = f"process group name: {purpose} {sorted(member_ranks)}"
        board.share(key, name)
        names = board.collect(key, ranks=sorted(member_ranks), what=f"process group name ({purpose})")
        differing = {r: n for r, n in names.items() if n != name}
        if differing:
            raise InputError(
                f"graphpipe.wrap over a subgroup: torch would name the process group of {purpose} "
                f"{name[:12]}... on rank {board.rank} but differently on ranks {sorted(differing)}. Torch "
                "hashes a subgroup's name from its ranks and the number of process groups each process "
                "holds, so every rank of the pipeline must have created (and destroyed) the same groups "
                "before wrap; or wrap over the whole world"
            )
        if name in _local_names_used:
            raise InputError(
                f"graphpipe.wrap over a subgroup: torch would give the process group of {purpose} the name "
                f"{name[:12]}... of a group this process created before (a group was destroyed in "
                "between, so torch's count of groups fell); its rendezvous would meet the old group's "
                "keys and hang. Create one more process group on every rank of the pipeline first, or "
                "wrap over the whole world"
            )
        _local_names_used.add(name)
    return dist.new_group(global_ranks, timeout=deadline, backend=backend, use_local_synchronization=True)


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in a pipeline: its ``rank`` in the pipeline's group, the group's
    ``world_size``, and the default group's rank of every pipeline rank (``global_ranks``, what
    torch's collectives on the pipeline's group name their sources by)."""

    rank: int
    world_size: int
    global_ranks: tuple[int, ...]

    @classmethod
    def of(cls, group: Any) -> Ranks:
        return cls(dist.get_rank(group), dist.get_world_size(group), tuple(global_ranks(group)))

    def others(self) -> list[int]:
        """Every pipeline rank but this one."""
        return [r for r in range(self.world_size) if r != self.rank]


def global_ranks(group: Any) -> list[int]:
    """The default group's rank of every rank of ``group``, in ``group``'s order."""
    size = dist.get_world_size(group)
    if group is dist.distributed_c10d._get_default_group():
        return list(range(size))
    return [dist.get_global_rank(group, r) for r in range(size)]


def _local_group_name(global_ranks: list[int]) -> str | None:
    """The name torch's ``new_group(..., use_local_synchronization=True)`` is about to give,
    computed by torch's own (private) function; None where this torch has none."""
    namer = getattr(dist.distributed_c10d, "_hash_ranks_to_str", None)
    if namer is None:
        return None
    return str(namer(sorted(global_ranks)))
