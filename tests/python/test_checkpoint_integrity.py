"""Checkpoints that cannot lie (graphpipe/runtime/checkpoint.py, checksums.py, checkpoint_folders.py).

- A save over an existing checkpoint, with one rank SIGKILLed at 21 points (before, inside and
  after each rank's shard writes, between the shards and DCP's metadata, around the manifest
  and the folder exchange): every survivor raises PeerError within 5 s, and a fresh set of ranks
  then loads the path and gets the old checkpoint or the new one, bit for bit, never a mix and
  never nothing. The next save removes the dead save's leftovers.
- Bytes flipped inside a model tensor's data, inside an optimizer entry and inside the pickled
  graphpipe record (file sizes unchanged): every load raises the same InputError on every rank,
  naming the entry, and no rank's state changed.
- One rank cannot write its shard (its write raises ENOSPC): every rank raises CheckpointError
  naming it within 5 s, the path keeps its old checkpoint, and the next step trains as
  single-process training does.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from typing import Any

import torch
from test_runtime_gold import make_model
from test_runtime_pipeline import hand_plan

from graphpipe.testing import run_ranks

WORLD = 3
NAME = "candle_uno"
LR = 1e-3
FAST = 5.0
EXTRA_MARK = "graphpipe-extra-marker-0123456789"

#: (rank, point, argument): where the victim kills itself during the second save. The points:
#: "item" = before its k-th item write (-1: the last), "partial" = half way through writing it,
#: "finish" / "finished" = before / after DCP writes .metadata (rank 0), "manifest" /
#: "manifested" = around graphpipe's manifest, "exchange" / "exchanged" = around the folder
#: exchange, "replaced" = after the replacement, before the closing agreement, "prepare" = at
#: the start of the save, "written" = after DCP's save returned on this rank.
KILL_POINTS = [
    (0, "prepare", 0), (1, "prepare", 0), (2, "prepare", 0),
    (0, "item", 0), (1, "item", 0), (2, "item", 0),
    (0, "partial", 0), (1, "partial", 0), (2, "partial", 0),
    (0, "partial", -1), (1, "partial", -1), (2, "partial", -1),
    (0, "finish", 0), (0, "finished", 0),
    (0, "manifest", 0), (0, "manifested", 0),
    (0, "exchange", 0), (0, "exchanged", 0), (0, "replaced", 0),
    (1, "written", 0), (2, "written", 0),
]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(point: str, argument: int) -> None:
    """Makes this process kill itself at ``point`` of the next save (see KILL_POINTS)."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.filesystem as fs

    from graphpipe.runtime import checkpoint, checkpoint_folders, checksums

    if point in ("item", "partial"):
        original_item, original_write = fs._write_item, fs.FileSystemWriter.write_data
        calls = {"n": 0, "items": 0}

        def write_data(self: Any, plan: Any, planner: Any) -> Any:
            calls["items"] = len(plan.items)  # this rank's items, after DCP removed duplicates
            return original_write(self, plan, planner)

        def write_item(transforms: Any, stream: Any, data: Any, item: Any, *rest: Any) -> Any:
            target = argument if argument >= 0 else calls["items"] + argument
            if calls["n"] == target:
                if point == "partial":
                    stream.write(b"\x5a" * 64)  # part of an item on disk, flushed
                    stream.flush()
                    os.fsync(stream.fileno())
                _die()
            calls["n"] += 1
            return original_item(transforms, stream, data, item, *rest)

        fs.FileSystemWriter.write_data = write_data
        fs._write_item = write_item
    elif point in ("finish", "finished"):
        original_finish = fs.FileSystemWriter.finish

        def finish(self: Any, *args: Any, **kwargs: Any) -> Any:
            if point == "finish":
                _die()
            original_finish(self, *args, **kwargs)
            _die()

        fs.FileSystemWriter.finish = finish
    elif point in ("manifest", "manifested"):
        original_write = checksums.Manifest.write

        def write(self: Any, folder: str) -> None:
            if point == "manifest":
                _die()
            original_write(self, folder)
            _die()

        checksums.Manifest.write = write
    elif point in ("exchange", "exchanged"):
        original_exchange = checkpoint_folders._exchange

        def exchange(a: str, b: str) -> bool:
            if point == "exchange":
                _die()
            done = original_exchange(a, b)
            _die()
            return done

        checkpoint_folders._exchange = exchange
    elif point == "replaced":
        original_replace = checkpoint.replace

        def replace(*args: Any) -> None:
            original_replace(*args)
            _die()

        checkpoint.replace = replace
    elif point == "prepare":
        def state_to_save(*args: Any) -> Any:
            _die()

        checkpoint._state_to_save = state_to_save
    elif point == "written":
        original_save = dcp.save

        def save(*args: Any, **kwargs: Any) -> Any:
            result = original_save(*args, **kwargs)
            _die()
            return result

        dcp.save = save
    else:
        raise ValueError(point)


