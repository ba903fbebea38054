"""The older build a benchmark's ``--against`` times beside the current one: a folder holding a
graphpipe package (``pip install --no-build-isolation --no-deps --target DIR <checkout>``), or a
git ref of this repository, built once into results/against/<commit>. runtime_bench.py and
sim_bench.py import it from their subprocess with PYTHONPATH set to that folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

__all__ = ["old_build"]


def old_build(against: str) -> str:
    """The directory of the old build: ``against`` itself, or the git ref it names built into
    results/against/<commit> (once; later runs reuse it)."""
    if os.path.isdir(against):
        # a folder named graphpipe without __init__.py would be a namespace package, and the
        # installed graphpipe would be imported instead: the new build timed twice
        if not os.path.isfile(os.path.join(against, "graphpipe", "__init__.py")):
            raise SystemExit(f"--against {against}: no graphpipe package there (pip install --target {against} ...)")
        return os.path.abspath(against)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rev = subprocess.run(["git", "rev-parse", "--verify", against + "^{commit}"], cwd=repo, capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"--against {against}: neither a directory nor a git ref of {repo}")
    commit = rev.stdout.strip()
    target = os.path.join(repo, "results", "against", commit)
    if os.path.isdir(os.path.join(target, "graphpipe")):
        return target
    print(f"building {against} ({commit[:10]}) into {target} (a full compile)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "src")
        subprocess.run(["git", "worktree", "add", "--detach", tree, commit], cwd=repo, check=True)
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                            target, tree], check=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=repo, check=False)
    return target
