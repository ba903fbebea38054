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

import contextlib
import itertools
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from graphpipe._ext import _C
from graphpipe.errors import InputError
from graphpipe.runtime import consensus

__all__ = ["Collective", "Failure", "FailureBoard", "Failures", "collective_error", "describe", "pipeline_store"]

_POLL_SECONDS = 0.02
# How long a rank that saw a peer leave waits for that peer's cause before publishing its own
# "a peer left": Gloo closes a timed-out rank's connections inside the collective, before that
# rank's Python has reached the store, so the survivor's "connection closed" can come first.
_PEER_CAUSE_GRACE_SECONDS = 2.0
_instances: dict[tuple[int, ...], itertools.count] = {}


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _what(type_name: str, message: str) -> str:
    return f"{type_name}: {message}".rstrip(": ")


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``, as a :class:`Failure` shows it."""
    return _what(type(exc).__name__, _first_line(exc))


@dataclass(frozen=True)
class Failure:
    """A pipeline's first failure as the store holds it: the rank it started on (the culprit:
    for a timeout, the rank found stuck, flight.py), the exception's type name, the first line
    of its message, and the rank that published it (``reporter``, -1: the failing rank itself;
    not compared)."""

    rank: int
    type_name: str
    message: str
    reporter: int = field(default=-1, compare=False)

    @classmethod
    def of(cls, rank: int, exc: BaseException) -> Failure:
        """``exc``, raised on ``rank``, as the others are told of it."""
        return cls(rank, type(exc).__name__, _first_line(exc))

    def encode(self) -> bytes:
        return json.dumps({"rank": self.rank, "type": self.type_name, "message": self.message,
                           "reporter": self.reporter}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Failure:
        fields = json.loads(raw)
        return cls(int(fields["rank"]), str(fields["type"]), str(fields["message"]), int(fields.get("reporter", -1)))

    def reported_by(self, rank: int) -> bool:
        """Whether ``rank`` published this failure about itself (its own exception)."""
        return self.rank == rank and self.reporter in (rank, -1)

    def __str__(self) -> str:
        """``rank R: Type: message``."""
        return f"rank {self.rank}: {_what(self.type_name, self.message)}"


def collective_error(exc: RuntimeError, rank: int, timeout: float, during: str) -> BaseException:
    """A raw torch.distributed error as graphpipe's: PipelineTimeout for a deadline, PeerError
    for a peer that went away (anything else is returned as it is)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return _C.PipelineTimeout(f"rank {rank}: timed out after {timeout:g} s {during}: {text}")
    if "connection" in text.lower() or "closed" in text.lower() or "peer" in text.lower():
        return _C.PeerError(f"rank {rank}: a peer left {during}: {text}")
    return exc


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

    def publish(self, exc: BaseException, named: Failure | None = None) -> Failure:
        """Records ``exc`` (or ``named``, a failure this rank found on another rank) as the
        pipeline's failure unless another rank's came first; returns the failure that stands."""
        mine = named if named is not None else Failure.of(self.rank, exc)
        try:
            return Failure.decode(self.store.compare_set(self.KEY, "", mine.encode()))
        except Exception:
            return mine

    def read(self, wait: float = 0.0) -> Failure | None:
        """The failure recorded so far, waiting up to ``wait`` seconds for one to appear."""
        deadline = time.monotonic() + wait
        while True:
            try:
                if self.store.check([self.KEY]):
                    return Failure.decode(self.store.get(self.KEY))
            except Exception:
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