def _pipeline(world: int) -> tuple[Any, Any, list[Any]]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model(NAME)
    pipe = graphpipe.wrap(model, example, default_loss(NAME), plan=hand_plan(model, example, world), timeout=60)
    optimizer = torch.optim.Adam(list(pipe.parameters()), lr=LR)
    return pipe, optimizer, batches


def _kill_worker(rank: int, world: int, path: str, victim: int, point: str, argument: int) -> dict[str, Any]:
    """One step, save (the old checkpoint), one step, save again with ``victim`` armed to die."""
    pipe, optimizer, batches = _pipeline(world)
    pipe.step(*batches[0], optimizer=optimizer)
    pipe.save(path, optimizer=optimizer, extra={"note": EXTRA_MARK, "which": "old"})
    pipe.step(*batches[1], optimizer=optimizer)
    if rank == victim:
        _arm(point, argument)
    start = time.monotonic()
    try:
        pipe.save(path, optimizer=optimizer, extra={"note": EXTRA_MARK, "which": "new"})
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def _reference_worker(rank: int, world: int, old: str, new: str) -> None:
    """The two checkpoints the killed saves are between, written without a fault."""
    pipe, optimizer, batches = _pipeline(world)
    with pipe:
        pipe.step(*batches[0], optimizer=optimizer)
        pipe.save(old, optimizer=optimizer, extra={"note": EXTRA_MARK, "which": "old"})
        pipe.step(*batches[1], optimizer=optimizer)
        pipe.save(new, optimizer=optimizer, extra={"note": EXTRA_MARK, "which": "new"})


def _loaded(pipe: Any, optimizer: Any, path: str) -> dict[str, Any]:
    extra = pipe.load(path, optimizer=optimizer)
    return {"extra": extra, "step_count": pipe.step_count, "model": pipe.full_state_dict(),
            "optim": optimizer.state_dict()}


