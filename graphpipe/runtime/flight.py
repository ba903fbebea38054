"""Who is stuck: each rank's flight recorder (the executor's ring of its last instructions,
``_C.FlightRecorder``), what the rank is doing now as its peers can see it, and the dumps
``python -m graphpipe diagnose`` reads.

- A daemon watcher thread per pipeline publishes this rank's state in the pipeline's store
  namespace (the ``FailureBoard``'s, which outlives a stuck rank) under ``flight/now/<rank>``:
  the instruction it runs or waits on (from the recorder, which the executor updates with the
  GIL released), or the Python activity it is in (the loss sum, the optimizer step, an injected
  hang), or "idle" between steps. It looks 10 times a second and publishes a state only once
  the state has lasted ``min(0.5 s, timeout / 4)``: a healthy pipeline changes instruction far
  more often, so it writes to the store only in long waits (a store such as ``FileStore``
  grows with every write), and every state that matters at a timeout has lasted the timeout.
  It needs the GIL: a rank stuck in a C++ call that holds it publishes nothing new, and is
  then named by its silence ("published no state"). It also republishes an unchanged state
  every ``HEARTBEAT_SECONDS`` (1 s; each publication carries its time, ``at``), so that a rank
  that saw a peer leave inside a collective can tell which peer went silent (:func:`silent`).
- When a wait times out, :meth:`Flight.diagnose` reads every rank's state and follows the
  chain of waits from this rank to the rank that waits on no peer: the culprit. Every rank
  that times out finds the same one; the failure it publishes names it, what it was doing and
  what every other rank waited for (failure.py), so every rank's error names the culprit,
  the culprit's own too once it wakes.
- On a failure each rank writes ``rank<R>.json`` (its records, its state and the states it
  saw, the failure) into the dump folder (:func:`dump_dir`); :func:`diagnose_folder` reads
  the dumps back and names the first transfer no peer matched and the culprit.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

__all__ = ["DIR_ENV", "SIZE_ENV", "Flight", "describe_state", "diagnose_folder", "dump_dir",
           "enable_nccl_flight_recorder", "find_culprit"]

#: Where dumps go when ``wrap(flight_recorder_dir=None)``; empty or ``off`` turns dumps off.
DIR_ENV = "GRAPHPIPE_FLIGHT_RECORDER_DIR"
#: How many records each rank keeps (default 1024; 0 turns the recorder off).
SIZE_ENV = "GRAPHPIPE_FLIGHT_RECORDER_SIZE"
_TICK_SECONDS = 0.1
#: How often the watcher republishes an unchanged state: the proof of life that tells a peer
#: that died from one that waits (one store write a second per rank).
HEARTBEAT_SECONDS = 1.0
_KEY = "flight/now/"
_CODES = {"recv_activation": "SF", "send_activation": "RF", "recv_gradient": "SB", "send_gradient": "RB"}
_TRANSFER_CODE = {"recv_activation": "RF", "send_activation": "SF", "recv_gradient": "RB", "send_gradient": "SB"}


def dump_dir(option: str | None) -> str | None:
    """The dump folder: ``option`` if given (``""``: no dumps), else ``$GRAPHPIPE_FLIGHT_RECORDER_DIR``
    (empty or ``off``: no dumps), else ``<tempdir>/graphpipe-flight`` (the default: dumps are
    small and written only on a failure)."""
    value = option if option is not None else os.environ.get(DIR_ENV)
    if value is None:
        return os.path.join(tempfile.gettempdir(), "graphpipe-flight")
    return None if value.strip() in ("", "off") else value


def recorder_size() -> int:
    """``$GRAPHPIPE_FLIGHT_RECORDER_SIZE`` (default 1024 records; 0: off)."""
    return int(os.environ.get(SIZE_ENV, "1024"))


def enable_nccl_flight_recorder(folder: str | None) -> None:
    """Turns on torch's own flight recorder for the NCCL groups made from now on (it reads
    these variables when a group is made), unless the user set them: a trace buffer of 2000
    collectives per rank, dumped on a timeout to ``<folder>/nccl_trace_rank_<R>`` (read them
    with torch's ``torchfrtrace <folder> -p nccl_trace_rank_``)."""
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if folder:
        os.makedirs(folder, exist_ok=True)
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(folder, "nccl_trace_rank_"))


