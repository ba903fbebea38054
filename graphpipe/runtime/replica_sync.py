"""ReplicaSync: one rank's share of keeping a replicated stage's replicas in agreement, by the
method ``wrap(..., sync=...)`` chose (graphpipe/sync.py).

Two families:

- Gradient methods (AllReduce, TopK, PowerSGD) sum the replicas' gradients every step, in the
  C++ executor's gradient buckets (``_C.GradientBuckets``, runtime/gradient_buckets.h), which
  start each bucket's communication hook as soon as the last backward has produced its
  gradients. Each replica's gradients are exact shares of the micro-batch's (the loss is scaled
  by the replica's share of the rows), so an exact sum is the single-process gradient.
- Local methods (LocalSGD, QSR) exchange nothing during the step: each replica's gradients are
  rescaled from its share of the batch to the mean over its own rows, so that each replica takes
  an ordinary SGD step on its part of the batch; then, at the end of a round, the replicas'
  parameters are averaged with torch's model averaging (``utils.average_parameters``): after
  every ``period`` steps for LocalSGD, at the end of each QSR round. The executor's all-reduce
  instruction does nothing on such a stage (``set_local_updates``).

Every collective of either family goes through a counting wrapper of the replicas' process group
(``_C.counting_group``, runtime/counting_group.h), so ``stats`` reports the bytes this rank really handed to
collectives, whichever code (graphpipe's hooks, torch's hooks and averaging) issued them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphpipe._ext import _C
from graphpipe.errors import InputError
from graphpipe.sync import SyncMethod

__all__ = ["ReplicaSync"]


class ReplicaSync:
    """The sync state of one replica of a replicated stage."""

    def __init__(
        self,
        method: SyncMethod,
        parameters: list[nn.Parameter],
        group: Any,
        timeout: float,
        bucket_bytes: float,
        hierarchy: tuple[Any, Any] | None = None,
    ) -> None:
        """``group``: the stage's replicas' process group. ``hierarchy``: the (intra-node,
        inter-node) groups of this rank, for ``AllReduce(hierarchical=True)``."""
        self.method = method
        self.parameters = parameters
        # What torch's hooks and averaging are given: every collective they issue is counted.
        self.group = _C.counting_group(group)
        self.buckets: Any = None
        self.steps = 0
        self.syncs = 0
        self._round_left = 0  # local methods: steps left in the current round (0: one starts)
        # The method's hook on the gradient buckets (graphpipe/sync.py); None: local updates.
        self._hook = method.gradient_hook(self.group, hierarchy)
        if self._hook is None and not method.local_updates:
            raise InputError(f"sync method {method!r} makes no gradient hook and does not update locally: "
                             "a SyncMethod must do one of the two (graphpipe/sync.py)")
        if self._hook is not None:
            self.buckets = _C.GradientBuckets(parameters, self.group, timeout, bucket_bytes, hook=self._hook.hook)

    # ---- per step --------------------------------------------------------------------------
    def before_step(self, optimizer: Any) -> None:
        """Local methods need the optimizer: they step it themselves, then average."""
        if self.method.local_updates and optimizer is None:
            raise InputError(f"sync={self.method.describe()}: pass optimizer= to step(); a local-SGD replica "
                             "must step before its parameters are averaged, inside step()")
        if self.method.local_updates and self._round_left == 0:  # a round starts: its length
            self._round_left = self.method.round_length(float(optimizer.param_groups[0]["lr"]))

    def after_backward(self, share: float) -> None:
        """Local methods: this replica's gradients become the mean over its own rows."""
        if not self.method.local_updates or share == 1.0:
            return
        with torch.no_grad():
            for p in self.parameters:
                if p.grad is not None:
                    p.grad.div_(share)

    def after_optimizer_step(self) -> None:
        """Local methods: average the parameters at the end of a round."""
        self.steps += 1
        if not self.method.local_updates:
            self.syncs += 1
            return
        # A round of local steps ends with one average of every parameter (torch's
        # model_averaging.utils.average_parameters, over all parameters: torch's averagers skip
        # those without a gradient, which could leave replicas that differ in which parameters
        # a step reached out of step with each other).
        self._round_left -= 1
        if self._round_left == 0:
            from torch.distributed.algorithms.model_averaging import utils

            utils.average_parameters(iter(self.parameters), self.group)
            self.syncs += 1

    # ---- figures and checkpoints -------------------------------------------------------------
    @property
    def bytes_communicated(self) -> int:
        """Bytes this rank handed to the replicas' collectives so far (measured by the counting
        process groups)."""
        if self.buckets is not None:
            return int(self.buckets.bytes_communicated)
        return int(self.group.bytes_communicated)

    def stats(self) -> dict[str, Any]:
        return {"method": self.method.describe(), "steps": self.steps, "syncs": self.syncs,
                "bytes": self.bytes_communicated}

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue exactly: counters, the local round's steps left,
        top-k's residuals, PowerSGD's state (its error feedback, warm-start factors, random
        generator and iteration count)."""
        state: dict[str, Any] = {"method": repr(self.method), "steps": self.steps, "syncs": self.syncs,
                                 "round_left": self._round_left}
        key = self._hook_state_key()
        if key is not None:
            state[key] = self._hook.state_dict()
        return state

    def _hook_state_key(self) -> str | None:
        return self._hook.state_key if self._hook is not None else None

    def state_refusal(self, state: Any) -> str | None:
        """Why ``state`` cannot be restored here (None: it can), checked before anything is set."""
        if not isinstance(state, dict) and not hasattr(state, "get"):
            return f"sync state must be a dict (sync_state_dict()), got a {type(state).__name__}"
        if state.get("method") != repr(self.method):
            return f"sync state was saved for {state.get('method')}, this pipeline runs {self.method!r}"
        key = self._hook_state_key()
        needed = ["steps", "syncs", "round_left"] + ([key] if key is not None else [])
        lacking = [k for k in needed if k not in state]
        if lacking:
            return f"sync state lacks {lacking}"
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        refusal = self.state_refusal(state)
        if refusal is not None:
            raise InputError(refusal)
        self.steps, self.syncs, self._round_left = state["steps"], state["syncs"], state["round_left"]
        key = self._hook_state_key()
        if key is not None:
            self._hook.load_state_dict(state[key])


def sync_state_refusal(sync: ReplicaSync | None, state: Any, rank: int) -> str | None:
    """Why rank ``rank``, whose replica sync is ``sync`` (None: it holds no replicated stage),
    cannot restore the sync ``state`` (None: it can)."""
    if sync is None:
        return f"rank {rank} holds no replicated stage, but was given sync state" if state else None
    return sync.state_refusal(state)
