"""Elastic restart under torchrun: examples/train_torchrun.py checkpoints every 2 steps; rank 1 of 3
is SIGKILLed before step 3 of 6 on the first attempt; ``torchrun --rdzv-backend c10d
--max-restarts 1`` restarts every rank, which resume from the latest checkpoint (step 2) and
finish. The final parameters equal an uninterrupted run's exactly. The restart's wall time (from
the kill to the resumed attempt's checkpoint loaded) and both runs' wall times are printed
(``pytest -s`` shows them).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from test_example_torchrun import EXAMPLE, free_port

SPEC = "mmt:branches=2,depth=1"
STEPS, EVERY, KILL_RANK, KILL_AT = 6, 2, 1, 3


def _torchrun(tmp: Path, name: str, kill: bool) -> tuple[subprocess.CompletedProcess, float]:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    command = [
        torchrun, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "1",
        "--monitor-interval", "0.2", "--nproc-per-node", "3",
        str(EXAMPLE), "--model", SPEC, "--steps", str(STEPS), "--momentum", "0.9", "--partitioner", "sequential",
        "--checkpoint-dir", str(tmp / name), "--checkpoint-every", str(EVERY), "--final-state", str(tmp / f"{name}.pt"),
    ]
    if kill:
        command += ["--kill-rank", str(KILL_RANK), "--kill-at-step", str(KILL_AT)]
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp)
    return result, time.monotonic() - start


def test_killed_rank_restarts_and_finishes_like_an_uninterrupted_run(tmp_path: Any) -> None:
    straight, straight_s = _torchrun(tmp_path, "straight", kill=False)
    assert straight.returncode == 0, straight.stderr[-4000:]
    restarted, restarted_s = _torchrun(tmp_path, "restarted", kill=True)
    assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-4000:]
    out = restarted.stdout
    killed = re.search(r"killing itself before step (\d+) \(t=([0-9.]+)\)", out)
    resumed = re.search(r"attempt 1: resumed from \S+ at step (\d+) \(t=([0-9.]+)\)", out)
    assert killed and int(killed.group(1)) == KILL_AT, out[-3000:]
    assert resumed and int(resumed.group(1)) == 2, out[-3000:]  # the last checkpoint before the kill
    # The resumed attempt runs the steps from the checkpoint on. (Before the kill, rank 0 may
    # or may not have printed step 2: the pipeline's last rank can finish a step first.)
    before, after = out[:resumed.start()], out[resumed.start():]
    first = [int(s) for s in re.findall(r"^step (\d+):", before, re.M)]
    assert first in ([0, 1], [0, 1, 2]), first
    assert [int(s) for s in re.findall(r"^step (\d+):", after, re.M)] == list(range(2, STEPS))
    # ... with the uninterrupted run's losses, step for step.
    losses = {int(k): v for k, v in re.findall(r"^step (\d+): loss (\S+)", straight.stdout, re.M)}
    resumed_losses = {int(k): v for k, v in re.findall(r"^step (\d+): loss (\S+)", after, re.M)}
    assert resumed_losses == {k: losses[k] for k in range(2, STEPS)}, (resumed_losses, losses)
    restart_s = float(resumed.group(2)) - float(killed.group(2))
    print(f"\nelastic restart: kill -> resumed from checkpoint {restart_s:.2f} s; whole run {restarted_s:.1f} s "
          f"(uninterrupted {straight_s:.1f} s)")

    a = torch.load(tmp_path / "straight.pt", weights_only=True)
    b = torch.load(tmp_path / "restarted.pt", weights_only=True)
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert (tmp_path / "restarted" / "latest").read_text() == f"step_{STEPS}"