def describe_state(rank: int, state: dict[str, Any] | None, now: float | None = None) -> str:
    """One rank's state in words: ``rank 1 is running 1F0 (forward of ...) for 5.1 s``."""
    if state is None:
        return f"rank {rank} published no state (dead, or stuck in a call that holds Python's GIL)"
    now = time.time() if now is None else now
    ago = f"{max(0.0, now - float(state.get('since', now))):.1f} s"
    # An instruction ("on 0RB0e0 (...)", "running 1F0 (...)") or a Python activity ("in the
    # loss sum ...", "hanging (...)"), which names itself.
    token = state.get("token")
    what = f"{token} ({state.get('what')})" if token else str(state.get("what", ""))
    if state.get("note"):
        what += f" [{state['note']}]"
    peers = state.get("peers") or []
    if state["state"] in ("waiting", "failed") and peers:
        names = f"rank{'s' if len(peers) > 1 else ''} {', '.join(map(str, peers))}"
        return f"rank {rank} waits for {names} {'on ' if token else ''}{what} since {ago}"
    if state["state"] == "idle":
        return f"rank {rank} is outside the pipeline (between steps, in the caller's code) for {ago}"
    return f"rank {rank} is {'running ' if token else ''}{what} for {ago}"


def find_culprit(states: dict[int, dict[str, Any] | None], start: int) -> int | None:
    """Follows the waits from rank ``start`` (each waiting rank to the first of its peers not
    seen yet) to the rank that waits on no peer; None for a cycle of waits."""
    seen: list[int] = []
    rank = start
    while rank not in seen:
        seen.append(rank)
        state = states.get(rank)
        if state is None or state.get("state") not in ("waiting", "failed") or not state.get("peers"):
            return rank
        ahead = [p for p in state["peers"] if p not in seen]
        if not ahead:
            return None
        rank = ahead[0]
    return None


