"""graphpipe.viz: Gantt PNG, stage DAG drawing and Chrome trace of a simulation."""

from __future__ import annotations

import json

import pytest

from graphpipe import viz

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _task(name, kind, rank, start, end, stage=0, mb=0, edge=-1, peer=-1):
    return {"name": name, "kind": kind, "rank": rank, "peer": peer, "stage": stage,
            "micro_batch": mb, "edge": edge, "start": start, "end": end}


@pytest.fixture
def two_stage_result():
    """Hand-made result of 2 stages x 1 micro-batch with 0.5 s links (f = 1, b = 2)."""
    tasks = [
        _task("F0 s0", "forward", 0, 0.0, 1.0),
        _task("A0 e0", "activation", 0, 1.0, 1.5, edge=0, peer=1),
        _task("F0 s1", "forward", 1, 1.5, 2.5, stage=1),
        _task("B0 s1", "backward", 1, 2.5, 4.5, stage=1),
        _task("G0 e0", "gradient", 1, 4.5, 5.0, stage=1, edge=0, peer=0),
        _task("B0 s0", "backward", 0, 5.0, 7.0),
        _task("OPT s0", "optimizer", 0, 7.0, 7.0, mb=-1),
    ]
    return {"overlap": True, "iteration_seconds": 7.0, "samples": 1, "samples_per_second": 1 / 7,
            "tasks": tasks, "ranks": [], "stages": [], "critical_path": list(range(6))}


def test_gantt_png_is_written(tmp_path, two_stage_result):
    path = viz.gantt_png(two_stage_result, tmp_path / "gantt.png", title="two stages")
    data = open(path, "rb").read()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000


def test_gantt_accepts_a_task_list_without_transfers(tmp_path, two_stage_result):
    path = viz.gantt_png(two_stage_result["tasks"], tmp_path / "g.png", transfers=False)
    assert open(path, "rb").read().startswith(PNG_MAGIC)


def test_unknown_task_kind_is_refused(two_stage_result):
    tasks = two_stage_result["tasks"] + [_task("X", "teleport", 0, 0.0, 1.0)]
    with pytest.raises(ValueError, match="teleport"):
        viz.tasks_of(tasks)


def test_stage_dag_png_from_a_plan_dict(tmp_path):
    plan = {"stages": [{"devices": [0]}, {"devices": [1]}, {"devices": [2]}, {"devices": [3]}],
            "edges": [{"src": 0, "dst": 1}, {"src": 0, "dst": 2}, {"src": 1, "dst": 3},
                      {"src": 2, "dst": 3}]}
    path = viz.stage_dag_png(plan, tmp_path / "dag.png", title="fork-join")
    assert open(path, "rb").read().startswith(PNG_MAGIC)


def test_chrome_trace_has_one_complete_event_per_task(tmp_path, two_stage_result):
    trace = viz.chrome_trace(two_stage_result)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(two_stage_result["tasks"])
    forward = complete[2]
    assert forward["name"] == "F0 s1" and forward["pid"] == 1 and forward["tid"] == 0
    assert forward["ts"] == pytest.approx(1.5e6) and forward["dur"] == pytest.approx(1e6)
    assert forward["args"] == {"stage": 1, "micro_batch": 0, "kind": "forward", "edge": -1, "peer": -1}
    transfer = complete[1]
    assert transfer["tid"] == 1 and transfer["args"]["peer"] == 1 and transfer["cat"] == "activation"
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    assert trace["otherData"]["iteration_seconds"] == 7.0

    path = viz.write_chrome_trace(two_stage_result, tmp_path / "trace.json")
    json.load(open(path))  # valid JSON
    back = viz.read_chrome_trace(path)
    assert len(back) == len(two_stage_result["tasks"])
    for a, b in zip(back, two_stage_result["tasks"]):
        assert a["name"] == b["name"] and a["kind"] == b["kind"] and a["rank"] == b["rank"]
        assert a["start"] == pytest.approx(b["start"]) and a["end"] == pytest.approx(b["end"])


def test_with_the_core_simulator(tmp_path):
    """End to end through graphpipe._C: a hand-made plan, scheduled and simulated by the core."""
    from graphpipe._ext import _C as C

    plan = C.Plan()
    stages = []
    for s in range(3):
        st = C.Stage()
        st.id, st.devices, st.forward_seconds, st.backward_seconds = s, [s], 1.0, 2.0
        stages.append(st)
    edges = []
    for a, b in ((0, 2), (1, 2)):
        e = C.StageEdge()
        e.src, e.dst, e.bytes = a, b, 0.0
        edges.append(e)
    plan.stages, plan.edges = stages, edges
    plan.num_micro_batches, plan.micro_batch_size, plan.batch_size, plan.num_devices = 8, 1, 8, 3
    devices = C.Devices()
    devices.count = 3
    devices.link_bandwidth = [[1e9] * 3 for _ in range(3)]
    devices.link_latency = [[0.0] * 3 for _ in range(3)]
    schedule = C.Schedule.generate(plan, "1f1b")
    assert schedule.check().ok
    result = C.simulate(plan, schedule, devices, overlap=True)
    assert result.iteration_seconds == pytest.approx(27.0)  # (M + 1)(f + b), see the C++ test
    assert open(viz.gantt_png(result, tmp_path / "g.png"), "rb").read().startswith(PNG_MAGIC)
    assert open(viz.stage_dag_png(plan, tmp_path / "d.png"), "rb").read().startswith(PNG_MAGIC)
    assert open(viz.stage_dag_png(schedule, tmp_path / "s.png"), "rb").read().startswith(PNG_MAGIC)
    trace = viz.chrome_trace(result)
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) == len(result.tasks)
