"""Local ranks: runs a function on N ranks of this machine (Gloo over a FileStore; NCCL, one
GPU per rank, on request), for calibration, benchmarks, examples and tests.

Every rank is a fresh process (spawned, or forked from a server that imported graphpipe once)
with ``torch.set_num_threads(1)``; results travel back through ``torch.save`` files, errors as
(type name, message, traceback). Every wait has a deadline and leftover processes are killed, so
a hung pipeline cannot hang the caller.
"""

from __future__ import annotations

import os
import queue as queue_mod
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

__all__ = ["RankResult", "bind_to_cpus", "expect_ok", "rank_cpus", "run_ranks"]


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    seconds: float = 0.0  # from the rank's start to its result


def _thread_lock_for_tqdm() -> None:
    """torch.fx's Interpreter opens a (disabled) tqdm bar, and tqdm's class lock is by default a
    multiprocessing lock, a named semaphore registered with the parent's resource tracker. A rank
    ends in ``os._exit``, which skips the finalizer that unregisters it, so every run left a
    "leaked semaphore" warning at the caller's exit. A rank is one process: a thread lock does."""
    import threading

    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def bind_to_cpus(cpus: set[int]) -> None:
    """Every thread of this process, and every thread it starts from now on, on the CPUs ``cpus``
    alone (Linux). Gloo's threads start with the process group, so a rank binds before joining
    it (run_ranks); benchmarks/cpu_binding_bench.py binds and unbinds a running rank."""
    for thread in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(thread), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            pass


def rank_cpus(world: int) -> list[int]:
    """The CPU each of ``world`` ranks binds to with ``run_ranks(bind_cpus=True)``: rank r the
    r-th CPU this process may run on. A ValueError where there are fewer such CPUs than ranks, or
    where this system cannot bind (no ``os.sched_setaffinity``)."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("bind_cpus=True needs os.sched_setaffinity (Linux); this system has none")
    allowed = sorted(os.sched_getaffinity(0))
    if world > len(allowed):
        raise ValueError(f"bind_cpus=True gives each rank a CPU of its own: {world} ranks but this process may run "
                         f"on {len(allowed)} CPUs ({allowed}); bind fewer ranks or leave bind_cpus off")
    return allowed[:world]


def _entry(rank: int, world: int, store: str, out_dir: str, fn: Callable[..., Any], args: tuple, q: Any,
           backend: str, cpu: int | None = None) -> None:
    if cpu is not None:
        bind_to_cpus({cpu})
    torch.set_num_threads(1)
    _thread_lock_for_tqdm()
    import faulthandler

    import torch.distributed as dist

    faulthandler.enable(all_threads=True)  # a rank that aborts in C++ still prints its Python stacks

    start = time.monotonic()
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
        value = fn(rank, world, *args)
        torch.save(value, os.path.join(out_dir, f"rank{rank}.pt"))
        q.put((rank, True, "", "", "", time.monotonic() - start))
    except BaseException as exc:
        q.put((rank, False, type(exc).__name__, str(exc), traceback.format_exc(), time.monotonic() - start))
    finally:
        q.close()
        q.join_thread()
        os._exit(0)  # never wait for a broken process group to shut down


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 120.0,
              backend: str = "gloo", start_method: str = "spawn", bind_cpus: bool = False) -> list[RankResult]:
    """Calls ``fn(rank, world, *args)`` on ``world`` spawned ranks; one result per rank (a rank
    that neither returned nor raised within ``timeout`` seconds reports ``TimeoutError``).
    ``backend="nccl"`` gives rank r the GPU r (modulo the GPUs present) before joining.

    ``bind_cpus=True`` binds rank r, all its threads (Gloo's among them), to a CPU of its own
    (rank_cpus(); a ValueError where the ranks outnumber the CPUs). Two such ranks on 2 cores
    stepped 1.003-1.108x as fast as unbound ones (docs/results.md, "Ranks bound to a core
    each"); some transfers still land milliseconds late either way.

    ``start_method="forkserver"`` forks the ranks from a server process that imported torch and
    graphpipe once (and ran nothing), instead of starting each interpreter afresh: for tests that
    start many small jobs (a rank's start drops from seconds to milliseconds). The server keeps
    the environment it started with, so a rank does not see variables set after its first use."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"run_ranks: backend must be 'gloo' or 'nccl', got {backend!r}")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"run_ranks: start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    cpus = rank_cpus(world) if bind_cpus else [None] * world
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # torch._dynamo too: the first tensor clone of a trace imports it (seconds) through
        # torch._disable_dynamo, and every rank would pay that again.
        ctx.set_forkserver_preload(["graphpipe", "torch._dynamo"])
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="graphpipe-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(r, world, store, tmp, fn, args, q, backend, cpus[r]), daemon=True)
            for r in range(world)
        ]
        for p in procs:
            p.start()
        results: dict[int, RankResult] = {}
        deadline = time.monotonic() + timeout
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, ok, etype, msg, tb, secs = q.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
                continue
            value = None
            if ok:
                value = torch.load(os.path.join(tmp, f"rank{rank}.pt"), weights_only=False)
            results[rank] = RankResult(rank, ok, value, etype, msg, tb, secs)
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for r in range(world):
            if r not in results:
                code = procs[r].exitcode
                kind = "TimeoutError" if code is None else ("Killed" if code < 0 else "Died")
                results[r] = RankResult(r, False, error_type=kind, message=f"rank {r} gave no result (exit code {code})")
        q.close()
        return [results[r] for r in range(world)]


def expect_ok(results: list[RankResult]) -> list[RankResult]:
    """``results`` if every rank returned; else an AssertionError with the first failed rank's
    error and traceback."""
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return results
