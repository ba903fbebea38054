"""The main job's script, end to end on tiny models: spawned ranks and a torchrun launch both
produce every variant, interleaved over rounds, with first-step losses equal to one process; an
emulated run reports the simulator's predictions beside the emulated times."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

COMPARE = Path(__file__).resolve().parents[2] / "benchmarks" / "compare.py"
ARGS = ["--models", "candle_uno:size=small", "--steps", "3", "--rounds", "2", "--warmup", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_report(path: Path, launch: str) -> None:
    report = json.loads(path.read_text())
    assert report["launch"] == launch
    assert report["rounds"] == [2, 1]  # 3 measured iterations over 2 rounds
    rows = {r["variant"]: r for r in report["rows"]}
    assert {"graphpipe/graph", "graphpipe/sequential", "torch/1f1b", "torch/gpipe"} <= set(rows)
    for name in ("graphpipe/graph", "graphpipe/sequential", "torch/gpipe"):
        row = rows[name]
        assert "error" not in row, row.get("error")
        assert len(row["iteration_seconds"]) == 3
        assert row["loss_matches_reference"] is True
        assert row["samples_per_second"] > 0
        assert len(row["peak_memory_bytes"]) == 2
    # torch's Schedule1F1B refuses fewer micro-batches than stages: the table says so, the
    # other variants still run.
    one_f_one_b = rows["torch/1f1b"]
    if "error" in one_f_one_b:
        assert "microbatches" in one_f_one_b["error"]
        assert one_f_one_b["micro_batches"] < 2
    else:
        assert one_f_one_b["loss_matches_reference"] is True


def test_compare_spawned_ranks(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [sys.executable, str(COMPARE), *ARGS, "--world", "2", "--out", str(out), "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| candle_uno:size=small | 2 | graphpipe/graph |" in result.stdout
    check_report(out, "spawn")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_compare_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(COMPARE), *ARGS, "--out", str(out), "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("### graph vs sequential pipelines") == 1  # rank 0 reports alone
    check_report(out, "torchrun")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_compare_rejects_cuda_without_gpu(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(COMPARE), "--device", "cuda"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "no CUDA device" in result.stderr


def test_compare_emulated_reports_every_prediction(tmp_path: Path) -> None:
    # Emulation: no loss check (stages compute nothing), and for each graphpipe plan the raw and
    # the zero-compute calibrated simulator beside the emulated time, and the plan itself, from
    # which the simulator's figure can be recomputed.
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [sys.executable, str(COMPARE), *ARGS, "--world", "2", "--emulate", "--out", str(out),
         "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "emulated"
    checked = 0
    for row in report["rows"]:
        if not row["variant"].startswith("graphpipe/"):
            continue
        assert row["loss_matches_reference"] is None
        plan = row["plan"]
        assert plan["simulated_iteration_seconds"] > 0 and plan["zero_compute_seconds"] > 0
        assert plan["simulator_error"] == pytest.approx(row["median_seconds"] / plan["simulated_calibrated_seconds"] - 1)
        stages = plan["json"]["stages"]
        assert len(stages) == plan["stages"] and all(s["forward_seconds"] > 0 for s in stages)
        checked += 1
    assert checked == 2
    assert "simulator + zero-compute calibration vs emulated" in result.stdout


def test_table_marks_equal_pipelines_as_a_parity_check(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    def row(variant: str, depth: int, micro_batches: int, simulated: float) -> dict:
        return {"model": "m", "world": 2, "variant": variant, "micro_batches": micro_batches,
                "samples_per_second": 10.0, "spread": [9.0, 11.0], "peak_memory_bytes": [1 << 20] * 2,
                "loss_matches_reference": True, "median_seconds": 0.1,
                "plan": {"depth": depth, "micro_batches": micro_batches, "simulated_iteration_seconds": simulated,
                         "partitioner": "x", "stages": depth, "micro_batch_size": 1}}

    compare.print_table([row("graphpipe/graph", 2, 4, 0.100), row("graphpipe/sequential", 2, 4, 0.101)], "measured")
    assert "m x2: both plans are 2 deep" in capsys.readouterr().out
    for graph in (row("graphpipe/graph", 2, 4, 0.090), row("graphpipe/graph", 1, 4, 0.100),
                  row("graphpipe/graph", 2, 8, 0.100)):
        compare.print_table([graph, row("graphpipe/sequential", 2, 4, 0.100)], "measured")
        assert "parity check" not in capsys.readouterr().out
