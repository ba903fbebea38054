"""Runs a function on N local ranks (Gloo over a FileStore; NCCL, one GPU per rank, on request),
for tests, examples and benchmarks.

Every rank is a fresh spawned process with ``torch.set_num_threads(1)``; results travel back
through ``torch.save`` files, errors as (type name, message, traceback). Every wait has a
deadline and leftover processes are killed, so a hung pipeline cannot hang the caller.
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

__all__ = ["RankResult", "reference_training", "run_cases", "run_ranks", "seeded_batches"]


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


def _entry(rank: int, world: int, store: str, out_dir: str, fn: Callable[..., Any], args: tuple, q: Any,
           backend: str) -> None:
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
              backend: str = "gloo", start_method: str = "spawn") -> list[RankResult]:
    """Calls ``fn(rank, world, *args)`` on ``world`` spawned ranks; one result per rank (a rank
    that neither returned nor raised within ``timeout`` seconds reports ``TimeoutError``).
    ``backend="nccl"`` gives rank r the GPU r (modulo the GPUs present) before joining.

    ``start_method="forkserver"`` forks the ranks from a server process that imported torch and
    graphpipe once (and ran nothing), instead of starting each interpreter afresh: for tests that
    start many small jobs (a rank's start drops from seconds to milliseconds). The server keeps
    the environment it started with, so a rank does not see variables set after its first use."""
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"run_ranks: backend must be 'gloo' or 'nccl', got {backend!r}")
    if start_method not in ("spawn", "forkserver"):
        raise ValueError(f"run_ranks: start_method must be 'spawn' or 'forkserver', got {start_method!r}")
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # torch._dynamo too: the first tensor clone of a trace imports it (seconds) through
        # torch._disable_dynamo, and every rank would pay that again.
        ctx.set_forkserver_preload(["graphpipe", "torch._dynamo"])
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="graphpipe-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(r, world, store, tmp, fn, args, q, backend), daemon=True)
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


def run_cases(train: Callable[..., Any], cases: list[tuple]) -> dict[tuple, Any]:
    """On one rank: ``train(*case)`` for each case in order, by case. The first case that raises
    is reported as ``{"error": "Type: message"}`` and ends the run: its pipeline may have left the
    ranks out of step, so later cases would only report that."""
    out: dict[tuple, Any] = {}
    for case in cases:
        try:
            out[case] = train(*case)
        except Exception as exc:
            out[case] = {"error": f"{type(exc).__name__}: {exc}"}
            break
    return out


def seeded_batches(spec: str, steps: int, model_seed: int = 0, data_seed: int = 1) -> tuple[Any, tuple, list]:
    """(model, example inputs, [(inputs, targets)] * steps) of a ``graphpipe.models`` spec, the
    same in every process that asks: the model from ``model_seed``, the batches from ``data_seed``."""
    from graphpipe.models import build_model

    torch.manual_seed(model_seed)
    model, inputs = build_model(spec)
    generator = torch.Generator().manual_seed(data_seed)
    batch = inputs[0].shape[0]
    data = [(model.example_inputs(batch, generator), model.example_targets(batch, generator)) for _ in range(steps)]
    return model, inputs, data


def reference_training(model: Any, batches: list, loss_fn: Callable[..., Any], lr: float) -> list[float]:
    """Plain single-process SGD over ``batches``: the losses every pipeline must reproduce."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(*inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def train_pipeline(pipe: Any, batches: list, lr: float) -> dict[str, Any]:
    """On one rank: SGD over ``batches`` with ``pipe`` (a rank without parameters steps nothing);
    the losses every rank got and this rank's parameters afterwards, what a gold test compares
    with :func:`reference_training`."""
    params = list(pipe.parameters())
    optimizer = torch.optim.SGD(params, lr=lr) if params else None
    losses = []
    for inputs, targets in batches:
        if optimizer:
            optimizer.zero_grad()
        losses.append(pipe.step(inputs, targets))
        if optimizer:
            optimizer.step()
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in pipe.named_parameters()}}


def fail_in_second_step(pipe: Any, mode: str, stall_seconds: float = 0.0) -> None:
    """Makes this rank die (``mode="kill"``: SIGKILL) or stall for ``stall_seconds``
    (``"stuck"``) in the second micro-batch's forward of the second iteration: a fault in the
    middle of a step, for the failure tests."""
    import signal

    calls = {"n": 0}

    def hook(module: Any, args: Any, output: Any) -> None:
        calls["n"] += 1
        if calls["n"] == pipe.num_micro_batches + 2:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                time.sleep(stall_seconds)

    first = next(m for m in pipe.module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(hook)


def steps_until_error(pipe: Any, batches: list) -> dict[str, Any]:
    """Steps ``pipe`` over ``batches``; the graphpipe error that stopped it (type and message)
    and how long the failing step took, or ``error: None``."""
    from graphpipe.errors import GraphpipeError

    start = time.monotonic()
    try:
        for inputs, targets in batches:
            start = time.monotonic()
            pipe.step(inputs, targets)
    except GraphpipeError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


def survivor_errors(results: list[RankResult], victim: int, timeout: float) -> list[dict[str, Any]]:
    """The :func:`steps_until_error` results of every rank but ``victim``, checked: each ran,
    stopped with ``PeerError`` or ``PipelineTimeout``, and within twice ``timeout``."""
    survivors = []
    for r in results:
        if r.rank == victim:
            continue
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        assert r.value["error"] in ("PeerError", "PipelineTimeout"), r.value
        assert r.value["elapsed"] < 2 * timeout, r.value
        survivors.append(r.value)
    return survivors
