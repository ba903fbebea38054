"""The usual launch: `torchrun` on examples/train_torchrun.py trains like one process."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from graphpipe.models import default_loss
from graphpipe.testing import reference_training, seeded_batches

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_torchrun.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("spec", ["candle_uno", "mmt:branches=2,depth=1"])
def test_torchrun_two_ranks_matches_single_process(spec: str, tmp_path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(EXAMPLE), "--model", spec, "--steps", "3", "--checkpoint", str(tmp_path / "ckpt")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"step \d+: loss ([0-9.eE+-]+)", result.stdout)]
    model, _, batches = seeded_batches(spec, 3)
    expected = reference_training(model, batches, default_loss(spec), lr=0.01)
    assert losses == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["rank0.pt", "rank1.pt"]
