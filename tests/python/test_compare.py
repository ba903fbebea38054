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
MEASURED = [*ARGS, "--no-emulate"]  # the default is emulated (the main job)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_report(path: Path, launch: str) -> None:
    report = json.loads(path.read_text())
    assert report["launch"] == launch
    assert report["rounds"] == [2, 1]  # 3 measured iterations over 2 rounds
    rows = {r["variant"]: r for r in report["rows"]}
    assert {"graphpipe/graph", "graphpipe/sequential", "torch/1f1b", "torch/gpipe", "torch/ddp"} <= set(rows)
    assert all(r["emulated"] is False for r in report["rows"])
    for name in ("graphpipe/graph", "graphpipe/sequential", "torch/gpipe", "torch/ddp"):
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
        [sys.executable, str(COMPARE), *MEASURED, "--world", "2", "--out", str(out), "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| candle_uno:size=small | 2 | graphpipe/graph | measured |" in result.stdout
    check_report(out, "spawn")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_compare_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(COMPARE), *MEASURED, "--out", str(out), "--png", str(tmp_path / "c.png")],
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
        # one round (the later --rounds wins): interleaving is checked by the measured runs
        [sys.executable, str(COMPARE), *ARGS, "--rounds", "1", "--world", "2", "--emulate", "--out", str(out),
         "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "emulated, devices 4x slower than this core"  # the default slowdown
    assert "| candle_uno:size=small | 2 | graphpipe/graph | emulated |" in result.stdout
    assert "- emulated rows:" in result.stdout
    rows = {r["variant"]: r for r in report["rows"]}
    # every baseline runs emulated too (torch's 1F1B may refuse 1 micro-batch on 2 stages)
    for name in ("torch/gpipe", "torch/ddp"):
        assert "error" not in rows[name], rows[name].get("error")
        assert rows[name]["emulated"] is True and rows[name]["samples_per_second"] > 0
    ddp = rows["torch/ddp"]["ddp_emulation"]
    assert ddp["segments"] > 1 and ddp["forward_seconds"] > 0 and ddp["backward_seconds"] > 0
    checked = set()
    for row in report["rows"]:
        if not row["variant"].startswith("graphpipe/") or "unavailable" in row:
            continue
        assert row["loss_matches_reference"] is None
        plan = row["plan"]
        assert plan["simulated_iteration_seconds"] > 0 and plan["zero_compute_seconds"] > 0
        assert plan["simulator_error"] == pytest.approx(row["median_seconds"] / plan["simulated_calibrated_seconds"] - 1)
        stages = plan["json"]["stages"]
        assert len(stages) == plan["stages"] and all(s["forward_seconds"] > 0 for s in stages)
        checked.add(row["variant"])
    assert checked == {"graphpipe/graph", "graphpipe/graph zb", "graphpipe/sequential", "graphpipe/graph+dp",
                       "graphpipe/sequential+dp"}
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


def _row(variant: str, depth: int, micro_batches: int, simulated: float, **extra: object) -> dict:
    return {"model": "m", "world": 4, "variant": variant, "micro_batches": micro_batches, "depth": depth,
            "emulated": True, "samples_per_second": 10.0, "spread": [9.0, 11.0], "peak_memory_bytes": [1 << 20] * 4,
            "loss_matches_reference": None, "median_seconds": 0.1,
            "plan": {"depth": depth, "micro_batches": micro_batches, "simulated_iteration_seconds": simulated,
                     "partitioner": "x", "stages": depth, "micro_batch_size": 1}, **extra}


def test_table_prints_mode_depth_and_unavailable_variants_without_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    reason = "not available in this build: graphpipe.plan has no replicate parameter"
    unavailable = {"model": "m", "world": 4, "variant": "graphpipe/graph+dp", "micro_batches": 1, "depth": None,
                   "emulated": True, "unavailable": reason}
    compare.print_table([_row("graphpipe/graph", 3, 4, 0.1), _row("graphpipe/sequential", 4, 4, 0.12),
                         unavailable], "emulated, devices 4x slower than this core")
    out = capsys.readouterr().out
    assert "| m | 4 | graphpipe/graph | emulated | 3 | 4 | 10.0 (9.0-11.0) |" in out
    assert "| m | 4 | graphpipe/sequential | emulated | 4 | 4 |" in out
    line = next(x for x in out.splitlines() if "graphpipe/graph+dp" in x)
    assert reason in line and "x |" not in line and "10.0" not in line  # no ratio, no number
    assert "m x4: the graph plan is shallower than the sequential one (depth 3 against 4)" in out
    assert "emulated rows:" in out and "(devices 4x slower than this core)" in out


def test_replicated_variants_run_only_when_plan_takes_replicate(monkeypatch: pytest.MonkeyPatch) -> None:
    import inspect

    sys.path.insert(0, str(COMPARE.parent))
    import compare

    import graphpipe

    if "replicate" not in inspect.signature(graphpipe.plan).parameters:  # this build: reported, not faked
        plan, reason = compare.replicated_plan(None, None, "graphpipe", None)
        assert plan is None and reason.startswith("not available in this build")
    calls: list[dict] = []

    def plan_with_replicate(graph, devices, partitioner, *, memory_limit=None, replicate=False):  # noqa: ANN001, ANN202
        calls.append({"partitioner": partitioner, "replicate": replicate})
        return "a plan"

    monkeypatch.setattr(graphpipe, "plan", plan_with_replicate)
    assert compare.replicated_plan("g", "d", "sequential", None) == ("a plan", "")
    assert calls == [{"partitioner": "sequential", "replicate": True}]

    def refusing(graph, devices, partitioner, *, memory_limit=None, replicate=False):  # noqa: ANN001, ANN202
        raise ValueError("no room")

    monkeypatch.setattr(graphpipe, "plan", refusing)
    plan, reason = compare.replicated_plan("g", "d", "graphpipe", None)
    assert plan is None and "replicate=True failed: ValueError: no room" in reason


def test_defaults_are_the_emulated_main_job_and_no_emulate_the_measured_one() -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import argparse

    import compare

    def resolved(**given: object) -> argparse.Namespace:
        args = argparse.Namespace(**{"emulate": None, "models": None, "world": None, "slowdown": None,
                                     "rounds": None, "device": "cpu", **given})
        compare.resolve_defaults(args, argparse.ArgumentParser())
        return args

    main_job = resolved()
    assert main_job.emulate is True and main_job.world == [4] and main_job.slowdown == 4.0
    assert main_job.models == ["mmt"] and main_job.rounds == 2
    measured = resolved(emulate=False)
    assert measured.world == [2] and measured.slowdown == 1.0 and measured.models == list(compare.BENCH_SPECS)
    assert measured.rounds == 3
    assert resolved(rounds=5).rounds == 5
    assert resolved(device="cuda").emulate is False
