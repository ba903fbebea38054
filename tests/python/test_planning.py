"""graphpipe.plan / schedule / simulate front doors and the plan/simulate CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import graphpipe
from graphpipe.models import build_model


@pytest.fixture(scope="module")
def uno():
    model, inputs = build_model("candle_uno:branches=4,batch=16")
    return model, inputs, graphpipe.trace(model, inputs)


@pytest.mark.parametrize("partitioner", ["graphpipe", "metis", "sequential"])
def test_plan_covers_every_operator_once(uno, partitioner: str) -> None:
    _, _, graph = uno
    plan = graphpipe.plan(graph, 4, partitioner)
    plan.validate(graph)
    seen = sorted(n for stage in plan.stages for n in stage.nodes)
    assert seen == list(range(graph.num_nodes))
    # Up to 2 stages per device by default (folded plans: CANDLE-Uno's small branches fold).
    assert len({d for stage in plan.stages for d in stage.devices}) <= 4
    assert plan.num_stages <= 2 * 4
    assert plan.micro_batch_size * plan.num_micro_batches == 16
    assert plan.partitioner.startswith(partitioner)


def test_plan_from_model_equals_plan_from_graph(uno) -> None:
    model, inputs, graph = uno
    a = graphpipe.plan(model, 3, "metis", example_inputs=inputs)
    b = graphpipe.plan(graph, 3, "metis")
    assert a.to_json(graph) == b.to_json(graph)


def test_graph_plan_of_branches_is_not_a_chain(uno) -> None:
    _, _, graph = uno
    plan = graphpipe.plan(graph, 5, "graphpipe", micro_batches=4)
    # One stage per device: a chain (a fold is planned again as a DAG of its stages).
    sequential = graphpipe.plan(graph, 5, "sequential", micro_batches=4, stages_per_rank=1)
    assert sequential.depth == sequential.num_stages  # a chain
    # Branches meet or part: some stage has several consumers or several producers (the branch
    # stages read the model inputs themselves, so they need no common producer stage).
    successors: dict[int, set[int]] = {}
    predecessors: dict[int, set[int]] = {}
    for edge in plan.edges:
        successors.setdefault(edge.src, set()).add(edge.dst)
        predecessors.setdefault(edge.dst, set()).add(edge.src)
    assert plan.depth < plan.num_stages, str(plan)
    assert any(len(s) > 1 for s in [*successors.values(), *predecessors.values()]), str(plan)


def test_schedule_and_simulation(uno) -> None:
    _, _, graph = uno
    plan = graphpipe.plan(graph, 4, "graphpipe", micro_batches=4)
    sched = graphpipe.schedule(plan, "1f1b")
    assert sched.check()
    result = graphpipe.simulate(plan, schedule_kind=sched)
    assert result.iteration_seconds > 0
    assert result.samples_per_second == pytest.approx(16 / result.iteration_seconds, rel=1e-6)
    blocking = graphpipe.simulate(plan, overlap=False)
    assert blocking.iteration_seconds >= result.iteration_seconds - 1e-12


def test_manual_mapping(uno) -> None:
    _, _, graph = uno
    mapping = {"branches.0": 0, "branches.1": 0, "branches.2": 1, "branches.3": 1, "top": 2, "out": 2}
    with pytest.raises(graphpipe.PlanningError, match="without a stage: '_inputs'"):
        graphpipe.plan(graph, 3, "manual", manual=mapping)
    mapping[""] = 0  # everything else on stage 0: the root-level `cat` too, which needs stage 1
    with pytest.raises(graphpipe.PlanningError, match="form a cycle"):
        graphpipe.plan(graph, 3, "manual", manual=mapping)
    plan = graphpipe.plan(graph, 2, "manual", manual={"": 0, "top": 1, "out": 1})
    by_stage = {s.id: {graph.node(n).module for n in s.nodes} for s in plan.stages}
    assert by_stage[1] == {"top.0", "top.1", "top.2", "top.3", "out"}
    assert plan.depth == 2


def test_bad_requests_get_clear_errors(uno) -> None:
    model, inputs, graph = uno
    with pytest.raises(graphpipe.PlanningError, match="at least one device"):
        graphpipe.plan(graph, 0)
    with pytest.raises(graphpipe.PlanningError, match="unknown partitioner .magic.: choose graphpipe, metis"):
        graphpipe.plan(graph, 2, "magic")
    with pytest.raises(graphpipe.PlanningError, match="(?i)does not fit"):
        graphpipe.plan(graph, 2, "sequential", memory_limit="1KiB")
    with pytest.raises(graphpipe.InputError, match="example_inputs"):
        graphpipe.plan(model, 2)
    with pytest.raises(graphpipe.InputError, match="memory size"):
        graphpipe.plan(graph, 2, memory_limit="lots")
    with pytest.raises(graphpipe.GraphpipeError):
        graphpipe.plan(graph, graph.num_nodes + 5, "sequential", replicate=False)


def test_plan_file_is_checked_against_its_graph(uno, tmp_path) -> None:
    _, _, graph = uno
    plan = graphpipe.plan(graph, 3, "sequential")
    path = tmp_path / "plan.json"
    plan.save(graph, str(path))
    assert graphpipe.Plan.load(str(path), graph).to_json(graph) == plan.to_json(graph)
    other_model, other_inputs = build_model("candle_uno:branches=3,batch=16")
    other = graphpipe.trace(other_model, other_inputs)
    with pytest.raises(graphpipe.GraphpipeError, match="(?i)fingerprint|another|different"):
        graphpipe.Plan.load(str(path), other)
    doc = json.loads(path.read_text())
    doc["stages"][0]["nodes"] = doc["stages"][0]["nodes"][1:]  # an operator dropped
    path.write_text(json.dumps(doc))
    with pytest.raises(graphpipe.GraphpipeError):
        graphpipe.Plan.load(str(path), graph)


def test_cli_plan_and_simulate(tmp_path) -> None:
    out = tmp_path / "plan.json"
    env_cwd = dict(capture_output=True, text=True, cwd=tmp_path, timeout=300)
    made = subprocess.run([sys.executable, "-m", "graphpipe", "plan", "dlrm:batch=16", "--devices", "3",
                           "--partitioner", "metis", "--out", str(out)], **env_cwd)
    assert made.returncode == 0, made.stderr
    assert "Plan (metis)" in made.stdout
    sim = subprocess.run([sys.executable, "-m", "graphpipe", "simulate", str(out), "--schedule", "fill_drain",
                          "--png", "g.png", "--dag", "d.png", "--trace", "t.json"], **env_cwd)
    assert sim.returncode == 0, sim.stderr
    assert "samples/s" in sim.stdout and "critical path" in sim.stdout
    assert (tmp_path / "g.png").stat().st_size > 1000
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])


def test_every_list_of_names_comes_from_the_core() -> None:
    from graphpipe._ext import _C

    assert graphpipe.PARTITIONERS == tuple(_C.partitioner_names())
    assert graphpipe.SCHEDULES == tuple(_C.schedule_kinds())
    assert graphpipe.DEVICE_KINDS == tuple(_C.device_presets())
    assert graphpipe.OPTIMIZERS == tuple(_C.optimizer_names())
    assert set(graphpipe.PARTITIONERS) == {"graphpipe", "metis", "sequential", "manual", "piper"}
    # Every listed name is accepted where it is used, and the errors list them all.
    for kind in graphpipe.SCHEDULES:
        assert graphpipe.Schedule.generate(graphpipe.plan(*_tiny_graph_and_devices(), "sequential"), kind)
    with pytest.raises(graphpipe.PlanningError, match="expected " + ", ".join(graphpipe.SCHEDULES)):
        graphpipe.Schedule.generate(graphpipe.plan(*_tiny_graph_and_devices(), "sequential"), "zigzag")
    with pytest.raises(graphpipe.PlanningError, match="the presets are " + ", ".join(graphpipe.DEVICE_KINDS)):
        graphpipe.devices(2, "tpu")
    with pytest.raises(graphpipe.PlanningError, match="choose " + ", ".join(graphpipe.OPTIMIZERS)):
        graphpipe.plan(*_tiny_graph_and_devices(), optimizer="lion")


def _tiny_graph_and_devices() -> tuple:
    model, inputs = build_model("candle_uno:branches=2,batch=8")
    return graphpipe.trace(model, inputs), 2


def test_source_folder_without_extension_says_how_to_run(tmp_path) -> None:
    # `pip install .` then `python -m graphpipe` in the repository root: the source folder
    # shadows the installed package. A copy of the sources without the extension stands in for
    # that folder; the error must name both places and the remedies.
    import shutil
    from pathlib import Path

    source = Path(graphpipe.__file__).parent
    copy = tmp_path / "graphpipe"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    finders = subprocess.run([sys.executable, "-c", "import sys; print(sys.meta_path)"], capture_output=True,
                             text=True, cwd=tmp_path, timeout=60).stdout
    run = subprocess.run([sys.executable, "-m", "graphpipe", "--help"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    if "__editable__" in finders:
        # An editable install (the README's development flow): its import finder supplies
        # graphpipe._C from the build in the source folder, so the command works anywhere.
        assert run.returncode == 0, run.stderr
        assert "usage: python -m graphpipe" in run.stdout
        return
    assert run.returncode != 0
    assert f"source folder {copy}" in run.stderr
    assert "pip install --no-build-isolation -e ." in run.stderr
    assert str(source) in run.stderr  # the package that has the extension


def test_missing_extension_message_names_the_installed_package(tmp_path) -> None:
    # The message itself, on a made-up layout, whatever kind of install runs the tests: a source
    # folder without the extension ahead of an installed package with it.
    from graphpipe._ext import _missing_extension_message

    source = tmp_path / "repo" / "graphpipe"
    installed = tmp_path / "site" / "graphpipe"
    for folder in (source, installed):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
    (installed / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    error = ImportError("cannot import name '_C'")
    shadowed = _missing_extension_message(error, str(source), [str(source.parent), str(installed.parent)])
    assert f"source folder {source}" in shadowed and str(installed) in shadowed
    assert "pip install --no-build-isolation -e ." in shadowed and "cannot import name '_C'" in shadowed
    # No installed package with an extension: the plain "not built" message.
    (installed / "_C.cpython-311-x86_64-linux-gnu.so").unlink()
    plain = _missing_extension_message(error, str(source), [str(source.parent), str(installed.parent)])
    assert plain.startswith("graphpipe's C++ extension graphpipe._C is not built")


def test_devices_on_nodes_and_the_all_reduce_they_imply() -> None:
    gpus = graphpipe.devices(8, "v100", per_node=4)
    assert list(gpus.node) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert list(graphpipe.devices(4, "cpu", per_node=2).node) == [0, 0, 1, 1]
    assert list(graphpipe.devices(4, "cpu").node) == [0, 0, 0, 0]
    bytes_ = 256e6
    ring = graphpipe.all_reduce_cost(gpus, range(8), bytes_, "ring")
    hier = graphpipe.all_reduce_cost(gpus, range(8), bytes_, "hierarchical")
    best = graphpipe.all_reduce_cost(gpus, range(8), bytes_)
    # Closed forms of csrc/cost/all_reduce.h on the V100 preset (NVLink 50e9 B/s, 5 us inside a
    # node of 4; InfiniBand 12.5e9 B/s, 10 us across).
    assert ring.seconds == pytest.approx(14 * (10e-6 + bytes_ / 8 / 12.5e9))
    assert hier.seconds == pytest.approx(2 * 3 * (5e-6 + bytes_ / 4 / 50e9) + 2 * (10e-6 + bytes_ / 8 / 12.5e9))
    assert best.algorithm == "hierarchical" and best.seconds == hier.seconds
    assert hier.inter_node_bytes_per_device == pytest.approx(2 * bytes_ / 8)
    assert graphpipe.all_reduce_cost(gpus, [2], bytes_).seconds == 0.0
    with pytest.raises(graphpipe.PlanningError, match="device 9"):
        graphpipe.all_reduce_cost(gpus, [0, 9], bytes_)
    with pytest.raises(graphpipe.InputError, match="per_node"):
        graphpipe.devices(4, "v100", per_node=0)


@pytest.mark.parametrize("partitioner", ["graphpipe", "sequential", "metis"])
def test_replicate_keyword_gives_stages_several_devices(uno, partitioner: str) -> None:
    _, _, graph = uno
    # More devices than operators: only possible with replicas (the default then replicates).
    count = graph.num_nodes + 3
    with pytest.raises(graphpipe.PlanningError, match="replicate=True"):
        graphpipe.plan(graph, count, partitioner, replicate=False)
    plan = graphpipe.plan(graph, count, partitioner, replicate=True)
    plan.validate(graph)
    used = [d for stage in plan.stages for d in stage.devices]
    assert len(set(used)) <= count
    # A replicated stage keeps its devices to itself (plan/rank_sharing.h); others may share one.
    for stage in plan.stages:
        if len(stage.devices) > 1:
            assert all(set(stage.devices).isdisjoint(other.devices) for other in plan.stages if other.id != stage.id)
    # (Whether replicas pay is the cost model's call: on this small model and CPU ranks they
    # often do not; test_partition_replicas.cpp has the cases where they must.)
    for stage in plan.stages:
        assert plan.micro_batch_size >= len(stage.devices)
        assert (stage.all_reduce_seconds > 0) == (len(stage.devices) > 1 and stage.param_bytes > 0)
    # The figure survives the plan's JSON and shows in its table.
    back = type(plan).from_json(plan.to_json(graph), graph)
    assert [s.all_reduce_seconds for s in back.stages] == [s.all_reduce_seconds for s in plan.stages]
    assert "allred ms" in str(plan)


def test_replicate_off_is_one_device_per_stage(uno) -> None:
    _, _, graph = uno
    plan = graphpipe.plan(graph, 4, "graphpipe", replicate=False)
    assert all(len(s.devices) == 1 for s in plan.stages)
    assert all(s.all_reduce_seconds == 0.0 for s in plan.stages)
    one = graphpipe.plan(graph, 4, "graphpipe", replicate=False, stages_per_rank=1)
    assert [s.devices for s in one.stages] == [[s.id] for s in one.stages]


def test_manual_stage_devices(uno) -> None:
    _, _, graph = uno
    mapping = {"": 0, "top": 1, "out": 1}
    plan = graphpipe.plan(graph, 3, "manual", manual=mapping, stage_devices={0: [0, 2]})
    assert [s.devices for s in plan.stages] == [[0, 2], [1]]
    assert plan.stages[0].all_reduce_seconds > 0
    assert plan.micro_batch_size >= 2
    errors = {
        "stage 7": {7: [0]},
        "no device": {0: []},
        "stages 0 and 1 both run on rank 1, and one of them is replicated": {0: [0, 1], 1: [1]},
        "device 5": {0: [5]},
    }
    for message, devices in errors.items():
        with pytest.raises(graphpipe.PlanningError, match=message):
            graphpipe.plan(graph, 3, "manual", manual=mapping, stage_devices=devices)
    with pytest.raises(graphpipe.PlanningError, match="stage 0 has 3 devices"):
        graphpipe.plan(graph, 3, "manual", manual=mapping, stage_devices={0: [0, 1, 2]}, micro_batch_size=2)
    with pytest.raises(graphpipe.PlanningError, match="manual partitioner"):
        graphpipe.plan(graph, 3, "graphpipe", stage_devices={0: [0, 1]})
    with pytest.raises(graphpipe.InputError, match="stage_devices"):
        graphpipe.plan(graph, 3, "manual", manual=mapping, stage_devices=[[0, 1]])


def test_planning_for_the_zero_bubble_schedule_prices_its_split_backward() -> None:
    """The closed form for the zero-bubble schedule (the partitioners' ranking, _C.partition with
    zero_bubble) prices the fill and drain as ZB-H1's with the slowest stage's own I and W:
    M (F + I + W + T) + (depth - 1) max(0, F + T + I - W) plus the same optimizer tail;
    plan(schedule="zb_graph") predicts the zero-bubble schedule's simulated step; an unknown
    schedule is the core's PlanningError listing the kinds."""
    import graphpipe
    from graphpipe._ext import _C
    from graphpipe.models import build_model

    model, example = build_model("mmt:size=paper,device=meta")
    graph = graphpipe.trace(model, example)
    devices = graphpipe.devices(8, "v100", per_node=8)
    fixed = {"batch_size": 256, "num_micro_batches": 16}
    one = _C.partition(graph, devices, "sequential", **fixed)
    zb = _C.partition(graph, devices, "sequential", zero_bubble=True, **fixed)
    planned = graphpipe.plan(graph, devices, "sequential", schedule="zb_graph", batch_size=256, micro_batches=16)
    assert planned.predicted_iteration_seconds == pytest.approx(
        graphpipe.simulate(planned, devices, "zb_graph").iteration_seconds, rel=1e-12)
    assert [list(s.nodes) for s in one.stages] == [list(s.nodes) for s in zb.stages]
    # The first stage receives nothing; a later one that continues a branch receives its
    # activations: I runs there, and W starts where the parameters join I's path, computing no
    # activation gradient again (I + W is the whole backward, not more).
    assert zb.stages[0].backward_input_seconds == 0.0 < zb.stages[0].backward_weight_seconds
    received = [s for s in zb.stages if s.backward_input_seconds > 0.0]
    assert received
    for s in received:
        assert s.backward_weight_seconds > 0.0
        assert s.backward_input_seconds + s.backward_weight_seconds == pytest.approx(s.backward_seconds, rel=1e-6)
    M = one.num_micro_batches
    slowest = max(s.forward_seconds + s.backward_seconds + s.transfer_seconds for s in one.stages)
    tail = one.predicted_iteration_seconds - (M + one.depth - 1) * slowest
    split = max(zb.stages, key=lambda s: s.forward_seconds + s.backward_input_seconds + s.backward_weight_seconds
                + s.transfer_seconds)
    time = split.forward_seconds + split.backward_input_seconds + split.backward_weight_seconds + split.transfer_seconds
    fill = max(0.0, split.forward_seconds + split.transfer_seconds + split.backward_input_seconds
               - split.backward_weight_seconds)
    assert zb.predicted_iteration_seconds == pytest.approx(M * time + (zb.depth - 1) * fill + tail, rel=1e-9)
    with pytest.raises(graphpipe.PlanningError, match="zb_graph"):
        graphpipe.plan(graph, devices, schedule="zero-bubble")