def _load_worker(rank: int, world: int, paths: list[str], resave: str) -> dict[str, Any]:
    """Loads every path on fresh ranks; each one's state, or its error."""
    pipe, optimizer, _ = _pipeline(world)
    out: dict[str, Any] = {}
    with pipe:
        for path in paths:
            try:
                out[path] = _loaded(pipe, optimizer, path)
            except Exception as exc:
                out[path] = {"error": f"{type(exc).__name__}: {exc}"}
        pipe.save(resave, optimizer=optimizer)  # removes the leftovers of the dead save
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def test_a_save_killed_at_any_point_leaves_the_old_checkpoint_or_the_new_one(tmp_path: Any) -> None:
    old, new = str(tmp_path / "ref-old"), str(tmp_path / "ref-new")
    for r in run_ranks(_reference_worker, WORLD, old, new, timeout=120, start_method="forkserver"):
        assert r.ok, (r.rank, r.error_type, r.message, r.traceback)
    folders = []
    for k, (victim, point, argument) in enumerate(KILL_POINTS):
        path = str(tmp_path / f"kill{k}")
        results = run_ranks(_kill_worker, WORLD, path, victim, point, argument, timeout=120, start_method="forkserver")
        where = (victim, point, argument)
        assert results[victim].error_type == "Killed", (where, results[victim])
        for r in results:
            if r.rank == victim:
                continue
            assert r.ok, (where, r.rank, r.error_type, r.message, r.traceback)
            assert r.value["error"] == "PeerError", (where, r.rank, r.value)
            assert r.value["seconds"] < FAST, (where, r.rank, r.value)
        folders.append(path)
        survivors = [r.value["seconds"] for r in results if r.rank != victim]
        print(f"\nkilled rank {victim} at {point} {argument}: survivors raised after "
              f"{min(survivors):.2f}-{max(survivors):.2f} s")
    resave = str(tmp_path / "kill0")
    results = run_ranks(_load_worker, WORLD, [old, new, *folders], resave, timeout=600, start_method="forkserver")
    for r in results:
        assert r.ok, (r.rank, r.error_type, r.message, r.traceback)
        states = r.value
        assert states[old]["extra"]["which"] == "old" and states[new]["extra"]["which"] == "new"
        assert not _same(states[old]["model"], states[new]["model"])
        for path, (victim, point, argument) in zip(folders, KILL_POINTS):
            got = states[path]
            assert "error" not in got, (victim, point, argument, got)
            which = got["extra"]["which"]
            assert _same(got, states[old if which == "old" else new]), (victim, point, argument, which)
    seen = {results[0].value[p]["extra"]["which"] for p in folders}
    assert seen == {"old", "new"}, seen  # the points cover both sides of the replacement
    assert not [p for p in os.listdir(tmp_path) if p.startswith("kill0.")], os.listdir(tmp_path)


# ---- flipped bytes ----------------------------------------------------------------------------
DAMAGE = ["model tensor", "optimizer entry", "pickled record"]


