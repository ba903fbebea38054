"""Replicated stages (data parallelism inside a stage) equal single-process training.

A plan stage with several devices runs data parallel: each replica takes its rows of every
micro-batch, edges between stages of different replica counts are re-sharded row by row, and the
replicas' gradients are summed in buckets during the last backward. The gold test: the four
example models (multi-modal Transformer, DLRM, CANDLE-Uno, the sequential Transformer), cut by a
partitioner into two stages and placed as 2 x 2 replicas and 1 + 3 at 4 ranks and as a
replicated stage feeding a single one at 3 ranks, with the 1F1B, fill-drain and zero-bubble
schedules. The losses of 3 SGD steps
and the parameters afterwards (on every replica) equal plain single-process training. Two
micro-batches of 4 rows each, so 3 replicas get uneven shards (2, 1, 1 rows).

By default a rotation runs (each model at each placement, partitioner and schedule rotating: 12
cases); GRAPHPIPE_FULL_MATRIX=1 runs every schedule for every case (36). The planner's own
replicas (``wrap(..., replicate=True)``) are checked the same way at 4 ranks. Also here: a replica
killed in the middle of a step makes every other rank raise a named error within twice the
timeout, and a measured trace shows the gradient sum starting before the last backward ends.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest
import torch
from test_runtime_gold import LR, make_model, reference

from graphpipe.testing import (
    fail_in_second_step,
    run_cases,
    run_ranks,
    steps_until_error,
    survivor_errors,
    train_pipeline,
)

MODELS = ["mmt", "dlrm", "candle_uno", "transformer"]
#: stage -> its ranks: 2 stages x 2 replicas, 1 + 3, and a replicated stage feeding a single one
PLACEMENTS = {"2x2": [[0, 1], [2, 3]], "1+3": [[0], [1, 2, 3]], "2+1": [[0, 1], [2]]}
PARTITIONERS = ["graphpipe", "metis", "sequential"]
SCHEDULES = ["1f1b", "fill_drain", "zb_graph"]
MICRO_BATCHES = 2


def _cases() -> list[tuple[str, str, str, str]]:
    full = os.environ.get("GRAPHPIPE_FULL_MATRIX") == "1"
    cases = []
    for i, model in enumerate(MODELS):
        for j, placement in enumerate(PLACEMENTS):
            # candle_uno's graphpipe plan on two devices is one stage: cut it with another.
            partitioner = PARTITIONERS[(i + j) % 3]
            if model == "candle_uno" and partitioner == "graphpipe":
                partitioner = "metis"
            schedules = SCHEDULES if full else [SCHEDULES[(i + j) % 3]]
            cases.extend((model, placement, partitioner, s) for s in schedules)
    return cases


CASES = _cases()


def replicated_plan(model: torch.nn.Module, example: tuple, placement: list[list[int]], partitioner: str,
                    micro_batches: int = MICRO_BATCHES) -> dict[str, Any]:
    """The partitioner's two-stage cut of the model, its stages placed on `placement`'s ranks."""
    import graphpipe
    from graphpipe.trace import trace_module

    graph = trace_module(model, example).graph
    plan = graphpipe.plan(graph, len(placement), partitioner, micro_batches=micro_batches, stages_per_rank=1)
    assert plan.num_stages == len(placement), f"{partitioner} made {plan.num_stages} stages"
    doc = json.loads(plan.to_json(graph))
    for stage, ranks in zip(doc["stages"], placement):
        stage["devices"] = ranks
    doc["num_devices"] = sum(len(r) for r in placement)
    doc.pop("device_nodes", None)  # placed by hand on other devices: their nodes are unknown
    return doc


def train_case(name: str, placement: str, partitioner: str, schedule: str) -> dict[str, Any]:
    """Runs on every rank: wrap, 3 SGD steps; this rank's losses and parameters."""
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model(name)
    plan = replicated_plan(model, example, PLACEMENTS[placement], partitioner)
    with graphpipe.wrap(model, example, default_loss(name), plan=plan, schedule=schedule, timeout=60) as pipe:
        return train_pipeline(pipe, batches, LR) | {"stage": pipe.stage, "replica": pipe.executor.replica}


def _world_worker(rank: int, world: int, cases: list[tuple[str, str, str, str]]) -> dict[tuple, Any]:
    return run_cases(train_case, cases)


_RESULTS: dict[int, list[Any]] = {}
_REFERENCES: dict[str, dict[str, Any]] = {}


def _results(world: int) -> list[Any]:
    if world not in _RESULTS:
        cases = [c for c in CASES if sum(len(r) for r in PLACEMENTS[c[1]]) == world]
        _RESULTS[world] = run_ranks(_world_worker, world, cases, timeout=120 + 60 * len(cases))
    return _RESULTS[world]


