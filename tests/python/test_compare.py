"""The main job's script, end to end on tiny models: spawned ranks and a torchrun launch both
produce every variant (graphpipe's V on torch's ZB-V cut among them), interleaved over rounds,
with first-step losses equal to one process; an
emulated run, with and without a memory limit, reports the simulator's predictions beside the
emulated times, DDP as "does not fit" where the limit is below its need, and a verdict line per
job; the table, verdict and chart from report rows."""

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
    assert set(rows) == {"graphpipe/graph+dp", "graphpipe/sequential+dp", "torch/1f1b", "torch/1f1b interpreter",
                         "torch/interleaved zb", "torch/zbv", "torch/dualpipev", "graphpipe/V zb", "graphpipe/graph V",
                         "torch/fsdp2", "torch/ddp"}
    assert all(r["emulated"] is False and r["regime"] == "fits (no limit)" for r in report["rows"])
    for name in ("graphpipe/graph+dp", "graphpipe/sequential+dp", "torch/1f1b interpreter", "torch/fsdp2",
                 "torch/ddp"):
        row = rows[name]
        assert "error" not in row, row.get("error")
        assert len(row["iteration_seconds"]) == 3
        assert row["loss_matches_reference"] is True, name
        assert row["samples_per_second"] > 0
        assert len(row["peak_memory_bytes"]) == 2
        assert row["model_memory_bytes"] > 0
    # Real ranks step a real optimizer: every optimizer's price per tensor is measured, and the
    # plans' descriptions carry SGD's, the one the runs step.
    from graphpipe import OPTIMIZERS

    prices = report["calibration"]["2"]["optimizer_tensor_seconds"]
    assert set(prices) == set(OPTIMIZERS) and all(p > 0.0 for p in prices.values()), prices
    described = rows["graphpipe/graph+dp"]["plan"]["devices"]["optimizer_tensor_seconds"]
    assert described == {"sgd": prices["sgd"]}, described
    # torch's zero-bubble family on 2 stages per rank: a reason where its front end cannot take the
    # cut, else a run that trains like one process
    for name in ("torch/interleaved zb", "torch/zbv", "torch/dualpipev"):
        row = rows[name]
        assert row["depth"] == 4, row
        if "unavailable" in row:
            assert row["unavailable"], row
        else:
            assert "error" not in row, row.get("error")
            assert row["loss_matches_reference"] is True, name
    # graphpipe on the same cut, in a V (2 stages per rank): it trains like one process, or says
    # why there is no such cut, as torch's rows do
    v = rows["graphpipe/V zb"]
    if "unavailable" in v:
        assert v["unavailable"] and v["unavailable"] == rows["torch/zbv"].get("unavailable"), v
    else:
        assert "error" not in v, v.get("error")
        assert v["loss_matches_reference"] is True and len(v["iteration_seconds"]) == 3, v
    # the planner's own V (its graph cut folded in a V): a plan two stages per rank that trains
    # like one process, or the reason none simulates faster
    graph_v = rows["graphpipe/graph V"]
    if "unavailable" in graph_v:
        assert graph_v["unavailable"].startswith("not run: no plan folded in a V simulates faster"), graph_v
    else:
        assert "error" not in graph_v, graph_v.get("error")
        assert graph_v["loss_matches_reference"] is True and "in a V" in graph_v["plan"]["partitioner"], graph_v
        assert graph_v["plan"]["stages"] > 2 and graph_v["plan"]["schedule"] == "zb_graph", graph_v["plan"]
    assert rows["torch/1f1b interpreter"]["micro_batches"] >= rows["torch/1f1b interpreter"]["depth"]  # 1F1B needs it
    # every graphpipe row that ran is priced again on the profiles taken beside the runs, one a round
    for name, row in rows.items():
        if name.startswith("graphpipe/") and "iteration_seconds" in row:
            beside = row["plan"]["beside"]
            assert beside.get("profiles") == 2 and beside["simulated_iteration_seconds"] > 0, (name, beside)
            assert beside["simulator_error"] == pytest.approx(
                row["median_seconds"] / beside["simulated_iteration_seconds"] - 1.0), (name, beside)
    # torch's front end: CANDLE-Uno split into stages takes its branch inputs at stage 0 only
    # (the reason, not a number); on one stage it runs and trains like one process
    front_end = rows["torch/1f1b"]
    if "unavailable" in front_end:
        assert "cannot feed model inputs to later stages" in front_end["unavailable"]
    else:
        assert "error" not in front_end, front_end["error"]
        assert front_end["loss_matches_reference"] is True
    assert len(report["verdict"]) == 1 and "fastest that fits" in report["verdict"][0]


