"""``graphpipe.testing.run_ranks``, the launcher of the tests, examples and benchmarks:
ranks that run torch.fx code leave nothing behind for the caller's exit to complain about."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


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
