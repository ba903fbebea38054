"""Failing together: one rank's error becomes every rank's clear error within seconds.

Two torch mechanisms carry it, nothing of graphpipe's own on the wire:

- the c10d store every process group is built on (the ``TCPStore`` torchrun starts, or the
  ``FileStore`` of ``init_method="file://..."``) holds the first failure's cause under a key of
  the pipeline; ranks that exchange configuration in ``wrap`` poll it, so a rank that fails
  there names itself to the others instead of leaving them in a collective;
- during training, the failing rank destroys the pipeline's own process group (made for it in
  ``wrap``, so the user's default group is untouched). Gloo then closes that rank's connections
  and every peer blocked on it gets "connection closed" at once, which the executor reports as
  a ``PeerError``; the peer reads the cause from the store and tears its own group down in turn,
  so ranks waiting on *it* fail next. (``ProcessGroup.abort()`` does not wake a blocked Gloo
  receive in torch 2.13; closing the group does.)

Every wait in here has the pipeline's deadline.
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from graphpipe._ext import _C
from graphpipe.errors import InputError

__all__ = ["FailureBoard", "describe", "pipeline_store"]

_POLL_SECONDS = 0.02
_instances: dict[tuple[int, ...], itertools.count] = {}


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (what the other ranks are told)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def pipeline_store(group_ranks: list[int]) -> dist.Store:
    """A store namespace for one ``wrap`` call: the default group's store under a prefix made
    of the pipeline's ranks and this process's count of ``wrap`` calls over those same ranks
    (the ranks of one pipeline call ``wrap`` over it equally often, whatever other pipelines
    some of them also build, so they agree on it)."""
    base = dist.distributed_c10d._get_default_store()
    key = tuple(group_ranks)
    count = next(_instances.setdefault(key, itertools.count()))
    return dist.PrefixStore(f"graphpipe/{'-'.join(map(str, key))}/{count}/", base)


class FailureBoard:
    """The first failure of one pipeline, shared through the store, and the exchanges of
    ``wrap`` that must not wait for a rank that already failed.

    Args:
        store: the pipeline's store namespace (:func:`pipeline_store`).
        rank: this rank in the pipeline's group.
        world: the group's size.
        timeout: seconds any wait may take.
    """

    KEY = "failure"

    def __init__(self, store: dist.Store, rank: int, world: int, timeout: float) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.timeout = timeout

    def publish(self, exc: BaseException) -> str:
        """Records ``exc`` as the pipeline's failure unless another rank's came first; returns
        the failure that stands (``rank R: Type: message``)."""
        mine = f"rank {self.rank}: {describe(exc)}"
        try:
            return self.store.compare_set(self.KEY, "", mine).decode()
        except Exception:  # noqa: BLE001 - a store that is gone: our own cause is all we know
            return mine

    def read(self, wait: float = 0.0) -> str | None:
        """The failure recorded so far, waiting up to ``wait`` seconds for one to appear."""
        deadline = time.monotonic() + wait
        while True:
            try:
                if self.store.check([self.KEY]):
                    return self.store.get(self.KEY).decode()
            except Exception:  # noqa: BLE001 - the store itself failed: nothing to read
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_SECONDS)

    # ---- exchanges of wrap ----------------------------------------------------------------
    def share(self, name: str, value: Any) -> None:
        """Publishes this rank's ``value`` under ``name``."""
        self.store.set(f"{name}/{self.rank}", pickle.dumps(value))

    def collect(self, name: str, ranks: list[int] | None = None, what: str = "") -> dict[int, Any]:
        """Every listed rank's value of ``name`` (default: all ranks), waiting until they are
        there; a failure another rank published meanwhile raises ``InputError`` naming it at
        once, and a rank that sends nothing raises ``PipelineTimeout`` after the timeout."""
        ranks = list(range(self.world)) if ranks is None else ranks
        keys = {r: f"{name}/{r}" for r in ranks}
        deadline = time.monotonic() + self.timeout
        while True:
            failure = self.read()
            if failure is not None:
                raise InputError(f"graphpipe.wrap failed on {failure}")
            missing = [r for r, k in keys.items() if not self.store.check([k])]
            if not missing:
                return {r: pickle.loads(self.store.get(k)) for r, k in keys.items()}
            if time.monotonic() >= deadline:
                raise _C.PipelineTimeout(
                    f"graphpipe.wrap on rank {self.rank}: ranks {missing} sent no {what or name} within "
                    f"{self.timeout:g} s; every rank of the group must call graphpipe.wrap"
                )
            time.sleep(_POLL_SECONDS)

    def guard(self, body: Callable[[], Any]) -> Any:
        """Runs ``body``; if it raises, publishes the failure before re-raising it."""
        try:
            return body()
        except BaseException as exc:
            self.publish(exc)
            raise
