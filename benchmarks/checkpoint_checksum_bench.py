"""What checksums and atomic saves cost: ``pipe.save`` / ``pipe.load`` against plain ``dcp.save`` /
``dcp.load`` of the very same state dict, per rank, in GB/s.

    python benchmarks/checkpoint_checksum_bench.py                  # MMT, 4x wider than compare.py's, 2 ranks
    python benchmarks/checkpoint_checksum_bench.py --spec "mmt:branches=4,depth=2,seq=32,hidden=1024,heads=4,ffn=2048,batch=32"

Every rank wraps the model (the sequential partitioner, so that every rank holds a stage of its own), takes one Adam step (so the optimizer state
is there: parameters + two moments), and then, ``--rounds`` times, interleaved so that the
machine's noise falls on every row alike:

- ``dcp.save``: the state dict graphpipe writes for this rank, with torch's ``dcp.save`` and
  ``FileSystemWriter(sync_files=True)`` straight into a fresh folder (no checksums, no rename);
- ``pipe.save``: graphpipe's save of the same pipeline over an existing checkpoint (checksums of
  every entry, the manifest, the staging folder and its exchange with the old one, three
  agreements);
- ``dcp.load``: torch's load of this rank's entries into fresh tensors;
- ``pipe.load``: graphpipe's load (the checks, DCP's load, every entry's checksum verified, the
  copy into the stage and the optimizer);
- ``pipe.save unchecked`` / ``pipe.load unchecked``: the same with the checksums taken out (the
  benchmark replaces the digests with nothing and the verification with a no-op, in its own
  processes), so the rows side by side show what the checksums cost and what the rest of
  graphpipe's save and load cost (the exchanges, the staging folder's rename and the old
  checkpoint's removal; the optimizer state's conversion and ``load_state_dict``);
- ``checksum``: computing this rank's digests alone.

GB/s is this rank's bytes (its tensors' and records' sizes) over the median time; the table shows
the slowest rank's figure and each row's ratio to plain DCP. Writes results/checkpoint_checksum.json.
The files go to ``--dir`` (default: a temporary folder on the disk the results came from).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from graphpipe.testing import run_ranks  # noqa: E402

DEFAULT_SPEC = "mmt:branches=4,depth=2,seq=32,hidden=512,heads=4,ffn=1024,batch=32"
ROWS = ("dcp.save", "pipe.save", "pipe.save unchecked", "dcp.load", "pipe.load", "pipe.load unchecked", "checksum")


def _bytes_of(state: Any) -> int:
    from graphpipe.runtime.checksums import flatten

    total = 0
    for _, value in flatten(state):
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, (bytes, bytearray)):
            total += len(value)
    return total


def _fresh_like(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: _fresh_like(v) for k, v in state.items()}
    return torch.empty_like(state) if isinstance(state, torch.Tensor) else None


@contextlib.contextmanager
def _unchecked(checkpoint: Any, checksums: Any) -> Iterator[None]:
    """graphpipe's save and load without checksums (no digests saved, none verified): the
    baseline the checksums are measured against."""
    digests, verify = checksums.digests, checkpoint._verify
    checksums.digests = lambda state: {}
    checkpoint._verify = lambda *args: None
    try:
        yield
    finally:
        checksums.digests, checkpoint._verify = digests, verify


def _worker(rank: int, world: int, spec: str, root: str, rounds: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import graphpipe
    from graphpipe.models import build_model, default_loss
    from graphpipe.runtime import checkpoint, checksums

    torch.manual_seed(0)
    model, example = build_model(spec)
    name = spec.split(":")[0]
    pipe = graphpipe.wrap(model, example, default_loss(name), partitioner="sequential", replicate=False,
                          timeout=600)
    optimizer = torch.optim.Adam(list(pipe.parameters()), lr=1e-4)
    with pipe:
        batch = int(next(t for t in (example if isinstance(example, tuple) else (example,))
                         if isinstance(t, torch.Tensor)).shape[0])
        g = torch.Generator().manual_seed(1)
        pipe.step(model.example_inputs(batch, generator=g), model.example_targets(batch, generator=g),
                  optimizer=optimizer)
        state = checkpoint._state_to_save(pipe._checkpoint_parts(), optimizer, None)
        size = _bytes_of(state)
        path, unchecked = os.path.join(root, "graphpipe"), os.path.join(root, "unchecked")
        pipe.save(path, optimizer=optimizer)
        times: dict[str, list[float]] = {row: [] for row in ROWS}
        with _unchecked(checkpoint, checksums):
            pipe.save(unchecked, optimizer=optimizer)  # so that every timed save replaces one
        group = pipe._link.conn.pg

        def timed(row: str, body: Callable[[], Any], plain_checks: bool = False) -> None:
            dist.barrier()
            with _unchecked(checkpoint, checksums) if plain_checks else contextlib.nullcontext():
                start = time.perf_counter()
                body()
                times[row].append(time.perf_counter() - start)

        for k in range(rounds):
            plain = os.path.join(root, f"plain{k}")
            saves = [("dcp.save", lambda plain=plain: dcp.save(
                         state, storage_writer=dcp.FileSystemWriter(plain, sync_files=True), process_group=group), False),
                     ("pipe.save", lambda: pipe.save(path, optimizer=optimizer), False),
                     ("pipe.save unchecked", lambda: pipe.save(unchecked, optimizer=optimizer), True)]
            template = _fresh_like(state)
            loads = [("dcp.load", lambda plain=plain, template=template: dcp.load(
                         template, storage_reader=dcp.FileSystemReader(plain), process_group=group), False),
                     ("pipe.load", lambda: pipe.load(path, optimizer=optimizer), False),
                     ("pipe.load unchecked", lambda: pipe.load(unchecked, optimizer=optimizer), True)]
            # Each round another order, so that no row always follows the same one (the disk
            # still flushing the previous row's writes).
            for rows in (saves, loads):
                for row, body, plain_checks in rows[k % 3:] + rows[:k % 3]:
                    timed(row, body, plain_checks)
            start = time.perf_counter()
            checksums.digests(template)
            times["checksum"].append(time.perf_counter() - start)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(plain, ignore_errors=True)
    return {"bytes": size, "times": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default=DEFAULT_SPEC, help="model spec (graphpipe.models.build_model)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    parser.add_argument("--out", default="results/checkpoint_checksum.json")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="gp-ckpt-bench-", dir=args.dir)
    try:
        results = run_ranks(_worker, args.world, args.spec, root, args.rounds, timeout=1800)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for r in results:
        if not r.ok:
            raise SystemExit(f"rank {r.rank} failed: {r.error_type}: {r.message}\n{r.traceback}")
    per_rank = []
    for r in results:
        medians = {row: statistics.median(ts) for row, ts in r.value["times"].items()}
        per_rank.append({"rank": r.rank, "bytes": r.value["bytes"], "median_s": medians,
                         "gb_per_s": {row: r.value["bytes"] / t / 1e9 for row, t in medians.items()}})
    slowest = {row: min(p["gb_per_s"][row] for p in per_rank) for row in ROWS}
    print(f"{args.spec} on {args.world} ranks, {args.rounds} interleaved rounds; "
          f"bytes per rank: {[p['bytes'] for p in per_rank]}")
    print(f"{'row':<20} {'GB/s (slowest rank)':>20} {'vs plain DCP':>14}")
    for row in ROWS:
        base = slowest["dcp.save"] if "save" in row else slowest["dcp.load"]
        ratio = f"{slowest[row] / base:.2f}x" if row != "checksum" else "-"
        print(f"{row:<20} {slowest[row]:>20.3f} {ratio:>14}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"spec": args.spec, "world": args.world, "rounds": args.rounds, "machine": platform.processor()
                   or platform.machine(), "cpus": os.cpu_count(), "per_rank": per_rank, "slowest_gb_per_s": slowest},
                  f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
