"""Plans with several stages per rank: the manual partitioner's ``stage_devices`` may place
several stages on one device, each alone on it (a replicated stage keeps its devices to
itself); such a plan validates, prints, schedules with no transfers between two stages on one
rank, and simulates as the planner predicted. Training on such plans is gold-tested in
test_stages_per_rank_gold.py."""

from __future__ import annotations

import pytest

import graphpipe
from graphpipe.models import build_model
from graphpipe.runtime.plan import check_runnable

# A chain of 4 stages folded into a V on 2 ranks: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
V = {0: [0], 1: [1], 2: [1], 3: [0]}
STAGES = {"blocks.0": 0, "blocks.1": 1, "blocks.2": 2, "blocks.3": 3, "": 3}


@pytest.fixture(scope="module")
def chain():
    model, inputs = build_model("transformer:depth=4,batch=8")
    return graphpipe.trace(model, inputs)


def test_a_v_plan_validates_schedules_and_simulates(chain) -> None:
    devices = graphpipe.devices(2)
    plan = graphpipe.plan(chain, devices, "manual", manual=STAGES, stage_devices=V, micro_batches=4)
    plan.validate(chain)
    assert [list(s.devices) for s in plan.stages] == [[0], [1], [1], [0]]
    assert "4 stages on 2 devices" in str(plan)
    schedule = graphpipe.schedule(plan, "1f1b")
    assert "stage ranks: 0 1 1 0" in str(schedule)
    # Edge 1 (stage 1 -> 2) stays on rank 1: no send or receive names it; edges 0 and 2 cross.
    tokens = [t for program in schedule.programs for t in program]
    assert not [t for t in tokens if t.endswith("e1")]
    assert [t for t in tokens if t.endswith("e0")] and [t for t in tokens if t.endswith("e2")]
    result = graphpipe.simulate(plan, devices)
    assert result.iteration_seconds == pytest.approx(plan.predicted_iteration_seconds, rel=1e-12)
    # The same stages one per rank on 4 devices, against two per rank on 2: each rank of the V
    # runs two stages' computes, so the step is longer, but by less than twice (the V overlaps).
    one_each = graphpipe.plan(chain, graphpipe.devices(4), "manual", manual=STAGES, micro_batches=4)
    assert one_each.predicted_iteration_seconds < plan.predicted_iteration_seconds
    assert plan.predicted_iteration_seconds < 2 * one_each.predicted_iteration_seconds


def test_a_rank_shared_with_a_replicated_stage_is_refused(chain) -> None:
    with pytest.raises(graphpipe.PlanningError, match="one of them is replicated"):
        graphpipe.plan(chain, graphpipe.devices(3), "manual", manual=STAGES, micro_batches=4,
                       stage_devices={0: [0], 1: [1, 2], 2: [1], 3: [0]})


def test_the_runtime_takes_several_stages_per_rank(chain) -> None:
    plan = graphpipe.plan(chain, graphpipe.devices(2), "manual", manual=STAGES, stage_devices=V, micro_batches=4)
    check_runnable(plan, 2, None)
    with pytest.raises(graphpipe.PlanningError, match="only 1 ranks"):
        check_runnable(plan, 1, None)


def test_the_default_plan_folds_where_a_fold_simulates_faster() -> None:
    """graphpipe.plan's default search weighs plans with two stages per rank (stages_per_rank
    unset: 2 there): DLRM at paper size onto 8 V100s gets one, faster than its best plan with
    one stage per rank. A partitioner named, or replicate given, plans one stage per rank."""
    from graphpipe._ext import _C

    model, inputs = build_model("dlrm:size=paper,device=meta,batch=256")
    graph = graphpipe.trace(model, inputs)
    devices = _C.Devices.v100(8, per_node=8)
    default = graphpipe.plan(graph, devices)
    one = graphpipe.plan(graph, devices, stages_per_rank=1)
    assert "2 stages per device" in default.partitioner, default
    assert default.num_stages > 8 and max(len(s.devices) for s in default.stages) == 1
    assert default.predicted_iteration_seconds < one.predicted_iteration_seconds
    assert default.predicted_iteration_seconds == graphpipe.plan(graph, devices, stages_per_rank=2).predicted_iteration_seconds
    for named in (graphpipe.plan(graph, devices, "sequential"), graphpipe.plan(graph, devices, replicate=True)):
        assert "stages per device" not in named.partitioner, named


def test_a_named_fold_is_the_only_one_weighed() -> None:
    """plan(fold=) weighs one placement of the folded plans: "v" and "looping" each give a plan
    folded that way (DLRM at paper size onto 4 V100s, where the default folds in a V), and the
    default, which weighs both, is the faster of the two. A fold named where nothing is folded,
    or an unknown one, is refused by name."""
    from graphpipe._ext import _C

    model, inputs = build_model("dlrm:size=paper,device=meta,batch=256")
    graph = graphpipe.trace(model, inputs)
    devices = _C.Devices.v100(4, per_node=8)
    default = graphpipe.plan(graph, devices)
    v = graphpipe.plan(graph, devices, fold="v")
    looping = graphpipe.plan(graph, devices, fold="looping")
    assert (v.fold, looping.fold) == ("v", "looping"), (v.partitioner, looping.partitioner)
    assert "in a V" in v.partitioner and "looping" in looping.partitioner, (v.partitioner, looping.partitioner)
    for folded in (v, looping):
        ranks = [list(s.devices) for s in folded.stages]
        assert len(ranks) > len({d for r in ranks for d in r}), ranks  # some device holds two stages
    assert default.predicted_iteration_seconds == min(v.predicted_iteration_seconds,
                                                      looping.predicted_iteration_seconds)
    # The plan records its fold (Plan.fold), through its JSON too; a plan not folded has none.
    assert _C.Plan.from_json(v.to_json(graph, 0), graph).fold == "v"
    assert graphpipe.plan(graph, devices, "sequential").fold is None
    with pytest.raises(graphpipe.PlanningError, match="unknown fold 'zigzag': choose 'v'"):
        graphpipe.plan(graph, devices, fold="zigzag")
    with pytest.raises(graphpipe.PlanningError, match="one stage per device .stages_per_rank 1"):
        graphpipe.plan(graph, devices, "sequential", fold="v")
