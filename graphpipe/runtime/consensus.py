"""One verdict for every rank: a change that each rank checks on its own (a load, a restore) is
applied on all of them or on none.

Each rank checks its own part first and changes nothing; then the ranks exchange their verdicts
(``Failures.agree``: one ``all_gather_object`` over the pipeline's group, whose collectives have
the pipeline's deadline, and whose failure fails the pipeline like any other collective's) and
either every rank applies its part or every rank raises the same ``InputError`` naming the first
rank that refused and why. Without it a load that failed on one rank left that rank unchanged and
the others loaded, and training went on with a mixed model. This module is the verdict's wording,
for the agreements (:func:`check`) and for the checkpoint's refusals (:func:`refusals`).
"""

from __future__ import annotations

from collections.abc import Sequence

from graphpipe.errors import InputError

__all__ = ["check", "refusals"]


def refusals(verdicts: Sequence[str | None]) -> str | None:
    """``on rank R (and ranks [...]): reason``, the first refusing rank's reason, for every
    rank's verdict (None: it agrees); None when no rank refused."""
    refused = [(r, v) for r, v in enumerate(verdicts) if v is not None]
    if not refused:
        return None
    first_rank, reason = refused[0]
    others = f" (and ranks {[r for r, _ in refused[1:]]})" if len(refused) > 1 else ""
    return f"on rank {first_rank}{others}: {reason}"


def check(verdicts: Sequence[str | None], what: str) -> None:
    """Returns when no rank refused; otherwise raises ``InputError`` naming every refusing rank
    and the first one's reason (the same on every rank, which all hold the same verdicts).
    ``what`` names the operation ("load_state_dict")."""
    refused = refusals(verdicts)
    if refused is not None:
        raise InputError(f"{what} refused {refused}; no rank changed anything")