class Flight:
    """One pipeline's flight recording on this rank: the watcher thread, the Python
    activities, the diagnosis of a timeout and the dump.

    Args:
        store: the pipeline's store namespace (the FailureBoard's).
        rank, world: this rank in the pipeline's group, and the group's size.
        timeout: the pipeline's timeout in seconds.
        folder: where to dump on a failure (None: no dumps).
        edges: the plan's stage edges as (src, dst) stage pairs (for the dumps' matching).
    """

    def __init__(self, store: Any, rank: int, world: int, timeout: float, folder: str | None,
                 edges: list[tuple[int, int]]) -> None:
        self.store = store
        self.rank = rank
        self.world = world
        self.timeout = timeout
        self.folder = folder
        self.edges = edges
        self.recorder: Any = None
        self.step = 0
        self._activity: list[dict[str, Any]] = []
        self._failed: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._threshold = min(0.5, timeout / 4.0)
        self._thread: threading.Thread | None = None

    # ---- what this rank is doing ---------------------------------------------------------
    def attach(self, recorder: Any) -> None:
        """Watches ``recorder`` (the executor's ``flight_recorder``) from now on."""
        self.recorder = recorder
        size = recorder_size()
        if recorder.capacity != size:
            recorder.capacity = size
        if self._thread is None and self.world > 1:
            self._thread = threading.Thread(target=_watch, args=(weakref.ref(self), self._stop),
                                            name=f"graphpipe-flight-{self.rank}", daemon=True)
            self._thread.start()

    @contextlib.contextmanager
    def activity(self, what: str, peers: list[int] | None = None) -> Iterator[None]:
        """This rank is in ``what`` (Python code outside the executor) while the block runs;
        ``peers``: the ranks it waits for there (a collective), none when it computes."""
        entry = {"token": "", "what": what, "state": "waiting" if peers else "running", "peers": list(peers or []),
                 "since": time.time(), "note": ""}
        self._activity.append(entry)
        try:
            yield
        except BaseException:
            # Where this rank stopped, for the diagnosis that follows (the block is left by then).
            self._failed = dict(entry, state="failed" if peers else "running")
            raise
        finally:
            self._activity.remove(entry)

    def state(self) -> dict[str, Any]:
        """What this rank is doing now: its innermost Python activity, else the executor's
        current instruction, else idle (since the last record ended)."""
        if self._activity:
            state = dict(self._activity[-1])
        elif self._failed is not None:
            state = dict(self._failed)
        else:
            current = self.recorder.current() if self.recorder is not None else None
            if current is not None:
                since = current["start"]
                state = {k: current[k] for k in ("token", "what", "state", "peers", "note")}
                state["since"] = since
            else:
                last = self.recorder.last() if self.recorder is not None else None
                state = {"token": "", "what": "idle", "state": "idle", "peers": [], "note": "",
                         "since": last["end"] or last["start"] if last else time.time()}
        state["step"] = self.step
        return state

    def publish(self, state: dict[str, Any] | None = None) -> None:
        """Publishes this rank's state (now) for its peers."""
        with contextlib.suppress(Exception):  # a store that went away: the peers learn nothing new
            self.store.set(f"{_KEY}{self.rank}", json.dumps(dict(state or self.state(), at=time.time())))

    def silent(self, seconds: float) -> list[int]:
        """The other ranks whose last publication is older than ``seconds`` (or who published
        none): after a peer left, with every live rank's watcher beating each second, the one
        that died."""
        now = time.time()
        return [r for r, state in self.states().items()
                if r != self.rank and (state is None or now - float(state.get("at", 0.0)) > seconds)]

    def states(self) -> dict[int, dict[str, Any] | None]:
        """Every rank's last published state (None where a rank published none)."""
        out: dict[int, dict[str, Any] | None] = {}
        for r in range(self.world):
            key = f"{_KEY}{r}"
            try:
                out[r] = json.loads(self.store.get(key)) if self.store.check([key]) else None
            except Exception:
                out[r] = None
        return out

    def close(self) -> None:
        """Stops the watcher thread (it ends within a tick)."""
        self._stop.set()

    # ---- after a failure -----------------------------------------------------------------
    def diagnose(self) -> tuple[int, str] | None:
        """After this rank's wait timed out: (the culprit rank, one line naming it, what it
        does and what every other rank waits for), or None when the waits form a cycle."""
        mine = self.state()
        self.publish(mine)
        time.sleep(2 * _TICK_SECONDS)  # peers timing out at the same moment publish too
        states = self.states()
        states[self.rank] = mine
        culprit = find_culprit(states, self.rank)
        if culprit is None:
            return None
        now = time.time()
        head = describe_state(culprit, states.get(culprit), now)
        others = [describe_state(r, states.get(r), now) for r in range(self.world) if r != culprit]
        kind = "stuck" if states.get(culprit) is not None else "gone"
        text = f"rank {culprit} is {kind} (it waits on no peer): {head}" + "".join(f"; {o}" for o in others)
        return culprit, text

    def dump(self, failure: str, error: str) -> str | None:
        """Writes this rank's dump (``<folder>/rank<R>.json``); its path, or None when dumps
        are off or the folder cannot be written."""
        if not self.folder:
            return None
        data = {
            "rank": self.rank, "world": self.world, "time": time.time(), "step": self.step,
            "timeout": self.timeout, "failure": failure, "error": error, "state": self.state(),
            "states": {str(r): s for r, s in self.states().items()}, "edges": self.edges,
            "records": self.recorder.records() if self.recorder is not None else [],
        }
        path = os.path.join(self.folder, f"rank{self.rank}.json")
        try:
            os.makedirs(self.folder, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(data, f)
            os.replace(path + ".tmp", path)
        except OSError:
            return None
        return path


def _watch(ref: weakref.ref, stop: threading.Event) -> None:
    """The watcher: publishes the owner's state once it has lasted the threshold; ends when
    stopped or when the Flight is gone (it holds only a weak reference, never the executor)."""
    published: tuple | None = None
    published_at = time.monotonic()
    seen: tuple | None = None
    seen_at = 0.0
    while not stop.wait(_TICK_SECONDS):
        flight = ref()
        if flight is None:
            return
        try:
            state = flight.state()
        except Exception:
            return
        key = (state["token"], state["what"], state["state"], state["since"])
        now = time.monotonic()
        if key != seen:
            seen, seen_at = key, now
        if (key != published and now - seen_at >= flight._threshold) or now - published_at >= HEARTBEAT_SECONDS:
            flight.publish(state)
            published, published_at = key, now
        del flight


# ---- python -m graphpipe diagnose -------------------------------------------------------------


def _load(folder: str) -> dict[int, dict[str, Any]]:
    dumps = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            dumps[int(data["rank"])] = data
    return dumps


def _matched(record: dict[str, Any], peer: dict[str, Any]) -> bool:
    """Whether ``peer``'s dump holds the transfer that pairs with ``record``, posted before
    ``record`` ended."""
    want = _CODES[record["kind"]]
    ended = record["end"] or float("inf")
    return any(_TRANSFER_CODE.get(r["kind"]) == want and r["micro_batch"] == record["micro_batch"]
               and r["edge"] == record["edge"] and r["start"] <= ended for r in peer["records"])


def _first_unmatched(dumps: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any], int] | None:
    """(rank, record, peer) of the earliest transfer that was waited on (or failed) and that
    no peer posted the other half of (a peer without a dump never posted anything we know)."""
    found = []
    for rank, data in dumps.items():
        runs = [r["run"] for r in data["records"]]
        last = max(runs) if runs else 0
        for rec in data["records"]:
            if rec["kind"] not in _CODES or rec["state"] == "completed" or rec["run"] != last:
                continue
            for peer in rec["peers"]:
                if peer not in dumps or not _matched(rec, dumps[peer]):
                    waited = rec["state"] in ("waiting", "failed")
                    found.append((not waited, rec["start"], rank, rec, peer))
    if not found:
        return None
    _, _, rank, rec, peer = min(found, key=lambda f: (f[0], f[1]))
    return rank, rec, peer


