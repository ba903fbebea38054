"""``graphpipe.testing.run_ranks``, the launcher of the tests, examples and benchmarks:
ranks that run torch.fx code leave nothing behind for the caller's exit to complain about, and
``bind_cpus=True`` runs every thread of rank r on a CPU of its own (refused for more ranks than
CPUs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from graphpipe.testing import run_ranks


def test_ranks_leave_no_semaphores_behind(tmp_path: Path) -> None:
    # torch.fx's Interpreter opens a tqdm bar in every rank; its default lock is a named
    # semaphore that a rank's os._exit used to leak (one warning per run at the caller's exit).
    script = textwrap.dedent("""
        import torch
        from torch import fx
        from graphpipe.testing import run_ranks

        def interpret(rank, world):
            module = fx.symbolic_trace(torch.nn.Linear(4, 4))
            return float(fx.Interpreter(module).run(torch.ones(1, 4)).sum())

        if __name__ == "__main__":
            results = run_ranks(interpret, 2, timeout=60.0)
            assert all(r.ok for r in results), [r.message for r in results]
            print("ok")
    """)
    path = tmp_path / "ranks.py"  # spawned ranks import the function from a file
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
    assert "leaked semaphore" not in done.stderr, done.stderr


def _affinities(rank: int, world: int) -> dict[str, list[int]]:
    """This rank's CPUs: every thread's (Gloo's started with the process group before this
    runs), and a thread started now."""
    import os
    import threading

    seen: list[list[int]] = []
    late = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
    late.start()
    late.join()
    threads = {tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")}
    return {"threads": sorted({c for t in threads for c in t}), "distinct": len(threads), "late": seen[0]}


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity") or len(__import__("os").sched_getaffinity(0)) < 2,
                    reason="needs Linux's sched_setaffinity and 2 CPUs")
def test_bound_ranks_run_every_thread_on_a_cpu_of_their_own() -> None:
    from graphpipe.local_ranks import rank_cpus

    results = run_ranks(_affinities, 2, timeout=60.0, bind_cpus=True)
    assert all(r.ok for r in results), [r.message for r in results]
    cpus = rank_cpus(2)
    for r in results:
        # Every thread of rank r (the process group's included) and one it starts later: CPU r.
        assert r.value == {"threads": [cpus[r.rank]], "distinct": 1, "late": [cpus[r.rank]]}, r.value
    # Unbound (the default), a rank may run on every CPU the caller may.
    free = run_ranks(_affinities, 2, timeout=60.0)
    assert all(r.ok and len(r.value["threads"]) >= 2 for r in free), [r.value for r in free]


def test_binding_more_ranks_than_cpus_is_refused_before_any_starts() -> None:
    import os

    if not hasattr(os, "sched_getaffinity"):
        with pytest.raises(ValueError, match="sched_setaffinity"):
            run_ranks(_affinities, 2, bind_cpus=True)
        return
    n = len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match=f"{n + 1} ranks but this process may run on {n} CPUs"):
        run_ranks(_affinities, n + 1, timeout=60.0, bind_cpus=True)
