"""The planner and the simulator price fault-tolerant replicas (graphpipe.CrossReplica,
csrc/cost/cross_replica.h): every rank averages the parameters it holds across the replicas
after its pipeline step, so over a slow link between replicas the planner leaves plain data
parallelism (every rank all-reduces every parameter) for a pipeline whose ranks each hold a share."""

from __future__ import annotations

import pytest

import graphpipe
from graphpipe.models import build_model

SLOW_LINK = graphpipe.CrossReplica(replicas=4, link_bandwidth=1e8, link_latency=1e-4)


@pytest.fixture(scope="module")
def transformer_graph():
    model, inputs = build_model("transformer")
    return graphpipe.trace(model, inputs)


def held_bytes(plan) -> float:
    """The most parameter bytes one rank holds (what it averages across the replicas)."""
    held = [0.0] * plan.num_devices
    for stage in plan.stages:
        for device in stage.devices:
            held[device] += stage.param_bytes
    return max(held)


def test_over_a_slow_link_the_planner_leaves_data_parallelism_for_a_pipeline(transformer_graph):
    plain = graphpipe.plan(transformer_graph, 4)
    fault_tolerant = graphpipe.plan(transformer_graph, 4, cross_replica=SLOW_LINK)
    assert len(plain.stages) == 1, "the premise: without replicas to average with, data parallelism wins here"
    assert len(fault_tolerant.stages) > 1
    assert held_bytes(fault_tolerant) < held_bytes(plain)
    # Chosen by the simulation with the replicas: faster there than the plain choice.
    plain_with_replicas = graphpipe.simulate(plain, cross_replica=SLOW_LINK).iteration_seconds
    assert fault_tolerant.predicted_iteration_seconds < plain_with_replicas
    assert graphpipe.simulate(fault_tolerant, cross_replica=SLOW_LINK).iteration_seconds == pytest.approx(
        fault_tolerant.predicted_iteration_seconds, rel=1e-12)


def test_the_simulated_step_ends_with_the_average_then_the_optimizer_steps(transformer_graph):
    plan = graphpipe.plan(transformer_graph, 2, "sequential", replicate=False, micro_batches=4)
    devices = graphpipe.devices(2)
    plain = graphpipe.simulate(plan)
    result = graphpipe.simulate(plan, cross_replica=graphpipe.CrossReplica(replicas=3, coordination_seconds=0.01))
    averages = [t for t in result.tasks if t.kind == "cross_replica"]
    assert sorted(t.rank for t in averages) == sorted({d for s in plan.stages for d in s.devices})
    for t in averages:
        held = sum(s.param_bytes for s in plan.stages if t.rank in s.devices)
        expected = graphpipe.CrossReplica(replicas=3).seconds(devices, held)
        assert t.end - t.start == pytest.approx(expected, rel=1e-12)
    barrier = max(t.end for t in averages) + 0.01
    assert all(t.start >= barrier - 1e-12 for t in result.tasks if t.kind == "optimizer")
    assert result.iteration_seconds > plain.iteration_seconds + 0.01
    # One replica is the plain step.
    alone = graphpipe.simulate(plan, cross_replica=graphpipe.CrossReplica(replicas=1, coordination_seconds=0.5))
    assert alone.iteration_seconds == plain.iteration_seconds


@pytest.mark.parametrize(("keywords", "named"), [
    ({"replicas": 0}, "replicas"),
    ({"replicas": 2, "link_bandwidth": -1.0}, "link_bandwidth"),
    ({"replicas": 2, "link_latency": 1e-3}, "link_latency is given without link_bandwidth"),
    ({"replicas": 2, "coordination_seconds": float("nan")}, "coordination_seconds"),
])
def test_bad_figures_are_refused_by_name(keywords, named):
    with pytest.raises(graphpipe.PlanningError, match=named):
        graphpipe.CrossReplica(**keywords)


def test_local_sgd_is_refused_with_replicas(transformer_graph):
    plan = graphpipe.plan(transformer_graph, 4)
    assert len(plan.stages[0].devices) == 4, "the premise: one replicated stage"
    with pytest.raises(graphpipe.PlanningError, match="local_sgd"):
        graphpipe.simulate(plan, sync=graphpipe.sync.LocalSGD(period=4), cross_replica=SLOW_LINK)


def test_one_device_needs_a_link_between_replicas(transformer_graph):
    """One device describes no link: the price needs one given, and then plans."""
    with pytest.raises(graphpipe.PlanningError, match="give CrossReplica.link_bandwidth"):
        graphpipe.plan(transformer_graph, 1, cross_replica=graphpipe.CrossReplica(replicas=2))
    plan = graphpipe.plan(transformer_graph, 1, cross_replica=SLOW_LINK)
    alone = graphpipe.simulate(plan).iteration_seconds
    average = SLOW_LINK.seconds(graphpipe.devices(1), plan.stages[0].param_bytes)
    assert plan.predicted_iteration_seconds == pytest.approx(alone + average, rel=1e-9)