def test_compare_spawned_ranks(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    result = subprocess.run(
        [sys.executable, str(COMPARE), *MEASURED, "--world", "2", "--out", str(out), "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| candle_uno:size=small | 2 | fits (no limit) | graphpipe/graph+dp | measured |" in result.stdout
    assert "**verdict, candle_uno:size=small x2, fits (no limit)**" in result.stdout
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
    assert result.stdout.count("### graph pipelines vs") == 1  # rank 0 reports alone
    check_report(out, "torchrun")


def test_an_iteration_is_the_working_ranks_mean_interval_after_the_warm_up() -> None:
    # Iterations run back to back (no barrier between them): each rank reports the time
    # between its returns, and iteration i is the mean over the ranks that take part; a rank
    # outside a shorter chain (idle) returns at once and is left out.
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    from graphpipe.testing import RankResult

    class Recorded:
        torchrun = False

        def run(self, world, variant, spec, steps, emulate):
            assert steps == 1 + 2  # warm-up + this round's measured iterations
            working = [[0.5, 0.010, 0.030], [0.4, 0.014, 0.026], [0.6, 0.012, 0.028]]
            idle = {"losses": [float("nan")] * 3, "seconds": [0.5, 1e-6, 1e-6], "peak_memory": 0, "idle": True}
            return [RankResult(r, True, {"losses": [1.0] * 3, "seconds": s, "peak_memory": 7, "idle": False})
                    for r, s in enumerate(working)] + [RankResult(3, True, idle)]

    pooled: dict = {}
    compare.run_variant("spec", 4, None, Recorded(), [2], 1, 1.0, 0, pooled)
    assert pooled["iteration_seconds"] == pytest.approx([0.012, 0.028], rel=1e-12)
    assert pooled["median_seconds"] == pytest.approx(0.020, rel=1e-12)


CALIBRATE_ONE_RANK = """
import json, sys
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import compare
from graphpipe.calibration import link

if __name__ == "__main__":  # the link's spawned ranks import this file again
    dist.init_process_group("gloo")
    try:
        link(in_group=True)
        refused = None
    except ValueError as e:
        refused = str(e)
    figures = compare.calibrate([1], compare.Launch(torchrun=True, device="cpu", timeout=120.0))[1]
    print(json.dumps({"refused": refused, **figures}))
"""


def test_calibration_under_a_one_process_torchrun(tmp_path: Path) -> None:
    # One torchrun process has no pair of its own ranks to time a link between: the link is
    # timed on two spawned ranks (as a spawned launch does), and asking the group for it is a
    # clear error, not a median of nothing.
    script = tmp_path / "calibrate_one.py"
    script.write_text(CALIBRATE_ONE_RANK)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
         str(script), str(COMPARE.parent)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert "needs two ranks or more in the process group" in figures["refused"]
    assert "this group has 1" in figures["refused"]
    assert 0 < figures["link_latency_seconds"] < 0.1
    assert figures["link_bandwidth_bytes_per_second"] > 1e6
    assert figures["instruction_overhead_seconds"] >= 0
    assert figures["extra_tensor_seconds"] is None  # one rank: no transfer to time it on


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_compare_rejects_cuda_without_gpu(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(COMPARE), "--device", "cuda"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "no CUDA device" in result.stderr


def test_compare_emulated_reports_every_prediction(tmp_path: Path) -> None:
    # Emulation: no loss check (stages compute nothing), and for each graphpipe plan the
    # simulator (with the measured runtime costs in the device description) beside the emulated
    # time, and the plan itself, from which the simulator's figure can be recomputed. Memory-bound only (the measured runs cover
    # the no-limit job; the default runs both, checked below).
    out = tmp_path / "compare.json"
    result = subprocess.run(
        # one round (the later --rounds wins): interleaving is checked by the measured runs
        [sys.executable, str(COMPARE), *ARGS, "--rounds", "1", "--world", "2", "--emulate", "--memory-limit", "auto",
         "--out", str(out), "--png", str(tmp_path / "c.png")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "emulated, devices 4x slower than this core"  # the default slowdown
    assert "| candle_uno:size=small | 2 | memory-bound, " in result.stdout
    assert "- emulated rows:" in result.stdout
    bound = {r["variant"]: r for r in report["rows"]}
    assert len(bound) == 11 and all(r["memory_limit_bytes"] is not None for r in bound.values())
    limit = bound["torch/ddp"]["memory_limit_bytes"]
    # memory-bound: DDP needs more than the limit and is not run; FSDP2 fits and runs
    assert bound["torch/ddp"]["model_memory_bytes"] > limit >= bound["torch/fsdp2"]["model_memory_bytes"]
    assert bound["torch/ddp"]["unavailable"].startswith("does not fit: needs")
    assert "optimizer state alone" in bound["torch/ddp"]["unavailable"]  # no replica fits, whatever its micro-batches
    assert "samples_per_second" not in bound["torch/ddp"]
    for name in ("torch/1f1b interpreter", "torch/fsdp2"):
        assert "error" not in bound[name], bound[name].get("error")
        assert bound[name]["emulated"] is True and bound[name]["samples_per_second"] > 0
    assert bound["torch/fsdp2"]["emulation"]["segments"] > 1
    for name in ("graphpipe/graph+dp", "graphpipe/sequential+dp"):
        row = bound[name]
        assert row["loss_matches_reference"] is None
        plan = row["plan"]
        assert plan["simulated_iteration_seconds"] > 0
        assert plan["simulator_error"] == pytest.approx(row["median_seconds"] / plan["simulated_iteration_seconds"] - 1)
        stages = plan["json"]["stages"]
        assert len(stages) == plan["stages"] and all(s["forward_seconds"] > 0 for s in stages)
        # a rank's memory is the sum of its stages' (a fold puts two on a rank)
        per_rank: dict[int, float] = {}
        for stage in stages:
            for device in stage["devices"]:
                per_rank[device] = per_rank.get(device, 0.0) + stage["memory_bytes"]
        assert max(per_rank.values()) == pytest.approx(row["model_memory_bytes"]) and row["model_memory_bytes"] <= limit
    assert "simulator vs emulated: within 10% in" in result.stdout
    assert "| candle_uno:size=small | 2 | memory-bound, " in result.stdout.split("the simulator (with the measured")[1]
    calibration = report["calibration"]["2"]
    assert calibration["instruction_overhead_seconds"] > 0 and calibration["step_overhead_seconds"] > 0
    assert calibration["bucket_all_reduce_seconds"] > 0
    # Planner and simulator price collectives from the link fitted to real all-reduces: the
    # bucket line's price is the ring formula on it (2 (n - 1) steps of 1 MiB / n), not the links'.
    assert calibration["collective_bandwidth_bytes_per_second"] > 0
    bucket = bound["graphpipe/graph+dp"]["bucket_all_reduce"]
    assert bucket["priced_seconds"] == pytest.approx(
        2 * (calibration["collective_latency_seconds"] + (1 << 20) / 2 / calibration["collective_bandwidth_bytes_per_second"]))
    assert bucket["priced_from_links_seconds"] > 0
    assert "from the point-to-point links alone at" in result.stdout
    assert "the planner's pick (graphpipe/graph+dp) is" in report["verdict"][0]
    assert len(report["verdict"]) == 1 and "does not fit: torch/ddp" in report["verdict"][0]
    assert (tmp_path / "c.png").stat().st_size > 0
    # A transfer's extra tensors are priced by the figure measured between the ranks, and the
    # description stored with each plan reprices it from the report alone (resimulate.py).
    assert calibration["extra_tensor_seconds"] is not None and calibration["extra_tensor_seconds"] >= 0
    assert bound["graphpipe/graph+dp"]["plan"]["devices"]["extra_tensor_seconds"] == calibration["extra_tensor_seconds"]
    resimulated = tmp_path / "resimulate.json"
    result = subprocess.run([sys.executable, str(COMPARE.parent / "resimulate.py"), str(out), "--out", str(resimulated)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "- measured per-tensor cost: within 10% in" in result.stdout
    again = {r["variant"]: r for r in json.loads(resimulated.read_text())["rows"]}
    ran = {name for name, row in bound.items() if name.startswith("graphpipe/") and "plan" in row}
    assert set(again) == ran and {"graphpipe/graph+dp", "graphpipe/sequential+dp"} <= ran
    for name, row in again.items():
        assert row["description"] == "stored"
        assert row["simulated_seconds"]["measured"] == pytest.approx(bound[name]["plan"]["simulated_iteration_seconds"],
                                                                     rel=1e-9)
        # Whichever of a latency and the measured figure is dearer prices the plan no lower.
        dearer, cheaper = (("latency", "measured")
                           if calibration["link_latency_seconds"] >= calibration["extra_tensor_seconds"]
                           else ("measured", "latency"))
        assert row["simulated_seconds"][dearer] >= row["simulated_seconds"][cheaper] * (1 - 1e-12)
    # The runtime terms measured this run travel with each plan's description, and each one the
    # terms report turns off prices the plan no dearer (sim_terms_bench.py), all of them off the
    # cheapest; on two ranks the wait for the slower one is charged wherever it was measured.
    stored = bound["graphpipe/graph+dp"]["plan"]["devices"]
    for term in ("collective_overlap_loss", "rank_skew_fraction"):
        assert stored.get(term, 0.0) == calibration[term], term
    # Emulated runs step no real optimizer, so no optimizer's price is measured or described.
    assert calibration["optimizer_tensor_seconds"] == {}
    assert stored.get("optimizer_tensor_seconds", {}) == {}
    terms_out = tmp_path / "sim_terms.json"
    result = subprocess.run([sys.executable, str(COMPARE.parent / "sim_terms_bench.py"), str(out), "--out",
                             str(terms_out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    terms = {r["variant"]: r for r in json.loads(terms_out.read_text())["rows"]}
    assert set(terms) == ran
    for name, row in terms.items():
        seconds = row["simulated_seconds"]
        assert seconds["stored"] == pytest.approx(bound[name]["plan"]["simulated_iteration_seconds"], rel=1e-9)
        assert all(seconds["none"] <= v * (1 + 1e-12) <= seconds["stored"] * (1 + 1e-9)
                   for k, v in seconds.items() if k.startswith("no ")), seconds
        if calibration["rank_skew_fraction"] > 0.0:
            assert seconds["no rank_skew_fraction"] < seconds["stored"], seconds


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
    assert "m x2, -: both plans are 2 deep" in capsys.readouterr().out
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

    reason = "does not fit: needs 40 MiB/rank > 30 MiB"
    unavailable = {"model": "m", "world": 4, "variant": "torch/ddp", "micro_batches": 1, "depth": 1,
                   "emulated": True, "unavailable": reason, "model_memory_bytes": 40 * 2**20}
    compare.print_table([_row("graphpipe/graph", 3, 4, 0.1, model_memory_bytes=25 * 2**20),
                         _row("graphpipe/sequential", 4, 4, 0.12), unavailable],
                        "emulated, devices 4x slower than this core")
    out = capsys.readouterr().out
    assert "| m | 4 | - | graphpipe/graph | emulated | 3 | 4 | 10.0 (9.0-11.0) |" in out
    assert "| 25 | 1 |" in out  # the cost model's MiB, the measured peak
    assert "| m | 4 | - | graphpipe/sequential | emulated | 4 | 4 |" in out
    line = next(x for x in out.splitlines() if "| torch/ddp |" in x)
    assert reason in line and "x |" not in line and "10.0" not in line and "| 40 |" in line  # no ratio, no number
    assert "m x4, -: the graph plan is shallower than the sequential one (depth 3 against 4)" in out
    assert "emulated rows:" in out and "(devices 4x slower than this core)" in out


def test_a_refused_plan_is_a_reason_not_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    import graphpipe

    def refusing(graph, devices, partitioner, **kwargs):
        raise ValueError("no room")

    monkeypatch.setattr(graphpipe, "plan", refusing)
    plan, reason = compare._plan_or_reason("g", "d", "graphpipe", replicate=True)
    assert plan is None and reason == "no plan: ValueError: no room"


def test_torch_interpreter_runs_the_pinned_cut_without_empty_stages() -> None:
    """DLRM's sequential plan on 8 devices: torch's pipelining needs the integer indices'
    consumers (the embedding bags) on the indices' stage, which empties the stage that held only
    bags. The interpreter rows run the pinned cut on its non-empty stages, numbered 0..k-1, with
    that cut's stage times; the front-end row keeps the sequential plan's cut."""
    sys.path.insert(0, str(COMPARE.parent))
    import compare
    from baselines.torch_pipelining import chain_stage_modules

    import graphpipe
    from graphpipe.models import build_model
    from graphpipe.trace import trace_module

    model, inputs = build_model("dlrm:size=small,batch=16")
    graph = graphpipe.trace(model, inputs)
    devices = graphpipe.devices(8, "cpu")
    variants = {v.name: v for v in compare.torch_pipeline_variants(graph, devices, None, True, model, inputs)}
    front, inner = variants["torch/1f1b"].run, variants["torch/1f1b interpreter"].run
    assert inner.num_stages < front.num_stages, inner.labels
    assert sorted(set(inner.labels.values())) == list(range(inner.num_stages))
    assert len(inner.stage_seconds) == inner.num_stages and len(inner.optimizer_seconds) == inner.num_stages
    assert variants["torch/gpipe interpreter"].run.labels == inner.labels
    # every embedding bag sits on stage 0 with the indices, and the interpreter cuts it
    bags = [n for n in inner.labels if n.startswith("sparse_")]  # the EmbeddingBag calls
    assert bags and all(inner.labels[n] == 0 for n in bags), inner.labels
    assert any(front.labels[n] > 0 for n in bags), front.labels
    traced = trace_module(model, inputs)
    assert len(chain_stage_modules(traced.module, inner.labels, inner.num_stages)) == inner.num_stages
    # the stage that gained the bags is priced with them
    assert inner.stage_seconds[0][0] > front.stage_seconds[0][0]


def test_verdict_and_chart_per_model_and_memory_limit(tmp_path: Path) -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    def row(variant: str, samples: float | None, regime: str, **extra: object) -> dict:
        out = {"model": "mmt", "world": 4, "variant": variant, "regime": regime, "micro_batches": 1, "depth": 1,
               "emulated": True, **extra}
        if samples is not None:
            out["samples_per_second"] = samples
        return out

    fits, bound = "fits (no limit)", "memory-bound, 30 MiB/rank"
    rows = [row("graphpipe/graph+dp", 140.0, fits), row("graphpipe/sequential+dp", 138.0, fits),
            row("torch/ddp", 141.0, fits), row("torch/fsdp2", 120.0, fits),
            row("graphpipe/graph+dp", 100.0, bound), row("graphpipe/sequential+dp", 80.0, bound),
            row("torch/fsdp2", 125.0, bound), row("torch/1f1b", 70.0, bound),
            row("torch/ddp", None, bound, unavailable="does not fit: needs 40 MiB/rank > 30 MiB")]
    lines = compare.verdict(rows)
    assert lines == [
        "**verdict, mmt x4, fits (no limit)**: fastest that fits: torch/ddp (141.0 samples/s); graphpipe/graph+dp "
        "0.99x the best non-graphpipe variant (torch/ddp); the planner's pick (graphpipe/graph+dp) is within 5% of "
        "the fastest (0.7% slower)",
        "**verdict, mmt x4, memory-bound, 30 MiB/rank**: fastest that fits: torch/fsdp2 (125.0 samples/s); "
        "graphpipe/graph+dp 0.80x the best non-graphpipe variant (torch/fsdp2); the planner's pick "
        "(graphpipe/graph+dp) is NOT within 5% of the fastest (25.0% slower); does not fit: torch/ddp"]
    png = tmp_path / "c.png"
    compare.write_png(rows, png, "emulated")
    assert png.stat().st_size > 10_000


def test_defaults_are_the_emulated_main_job_and_no_emulate_the_measured_one() -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import argparse

    import compare

    def resolved(**given: object) -> argparse.Namespace:
        args = argparse.Namespace(**{"emulate": None, "models": None, "world": None, "slowdown": None,
                                     "rounds": None, "memory_limit": None, "device": "cpu", **given})
        compare.resolve_defaults(args, argparse.ArgumentParser())
        return args

    main_job = resolved()
    assert main_job.emulate is True and main_job.world == [4] and main_job.slowdown == 4.0
    assert main_job.models == ["mmt"] and main_job.rounds == 2
    assert main_job.memory_limit == ["none", "auto"]  # both regimes
    measured = resolved(emulate=False)
    assert measured.world == [2] and measured.slowdown == 1.0 and measured.models == list(compare.BENCH_SPECS)
    assert measured.rounds == 6 and measured.memory_limit == ["none"]
    assert resolved(rounds=5).rounds == 5
    assert resolved(device="cuda").emulate is False


def test_simulator_table_and_whether_the_planners_pick_is_within_5_percent(capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(COMPARE.parent))
    import compare

    pick = _row("graphpipe/graph+dp", 1, 1, 0.105)
    faster = _row("graphpipe/sequential+dp", 2, 4, 0.080, samples_per_second=10.6, median_seconds=0.094)
    compare.print_table([pick, faster], "emulated")
    out = capsys.readouterr().out
    assert "| m | 4 | - | graphpipe/graph+dp | x, 1 stages, replicas -, depth 1, 1 x 1, 1f1b | 100.0 | 105.0 | +5.0% |" in out
    assert "| graphpipe/sequential+dp | x, 2 stages, replicas -, depth 2, 4 x 1, 1f1b | 94.0 | 80.0 | -14.9% |" in out
    assert "simulator vs emulated: within 10% in 1 of 2 runs, within 20% in 2, worst -14.9%" in out
    assert "the planner's pick (graphpipe/graph+dp) is NOT within 5% of the fastest (6.0% slower)" in out
    close = _row("graphpipe/sequential+dp", 2, 4, 0.080, samples_per_second=10.4)
    assert "the planner's pick (graphpipe/graph+dp) is within 5% of the fastest (4.0% slower)" in \
        compare.verdict([pick, close])[0]


def test_the_beside_profiles_are_taken_at_every_shard_the_plans_run() -> None:
    sys.path.insert(0, str(COMPARE.parent))
    from profiles_beside import shard_sizes

    # (micro-batch size, replica counts per stage): a replica's largest shard of a micro-batch
    assert shard_sizes([(16, [1, 1]), (32, [2]), (8, [1, 3])]) == [3, 8, 16]
