"""Peak memory of saving a checkpoint: ``pipe.save`` (DCP, each rank writes its own stage) against
``pipe.full_state_dict()`` (every rank gathers the whole model), per rank.

    python benchmarks/checkpoint_memory.py     # the MMT bench model (compare.py's) and a 4x wider one, at 4 ranks
    python benchmarks/checkpoint_memory.py --specs "mmt:branches=4,depth=2,seq=32,hidden=128,heads=4,ffn=256,batch=32"

Each measurement runs in fresh processes (4 spawned Gloo ranks; one process for the single-process
read), so that one call's peak cannot hide another's: every rank wraps the model with the
graphpipe partitioner, takes one Adam step (so that there is optimizer state), resets the
kernel's peak-RSS counter (``/proc/self/clear_refs`` ← 5; if the kernel refuses, the peak since
the start counts, from ``VmHWM``), and reads ``VmHWM - VmRSS`` around the call: the memory the
call added at its peak, the result it returns included (the gathered or read state dict is
memory the caller then holds). The modules the calls use are imported before the measurement; a
call is not repeated first, because the allocator would keep the first call's freed memory and
hide the second's. Rows: ``pipe.save`` without and with the optimizer's state,
``full_state_dict()``, and ``graphpipe.runtime.checkpoint.model_state_dict`` (the plain model's
state read back by one process, the memory-bounded way to get it on one rank). Prints a table and
writes results/checkpoint_memory.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import BENCH_SPECS  # noqa: E402

from graphpipe.testing import run_ranks  # noqa: E402

WORLD = 4
MIB = 1024 * 1024
#: compare.py's MMT, and the same 4x wider (16x the parameters), where the per-rank figures
#: are dominated by the state rather than by the interpreter's noise.
WIDER_MMT = "mmt:branches=4,depth=2,seq=32,hidden=512,heads=4,ffn=1024,batch=32"
METHODS = ("save", "save+optimizer", "full_state_dict")


def _status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure(call: Any) -> dict[str, Any]:
    """Runs ``call()``: the bytes it added to this process's resident set at its peak."""
    import torch.distributed.checkpoint  # noqa: F401 - imported outside the measurement

    import graphpipe.runtime.checkpoint  # noqa: F401

    gc.collect()
    reset = _reset_peak()
    before = _status_kib("VmRSS")
    peak_before = _status_kib("VmHWM")
    call()
    peak = _status_kib("VmHWM")
    return {"added_bytes": max(0, peak - (before if reset else peak_before)) * 1024, "peak_reset": reset,
            "rss_before_bytes": before * 1024}


def _rank(rank: int, world: int, spec: str, method: str, folder: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import build_model, default_loss

    torch.manual_seed(0)
    model, inputs = build_model(spec)
    g = torch.Generator().manual_seed(1)
    targets = model.example_targets(inputs[0].shape[0], g)
    with graphpipe.wrap(model, inputs, default_loss(spec), timeout=300) as pipe:
        params = list(pipe.parameters())
        optimizer = torch.optim.Adam(params, lr=1e-3) if params else None
        pipe.step(inputs, targets, optimizer=optimizer)
        del model
        state_bytes = sum(t.numel() * t.element_size() for t in pipe.state_dict().values())
        optim_bytes = 0
        if optimizer is not None:
            optim_bytes = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
                              if isinstance(v, torch.Tensor))
        if method == "full_state_dict":
            holder: list[Any] = []
            figures = measure(lambda: holder.append(pipe.full_state_dict()))
        else:
            opt = optimizer if method == "save+optimizer" else None
            figures = measure(lambda: pipe.save(folder, optimizer=opt))
        return {**figures, "stage": pipe.stage, "state_bytes": state_bytes, "optimizer_bytes": optim_bytes}


def _read_alone(rank: int, world: int, folder: str) -> dict[str, Any]:
    from graphpipe.runtime.checkpoint import model_state_dict

    holder: list[Any] = []
    figures = measure(lambda: holder.append(model_state_dict(folder)))
    return {**figures, "model_bytes": sum(t.numel() * t.element_size() for t in holder[0].values())}


def _ok(results: list[Any]) -> list[dict[str, Any]]:
    for r in results:
        if not r.ok:
            raise RuntimeError(f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}")
    return [r.value for r in results]


def run(spec: str) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    folder = tempfile.mkdtemp(prefix="graphpipe-ckpt-mem-")
    try:
        for method in METHODS:
            rows[method] = _ok(run_ranks(_rank, WORLD, spec, method, folder, timeout=600))
        rows["model_state_dict (1 process)"] = _ok(run_ranks(_read_alone, 1, folder, timeout=600))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=[BENCH_SPECS["mmt"], WIDER_MMT], help="graphpipe.models specs")
    parser.add_argument("--out", default=str(HERE.parent / "results" / "checkpoint_memory.json"))
    args = parser.parse_args()
    report: dict[str, Any] = {"world": WORLD, "torch": torch.__version__, "machine": platform.platform(),
                              "cpus": os.cpu_count(), "models": {}}
    for spec in args.specs:
        rows = run(spec)
        report["models"][spec] = rows
        first = rows["save"]
        model_bytes = rows["model_state_dict (1 process)"][0]["model_bytes"]
        print(f"\n{spec}: model state {model_bytes / MIB:.2f} MiB; per rank: "
              + ", ".join(f"rank {r} stage {v['stage']} {v['state_bytes'] / MIB:.2f} MiB (+ Adam "
                          f"{v['optimizer_bytes'] / MIB:.2f} MiB)" for r, v in enumerate(first)))
        print(f"{'peak RSS added (MiB)':<30}" + "".join(f"{'rank ' + str(r):>10}" for r in range(WORLD)))
        for method, values in rows.items():
            print(f"{method:<30}" + "".join(f"{v['added_bytes'] / MIB:>10.2f}" for v in values))
        if not all(v["peak_reset"] for vs in rows.values() for v in vs):
            print("(the kernel refused to reset the peak: figures are peaks since each process started)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
