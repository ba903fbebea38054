"""One verdict for every rank: a change that each rank checks on its own (a load, a restore) is
applied on all of them or on none.

Each rank checks its own part first and changes nothing; then the ranks exchange their verdicts
(one ``all_gather_object`` over the pipeline's group, whose collectives have the pipeline's
deadline) and either every rank applies its part or every rank raises the same ``InputError``
naming the first rank that refused and why. Without it a load that failed on one rank left that
rank unchanged and the others loaded, and training went on with a mixed model.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from graphpipe.errors import InputError

__all__ = ["agree"]


def agree(group: Any, refusal: str | None, what: str) -> None:
    """Collective over ``group``: returns when no rank refused; otherwise raises, on every rank,
    ``InputError`` naming every refusing rank and the first one's reason. ``refusal`` is this
    rank's reason to refuse (None: it agrees); ``what`` names the operation ("load_state_dict")."""
    verdicts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, refusal, group=group)
    refused = [(r, v) for r, v in enumerate(verdicts) if v is not None]
    if refused:
        first_rank, reason = refused[0]
        others = f" (and ranks {[r for r, _ in refused[1:]]})" if len(refused) > 1 else ""
        raise InputError(f"{what} refused on rank {first_rank}{others}: {reason}; no rank changed anything")