@pytest.mark.parametrize("name,placement,partitioner,schedule", CASES, ids=["-".join(c) for c in CASES])
def test_replicated_plan_matches_single_process(name: str, placement: str, partitioner: str, schedule: str) -> None:
    ranks = PLACEMENTS[placement]
    results = _results(sum(len(r) for r in ranks))
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    if name not in _REFERENCES:
        _REFERENCES[name] = reference(name)
    ref = _REFERENCES[name]
    seen: set[str] = set()
    for r in results:
        got = r.value[(name, placement, partitioner, schedule)]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        assert got["stage"] >= 0 and r.rank in ranks[got["stage"]]
        assert got["replica"] == ranks[got["stage"]].index(r.rank)
        torch.testing.assert_close(got["losses"], ref["losses"])
        # Every replica holds the whole stage, equal to the single-process parameters.
        for k, v in got["params"].items():
            torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")
            seen.add(k)
    assert seen == set(ref["params"]), "the ranks together must hold every parameter"


# ---- replicas chosen by the planner --------------------------------------------------------------
def _planned_worker(rank: int, world: int, name: str, partitioner: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model(name)
    # Links so fast that summing gradients is free: the planner then replicates where the
    # compute pays for it (on the CPU preset these tiny models are cheaper in a pipeline).
    devices = graphpipe.devices(world, "cpu")
    devices.set_node_links(world, 1e15, 0.0, 1e15, 0.0)
    with graphpipe.wrap(model, example, default_loss(name), partitioner=partitioner, replicate=True,
                        devices=devices, timeout=60) as pipe:
        return train_pipeline(pipe, batches, LR) | {"devices": [list(s.devices) for s in pipe.plan.stages]}


# DLRM on 3 ranks: a stage and a 2-replica stage (on 4 it runs 4 single stages since model
# inputs stopped counting as transfers); MMT's PipeDream plan on 4: data parallelism.
@pytest.mark.parametrize("name,partitioner,world", [("dlrm", "graphpipe", 3), ("mmt", "sequential", 4)])
def test_planner_chosen_replicas_match_single_process(name: str, partitioner: str, world: int) -> None:
    results = run_ranks(_planned_worker, world, name, partitioner, timeout=240)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    assert any(len(d) > 1 for d in results[0].value["devices"]), results[0].value["devices"]
    ref = reference(name)
    for r in results:
        torch.testing.assert_close(r.value["losses"], ref["losses"])
        for k, v in r.value["params"].items():
            torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")
    print(f"\n{name} {partitioner} replicate=True on {world} ranks: stages on {results[0].value['devices']}")


# ---- a replica that dies -----------------------------------------------------------------------
TIMEOUT = 5.0
VICTIM = 1  # the second replica of stage 0


def _fault_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("mmt")
    plan = replicated_plan(model, example, PLACEMENTS["2x2"], "sequential")
    pipe = graphpipe.wrap(model, example, default_loss("mmt"), plan=plan, timeout=TIMEOUT)
    if rank == VICTIM:
        fail_in_second_step(pipe, "kill")
    return steps_until_error(pipe, batches)


def test_a_dead_replica_is_every_ranks_named_error() -> None:
    started = time.monotonic()
    results = run_ranks(_fault_worker, 4, timeout=60 + 8 * TIMEOUT)
    assert time.monotonic() - started < 120
    for got in survivor_errors(results, VICTIM, TIMEOUT):
        assert re.search(r"rank \d", got["message"]), got["message"]


# ---- the gradient sum overlaps the last backward -------------------------------------------
def _trace_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("dlrm")
    plan = replicated_plan(model, example, PLACEMENTS["2x2"], "sequential")
    # Small buckets: the model is small, and one bucket could only start at the backward's end.
    with graphpipe.wrap(model, example, default_loss("dlrm"), plan=plan, timeout=60, bucket_bytes=4096) as pipe:
        inputs, targets = batches[0]
        pipe.step(inputs, targets, record=True)
        return {"tasks": pipe.measured_tasks(gather=False), "buckets": pipe.gradient_buckets.num_buckets}


def test_measured_all_reduce_starts_inside_the_last_backward() -> None:
    results = run_ranks(_trace_worker, 4, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        tasks = r.value["tasks"]
        assert r.value["buckets"] > 1
        sums = [t for t in tasks if t["kind"] == "all_reduce"]
        assert len(sums) == 1, tasks
        last_backward = max((t for t in tasks if t["kind"] == "backward"), key=lambda t: t["end"])
        assert last_backward["micro_batch"] == MICRO_BATCHES - 1
        assert sums[0]["start"] < last_backward["end"], (sums[0], last_backward)
        assert sums[0]["end"] >= last_backward["end"]
        optimizer = [t for t in tasks if t["kind"] == "optimizer"]
        assert optimizer and optimizer[0]["start"] >= sums[0]["end"]