def _stage_figures(plan) -> list[tuple]:
    return [(s.forward_seconds, s.backward_seconds, s.backward_input_seconds, s.backward_weight_seconds,
             s.transfer_seconds, s.memory_bytes, s.all_reduce_seconds, s.in_flight, s.recompute) for s in plan.stages]


def _decisions(plan) -> tuple:
    return (plan.partitioner, plan.schedule, plan.fold, plan.chain, plan.optimizer, plan.num_micro_batches,
            plan.micro_batch_size, plan.memory_limit_bytes, [list(s.nodes) for s in plan.stages],
            [list(s.devices) for s in plan.stages])


def test_retime_prices_a_plan_on_a_new_profile_and_keeps_every_decision() -> None:
    """graphpipe.retime: on the profile a plan was made on it gives the same figures and the same
    simulated step (one replicated stage, a V placed by hand, the planner's pick, a sequential
    chain, a plan folded in a V and a non-default sync method); with every operator twice as slow,
    every stage's compute doubles and nothing the plan decided changes."""
    from graphpipe._ext import _C

    model, inputs = build_model("transformer:depth=4,seq=8,hidden=32,heads=2,ffn=32,batch=8")
    graph = graphpipe.trace(model, inputs)
    graphpipe.profile(graph, model, inputs, batch_sizes=(2, 4, 8), repeats=1, warmup=0)
    devices = graphpipe.devices(2)
    plans = [graphpipe.plan(graph, devices, "manual", manual={"": 0}, stage_devices={0: [0, 1]}, micro_batches=1,
                            sync=graphpipe.sync.LocalSGD(period=4)),
             graphpipe.plan(graph, devices, "manual", manual={"": 3, "blocks.0": 0, "blocks.1": 1, "blocks.2": 2},
                            stage_devices={0: [0], 1: [1], 2: [1], 3: [0]}, micro_batches=4, schedule="zb_graph"),
             graphpipe.plan(graph, devices), graphpipe.plan(graph, devices, "sequential")]
    assert plans[3].chain and plans[0].sync.kind == "local_sgd"
    steps = []
    for plan in plans:
        again = graphpipe.retime(plan, graph, devices)
        assert _decisions(again) == _decisions(plan) and _stage_figures(again) == _stage_figures(plan)
        assert again.sync.describe() == plan.sync.describe()
        steps.append(graphpipe.simulate(plan, devices, plan.schedule).iteration_seconds)
        assert graphpipe.simulate(again, devices, plan.schedule).iteration_seconds == steps[-1]
    for node_id, node in enumerate(graph.nodes):  # every operator twice as slow
        graph.set_profile(node_id, [_C.ProfileSample(s.batch_size, 2 * s.forward_seconds, 2 * s.backward_seconds,
                                                     2 * s.backward_input_seconds, 2 * s.backward_weight_seconds)
                                    for s in node.profile])
    for plan, step in zip(plans, steps):
        slower = graphpipe.retime(plan, graph, devices)
        assert _decisions(slower) == _decisions(plan)
        for before, after in zip(plan.stages, slower.stages):
            assert after.forward_seconds == pytest.approx(2 * before.forward_seconds, rel=1e-9)
            assert after.backward_seconds == pytest.approx(2 * before.backward_seconds, rel=1e-9)
        assert graphpipe.simulate(slower, devices, plan.schedule).iteration_seconds > 1.3 * step

    # A plan the planner folded in a V keeps its fold (DLRM at paper size onto 4 V100s).
    dlrm, dlrm_inputs = build_model("dlrm:size=paper,device=meta,batch=256")
    dlrm_graph = graphpipe.trace(dlrm, dlrm_inputs)
    v100 = _C.Devices.v100(4, per_node=8)
    folded = graphpipe.plan(dlrm_graph, v100, fold="v")
    again = graphpipe.retime(folded, dlrm_graph, v100)
    assert folded.fold == "v" and _decisions(again) == _decisions(folded)
    assert _stage_figures(again) == _stage_figures(folded)


def test_retime_refuses_what_would_not_be_the_same_plan() -> None:
    model, inputs = build_model("transformer:depth=4,seq=8,hidden=32,heads=2,ffn=32,batch=8")
    graph = graphpipe.trace(model, inputs)
    plan = graphpipe.plan(graph, 2, "manual", manual={"": 0}, stage_devices={0: [0, 1]}, micro_batches=2)
    other, other_inputs = build_model("transformer:depth=2,seq=8,hidden=32,heads=2,ffn=32,batch=8")
    with pytest.raises(graphpipe.PlanningError):  # another graph
        graphpipe.retime(plan, graphpipe.trace(other, other_inputs), 2)
    with pytest.raises(graphpipe.PlanningError, match="runs on 2 ranks but the devices describe 1"):
        graphpipe.retime(plan, graph, 1)
    plan.stages[0].recompute = True  # a decision the evaluation would not make on these devices
    with pytest.raises(graphpipe.PlanningError, match="stage 0 recomputes its activations in the plan"):
        graphpipe.retime(plan, graph, 2)