def _pair_token(rec: dict[str, Any], edges: list[list[int]]) -> str:
    src, dst = edges[rec["edge"]] if 0 <= rec["edge"] < len(edges) else ("?", "?")
    other = src if rec["stage"] == dst else dst
    return f"{other}{_CODES[rec['kind']]}{rec['micro_batch']}e{rec['edge']}"


def diagnose_folder(folder: str) -> tuple[list[str], int | None]:
    """Reads the dumps in ``folder``; (the report's lines, the culprit rank or None)."""
    dumps = _load(folder)
    if not dumps:
        return [f"no flight recorder dumps (rank<R>.json) in {folder}"], None
    world = max(int(d["world"]) for d in dumps.values())
    missing = [r for r in range(world) if r not in dumps]
    lines = [f"flight recorder dumps of ranks {sorted(dumps)} of {world}"
             + (f" (no dump from ranks {missing}: dead, or still stuck)" if missing else "")]
    # What each rank did when the pipeline failed: as the first rank to fail saw it (a rank
    # that was stuck dumps only once it wakes, doing something else by then), else the rank's
    # own dump.
    first_dump = min(dumps.values(), key=lambda d: float(d["time"]))
    states: dict[int, dict[str, Any] | None] = {int(r): s for r, s in first_dump["states"].items()}
    states[int(first_dump["rank"])] = first_dump["state"]
    for r in range(world):
        if states.get(r) is None and r in dumps:
            states[r] = dumps[r]["state"]
    first = _first_unmatched(dumps)
    start = min(dumps)
    if first is not None:
        rank, rec, peer = first
        lines.append(f"first unmatched instruction: rank {rank} {rec['token']} ({rec['what']}, {rec['state']}) with "
                     f"rank {peer}: rank {peer} never posted {_pair_token(rec, dumps[rank]['edges'])}")
        start = rank
    culprit = find_culprit(states, start)
    when = max(float(d["time"]) for d in dumps.values())
    if culprit is not None:
        lines.append(f"culprit: rank {culprit}: {describe_state(culprit, states.get(culprit), when)}")
    else:
        lines.append("culprit: none found (the ranks' waits form a cycle)")
    lines += [f"  {describe_state(r, states.get(r), when)}" for r in range(world) if r != culprit]
    failures = {d["failure"] for d in dumps.values() if d.get("failure")}
    lines += [f"recorded failure: {f}" for f in sorted(failures)]
    return lines, culprit