class Failures:
    """A pipeline's failure state: the first failure fails the pipeline for good, on every rank.

    ``close`` releases the pipeline's connections (destroying its process group is what wakes
    the peers blocked on this rank)."""

    def __init__(self, board: FailureBoard, timeout: float, close: Callable[[], None]) -> None:
        self.board = board
        self.timeout = timeout
        self._close = close
        #: The first failure, once the pipeline failed.
        self.cause: Failure | None = None
        #: The pipeline's flight recording (flight.py), once connected: it names the rank a
        #: timeout was stuck on and dumps this rank's records on a failure.
        self.flight: Any = None

    def usable(self, executor: Any) -> Any:
        """``executor``, if the pipeline neither failed nor was closed (InputError otherwise)."""
        if self.cause is not None:
            raise InputError(
                f"this pipeline stopped after a failure ({self.cause}); its ranks can no longer "
                "be in step: build a new one with graphpipe.wrap"
            )
        if executor is None:
            raise InputError("this pipeline was closed (Pipeline.close); wrap the model again to train it")
        return executor

    def fail(self, exc: BaseException, during: str) -> BaseException:
        """After an error inside a collective part of the pipeline: records the first failure
        in the store, closes this rank's connections, and returns what to raise (with ``raise``,
        not ``raise ... from exc``: the cause is set here): the error itself on the rank it
        started on; elsewhere a PeerError naming that rank and its cause, or a PipelineTimeout
        when this rank or that one timed out. A rank that saw a peer leave first waits briefly
        for that peer's cause, so that every survivor names the first failure."""
        rank = self.board.rank
        if isinstance(exc, RuntimeError) and not isinstance(exc, _C.GraphpipeError):
            exc = collective_error(exc, rank, self.timeout, during)
        named = None
        if isinstance(exc, _C.PipelineTimeout):
            named = self._stuck()
        elif isinstance(exc, _C.PeerError):
            # A peer that left is a symptom, never the first cause: the rank that left is
            # about to publish why (a dead process publishes nothing, hence the bound).
            if self.board.read(wait=min(_PEER_CAUSE_GRACE_SECONDS, self.timeout)) is None:
                named = self._gone(during)
        cause = self.board.publish(exc, named)
        self.cause = cause
        self._close()
        if self.flight is not None:
            self.flight.close()
            self.flight.dump(str(cause), describe(exc))
        if cause.reported_by(rank):
            # Raised as it is, with no cause: `raise exc from exc` would make exc its own cause,
            # a cycle that keeps its traceback's frames (and the executor and process group in
            # their locals) alive until the garbage collector runs, so the peers blocked on
            # this rank would wait for that, or for this process's exit, to wake.
            return exc
        timed_out = isinstance(exc, _C.PipelineTimeout) or cause.type_name == _C.PipelineTimeout.__name__
        error_type = _C.PipelineTimeout if timed_out else _C.PeerError
        error = error_type(f"rank {rank}: the pipeline failed on {cause} (seen here {during}: {describe(exc)})")
        error.__cause__ = exc  # as `raise error from exc` would
        return error

    def _stuck(self) -> Failure | None:
        """After this rank timed out: the failure of the rank found stuck (flight.py), or None
        (no flight recording, or the waits form a cycle)."""
        found = self.flight.diagnose() if self.flight is not None else None
        if found is None:
            return None
        culprit, text = found
        return Failure(culprit, _C.PipelineTimeout.__name__, text, reporter=self.board.rank)

    def _gone(self, during: str) -> Failure | None:
        """After a peer left without a word (killed, crashed): its failure, when this rank was
        waiting on that one peer alone, or, in a collective, when exactly one other rank's
        heartbeat stopped (flight.py); else None."""
        state = self.flight.state() if self.flight is not None else None
        peers = state.get("peers") if state else None
        if not peers:
            return None
        if len(peers) != 1:
            # Every live rank republishes its state each HEARTBEAT_SECONDS; this rank already
            # waited the grace period for a cause, so the dead one has been silent that long.
            peers = [r for r in self.flight.silent(_PEER_CAUSE_GRACE_SECONDS - 0.2) if r in peers]
            if len(peers) != 1:
                return None
        what = f"{state['token']} ({state['what']})" if state.get("token") else state.get("what", during)
        text = (f"rank {peers[0]} left without a word (its process died or was killed) while rank "
                f"{self.board.rank} waited for it on {what}")
        return Failure(peers[0], _C.PeerError.__name__, text, reporter=self.board.rank)

    def activity(self, what: str, peers: list[int] | None = None) -> Any:
        """A context in which this rank does ``what`` outside the executor, waiting for ``peers``
        (flight.py's activity, so that a timeout there can name the rank that never came);
        nothing before the pipeline is connected."""
        if self.flight is None:
            return contextlib.nullcontext()
        return self.flight.activity(what, peers)

    def waiting(self, what: str) -> Any:
        """:meth:`activity` waiting for every other rank (a collective ``what``)."""
        return self.activity(what, [r for r in range(self.board.world) if r != self.board.rank])

    def collective(self, what: str) -> Collective:
        """The one way a collective part of the pipeline fails together (a step, an evaluation,
        a checkpoint's DCP collectives, every exchange of verdicts): any error raised inside
        ``with failures.collective(what) as part:`` fails the pipeline (:meth:`fail`) and leaves
        as what :meth:`fail` returns. ``part.what`` says what the part is doing, for the error
        that names a failure; set it as the part moves on."""
        return Collective(self, what)

    def gather(self, group: Callable[[], Any], local: Any, during: str) -> list[Any]:
        """``local`` from every rank (all_gather_object on ``group()``, the live pipeline's
        group, taken before the exchange: it refuses a failed or closed pipeline); a failure of
        the exchange fails the pipeline."""
        everyone: list[Any] = [None] * self.board.world
        group()  # refuses a failed or closed pipeline before the exchange
        # The group is not kept in a local: this frame is in a failure's traceback, and a handle
        # held there would keep the group, and so this rank's connections, open (see fail).
        with self.collective(during), self.waiting(during):
            dist.all_gather_object(everyone, local, group=group())
        return everyone

    def agree(self, group: Callable[[], Any], what: str, refusal: str | None) -> None:
        """Every rank's verdict on ``what`` (``refusal``: this rank's reason to refuse, None: it
        agrees), exchanged by :meth:`gather`: returns when no rank refused, otherwise raises the
        same InputError on every rank (consensus.py), which keeps the pipeline usable; a failure
        of the exchange itself fails the pipeline."""
        consensus.check(self.gather(group, refusal, f"agreeing on {what}"), what)


class Collective:
    """A collective part of a pipeline (:meth:`Failures.collective`); ``what`` it is doing now."""

    def __init__(self, failures: Failures, what: str) -> None:
        self._failures = failures
        self.what = what

    def __enter__(self) -> Collective:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, traceback: Any) -> bool:
        # An error after the pipeline failed (a nested part that failed it, a refusal of the
        # failed pipeline) is already the failure's report: it leaves as it is.
        if exc is None or self._failures.cause is not None:
            return False
        error = self._failures.fail(exc, self.what)
        if error is exc:  # this rank's own error, raised as it is (see Failures.fail)
            return False
        raise error