def _flip(folder: str, key: str, needle: bytes | None) -> None:
    """Flips one byte inside the entry ``key``'s data in its shard file (size unchanged): inside
    ``needle`` where given (found within the entry's bytes), else in the middle of the entry."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(folder).read_metadata()
    [(index, info)] = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == key]
    shard = os.path.join(folder, info.relative_path)
    with open(shard, "r+b") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
        at = blob.find(needle) + len(needle) // 2 if needle is not None else info.length // 2
        assert needle is None or blob.find(needle) >= 0, (key, "needle not found")
        f.seek(info.offset + at)
        byte = blob[at]
        f.write(bytes([byte ^ 0x01]))


def _damage_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch.distributed as dist

    pipe, optimizer, batches = _pipeline(world)
    good = os.path.join(root, "good")
    with pipe:
        pipe.step(*batches[0], optimizer=optimizer)
        pipe.save(good, optimizer=optimizer, extra={"note": EXTRA_MARK})
        pipe.step(*batches[1], optimizer=optimizer)  # now differs from the checkpoint
        names = {"model tensor": None, "optimizer entry": None}
        if pipe.stage == 0:
            weight = max(pipe.named_parameters(), key=lambda item: item[1].numel())
            names = {"model tensor": f"model.{weight[0]}", "optimizer entry": f"optim.state.{weight[0]}.exp_avg"}
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, names)
        keys = next(n for n in everyone if n["model tensor"] is not None)
        keys["pickled record"] = "graphpipe"
        if rank == 0:
            for what in DAMAGE:
                folder = os.path.join(root, what)
                shutil.copytree(good, folder)
                _flip(folder, keys[what], EXTRA_MARK.encode() if what == "pickled record" else None)
        dist.barrier()
        out: dict[str, Any] = {"keys": keys}
        for what in DAMAGE:
            before = (pipe.full_state_dict(), optimizer.state_dict())
            try:
                pipe.load(os.path.join(root, what), optimizer=optimizer)
                out[what] = {"error": None}
            except Exception as exc:
                out[what] = {"error": type(exc).__name__, "message": str(exc)}
            out[what]["unchanged"] = _same(before, (pipe.full_state_dict(), optimizer.state_dict()))
        pipe.load(good, optimizer=optimizer)
        out["after"] = float(pipe.step(*batches[1], optimizer=optimizer))
    return out


def test_flipped_bytes_are_refused_on_every_rank_naming_the_entry(tmp_path: Any) -> None:
    from graphpipe import InputError, load_into_model, model_state_dict

    results = run_ranks(_damage_worker, WORLD, str(tmp_path), timeout=240, start_method="forkserver")
    for r in results:
        assert r.ok, (r.rank, r.error_type, r.message, r.traceback)
    keys = results[0].value["keys"]
    for what in DAMAGE:
        messages = {r.value[what].get("message") for r in results}
        assert len(messages) == 1, (what, messages)
        for r in results:
            got = r.value[what]
            assert got["error"] == "InputError", (what, r.rank, got)
            assert repr(keys[what]) in got["message"], (what, keys[what], got["message"])
            assert got["unchanged"], (what, r.rank)
    assert len({r.value["after"] for r in results}) == 1
    # The single-process readers refuse them too.
    model, _, _ = make_model(NAME)
    for what in DAMAGE:
        folder = str(tmp_path / what)
        try:
            load_into_model(model, folder, optimizer=torch.optim.Adam(model.parameters(), lr=LR))
            raise AssertionError(f"{what}: load_into_model accepted a damaged checkpoint")
        except InputError as exc:
            assert repr(keys[what]) in str(exc), (what, str(exc))
            print(f"{what}: {exc}")
    try:
        model_state_dict(str(tmp_path / "model tensor"))
        raise AssertionError("model_state_dict accepted a damaged checkpoint")
    except InputError as exc:
        assert repr(keys["model tensor"]) in str(exc), str(exc)


# ---- a rank that cannot write ---------------------------------------------------------------
def _unwritable_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    import torch.distributed.checkpoint.filesystem as fs

    from graphpipe.runtime.checkpoint import model_state_dict

    pipe, optimizer, batches = _pipeline(world)
    path = os.path.join(root, "ckpt")
    with pipe:
        pipe.step(*batches[0], optimizer=optimizer)
        pipe.save(path, optimizer=optimizer)
        before = model_state_dict(path)
        if rank == 1:
            def no_space(*args: Any, **kwargs: Any) -> Any:
                raise OSError(errno.ENOSPC, "No space left on device")

            fs._write_item = no_space
        start = time.monotonic()
        out: dict[str, Any] = {}
        try:
            pipe.save(path, optimizer=optimizer)
            out["error"] = None
        except Exception as exc:
            out.update(error=type(exc).__name__, message=str(exc))
        out["seconds"] = time.monotonic() - start
        out["kept"] = _same(before, model_state_dict(path))
        out["leftovers"] = sorted(p for p in os.listdir(root) if p != "ckpt")
        pipe.step(*batches[1], optimizer=optimizer)
        out["params"] = {n: p.detach().clone() for n, p in pipe.named_parameters()}
    return out


def test_a_rank_that_cannot_write_fails_every_rank_and_training_goes_on(tmp_path: Any) -> None:
    from graphpipe.models import default_loss

    results = run_ranks(_unwritable_worker, WORLD, str(tmp_path), timeout=240, start_method="forkserver")
    for r in results:
        assert r.ok, (r.rank, r.error_type, r.message, r.traceback)
        got = r.value
        assert got["error"] == "CheckpointError", (r.rank, got)
        assert "rank 1" in got["message"] and "No space left" in got["message"], got["message"]
        assert got["seconds"] < FAST, got["seconds"]
        assert got["kept"] and got["leftovers"] == [], got
    # The two steps are single-process training's (Adam on the same batches).
    model, _, batches = make_model(NAME)
    loss_fn = default_loss(NAME)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    for inputs, targets in batches[:2]:
        opt.zero_grad()
        loss_fn(model(*inputs), targets).backward()
        opt.step()
    expected = dict(model.named_parameters())
    for r in results:
        for name, value in r.value["params"].items():
            torch.testing.assert_close(value, expected[name].detach(), rtol=1e-5, atol=1e-6)
