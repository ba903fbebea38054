"""The torch.distributed.pipelining baseline of the benchmarks trains like a single process.

A benchmark against a baseline that computes something else would be meaningless: this checks
that the chain split (with skip tensors forwarded) gives the single-process losses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "torch_pipelining.py"


@pytest.mark.parametrize(
    ("spec", "world", "schedule"),
    [("mmt:branches=2,depth=1", 2, "1f1b"), ("dlrm", 3, "1f1b"), ("candle_uno", 2, "fill_drain")],
)
def test_chain_pipeline_matches_single_process(spec: str, world: int, schedule: str, tmp_path) -> None:
    env = dict(os.environ, PYTHONPATH=str(SCRIPT.parents[1]))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), spec, "--world", str(world), "--schedule", schedule],
        capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(losses["pipelined"]), torch.tensor(losses["reference"]))
