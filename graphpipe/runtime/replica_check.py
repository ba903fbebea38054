"""``check_replicas_every``: whether the replicas of every replicated stage still hold the same
parameters and buffers (``Pipeline.check_replicas``, and inside ``step`` every N-th step), by a
checksum of each one's bytes compared between replicas (replica_agreement.py), exchanged over the
pipeline's group like every other verdict (a failure of the exchange fails the pipeline)."""

from __future__ import annotations

from graphpipe.errors import InputError
from graphpipe.runtime.connections import Link
from graphpipe.runtime.replica_agreement import digests, first_disagreement
from graphpipe.runtime.stages import LocalStage

__all__ = ["ReplicaCheck"]


class ReplicaCheck:
    """When and how one rank compares its stage's replicas with the other ranks'.

    Args:
        every: ``check_replicas_every`` (None: never inside ``step``).
        local_updates: whether the replicas update on their own gradients (local SGD, QSR):
            they differ inside a round by design, so only their parameters are compared, and at
            the end of a step rather than before its optimizer step.
        link: the pipeline's connections (the exchange).
        local: this rank's stage (its module is read when the check runs: it may be swapped).
    """

    def __init__(self, every: int | None, local_updates: bool, link: Link, local: LocalStage) -> None:
        self.every = every
        self.local_updates = local_updates
        self._link = link
        self._local = local

    def due(self, step_count: int, after_step: bool = False) -> bool:
        """Whether ``every`` checks now, ``step_count`` steps done: before the optimizer step of
        every N-th step, where the replicas sum their gradients; at the end of it (``after_step``,
        the step counted) where they update on their own, whose replicas differ inside a round."""
        if self.every is None or after_step != self.local_updates:
            return False
        return (step_count if after_step else step_count + 1) % self.every == 0

    def disagreement(self, before_step: bool) -> str | None:
        """Collective: where some replicated stage's replicas differ (parameters and buffers, or
        ``before_step`` parameters and summed gradients), in words; None when they agree."""
        mine = digests(self._local.module, before_step) if self._local.replicated else []
        everyone = self._link.gather(mine, "comparing the replicas")
        return first_disagreement([st.ranks for st in self._local.cut.stages], dict(enumerate(everyone)))

    def check(self) -> None:
        """Collective: InputError on every rank when some replicated stage's replicas differ."""
        problem = self.disagreement(before_step=False)
        if problem is not None:
            raise InputError(f"Pipeline.check_replicas: {problem}")
