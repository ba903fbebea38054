"""Runtime on hand-made graph plans (no partitioner needed) and the Pipeline API.

Hand plans put the model's branches on stages 0..W-2 (round robin) and the join and head on the
last stage, or cut the sequential Transformer's blocks into W chains: fork-join stage DAGs with
several tensors per edge, edges that skip stages and stages with several producers/consumers.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from test_runtime_gold import LR, MICRO_BATCHES, make_model, reference

from graphpipe.testing import run_ranks

BRANCH_CONTAINERS = ("branches", "dense", "sparse")


def hand_plan(model: torch.nn.Module, example: tuple, world: int) -> dict[str, Any]:
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace_module

    graph = trace_module(model, example).graph
    assignment = {}
    for i in range(graph.num_nodes):
        node = graph.node(i)
        parts = node.module.split(".")
        if parts[0] in BRANCH_CONTAINERS and len(parts) > 1:
            assignment[node.name] = int(parts[1]) % (world - 1)
        elif parts[0] == "blocks" and len(parts) > 1:
            assignment[node.name] = min(int(parts[1]) * world // 8, world - 1)
        elif parts[0]:
            assignment[node.name] = world - 1
    return manual_plan(graph, assignment, MICRO_BATCHES)


def train_hand(name: str, schedule: str, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model(name)
    pipe = graphpipe.wrap(model, example, default_loss(name), plan=hand_plan(model, example, world),
                          schedule=schedule, timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=LR)
    losses = []
    for inputs, targets in batches:
        opt.zero_grad()
        losses.append(pipe.step(inputs, targets))
        opt.step()
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in pipe.named_parameters()}}


HAND_CASES = [("mmt", "1f1b"), ("dlrm", "fill_drain"), ("candle_uno", "1f1b"), ("transformer", "1f1b_greedy")]


def _hand_worker(rank: int, world: int) -> dict[str, Any]:
    return {name: train_hand(name, schedule, world) for name, schedule in HAND_CASES}


@pytest.fixture(scope="module")
def hand_results() -> list[Any]:
    return run_ranks(_hand_worker, 3, timeout=300)


@pytest.mark.parametrize("name", [n for n, _ in HAND_CASES])
def test_hand_plan_matches_single_process(hand_results: list[Any], name: str) -> None:
    for r in hand_results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    ref = reference(name)
    seen: dict[str, torch.Tensor] = {}
    for r in hand_results:
        got = r.value[name]
        torch.testing.assert_close(got["losses"], ref["losses"])
        for k, v in got["params"].items():
            assert k not in seen
            seen[k] = v
    assert set(seen) == set(ref["params"])
    for k, v in seen.items():
        torch.testing.assert_close(v, ref["params"][k], msg=lambda m, k=k: f"{k}: {m}")


def _api_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    import graphpipe.viz
    from graphpipe._ext import _C
    from graphpipe.errors import InputError
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    full = {k: v.clone() for k, v in model.state_dict().items()}
    expected = model(*batches[0][0]).detach()
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"),
                          plan=hand_plan(model, example, world), timeout=30)
    out: dict[str, Any] = {"stage": pipe.stage}
    out["eval"] = pipe.eval_forward(batches[0][0])
    out["expected_eval"] = expected
    try:
        pipe.step(tuple(t[:7] for t in batches[0][0]), batches[0][1][:7])
        out["indivisible"] = "no error"
    except InputError as exc:
        out["indivisible"] = str(exc)
    out["shard_keys"] = sorted(pipe.state_dict())
    out["full_keys"] = list(pipe.full_state_dict())
    out["model_keys"] = list(full)
    out["full_equal"] = all(torch.equal(full[k], v) for k, v in pipe.full_state_dict().items())
    out["posting"] = pipe.executor.receive_posting.name
    out["loss_whole_step"] = pipe.step(*batches[0], record=True)
    out["timings"] = [(t.token, t.start, t.end) for t in pipe.last_timings]
    out["timed"] = [(t.kind.name, t.stage, t.micro_batch, t.edge, t.start) for t in pipe.last_timings]
    # The same step with each receive posted one ahead instead: the same loss, and the receives
    # posted as that rule says.
    pipe.executor.set_receive_posting(_C.ReceivePosting.one_ahead)
    out["loss_one_ahead"] = pipe.step(*batches[0], record=True)
    out["timed_one_ahead"] = [(t.kind.name, t.stage, t.micro_batch, t.edge, t.start) for t in pipe.last_timings]
    pipe.executor.set_receive_posting(_C.ReceivePosting.whole_step)
    # A flight recorder ring smaller than the run: a record opened at the start could be gone when
    # its receive is waited for, so the run posts one ahead after all.
    ring = pipe.executor.flight_recorder.capacity
    pipe.executor.flight_recorder.capacity = 8
    out["loss_small_ring"] = pipe.step(*batches[0], record=True)
    out["timed_small_ring"] = [(t.kind.name, t.stage, t.micro_batch, t.edge, t.start) for t in pipe.last_timings]
    pipe.executor.flight_recorder.capacity = ring
    # One currency: the executor runs, instruction for instruction, the schedule that
    # graphpipe.schedule makes for the plan (the call graphpipe.simulate makes), also for the
    # plan read back from its JSON text.
    graph = graphpipe.trace(model, example)
    reread = graphpipe.Plan.from_json(pipe.plan.to_json(graph), graph)
    running = pipe.executor.schedule
    out["schedule_types"] = (type(pipe.plan).__name__, type(running).__name__)
    out["schedules_equal"] = [
        running.instructions(r) == pipe.schedule.instructions(r)
        == graphpipe.schedule(pipe.plan, pipe.schedule_kind).instructions(r)
        == graphpipe.schedule(reread, pipe.schedule_kind).instructions(r)
        for r in range(running.num_ranks)
    ] + [running == graphpipe.schedule(reread, pipe.schedule_kind)]
    out["simulated_same"] = (graphpipe.simulate(pipe.plan, schedule_kind=running).iteration_seconds
                             == graphpipe.simulate(reread, schedule_kind=pipe.schedule_kind).iteration_seconds)
    tasks = pipe.measured_tasks()
    out["task_ranks"] = sorted({t["rank"] for t in tasks})
    out["trace_events"] = len(graphpipe.viz.chrome_trace(tasks, source="graphpipe runtime")["traceEvents"])
    out["num_tasks"] = len(tasks)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=0.1)
    before = [p.detach().clone() for p in pipe.parameters()]
    pipe.step(*batches[1], optimizer=opt)
    out["optimizer_stepped"] = all(not torch.equal(a, p) for a, p in zip(before, pipe.parameters()))
    out["grads_zeroed"] = all(p.grad is None or not p.grad.any() for p in pipe.parameters())
    # a second batch size (other micro-batch size) re-propagates the shapes
    loss = pipe.step(tuple(t[:4] for t in batches[1][0]), batches[1][1][:4])
    out["small_batch_loss"] = loss
    with pipe:  # leaving the block closes the pipeline: no more steps, state stays readable
        pass
    out["closed"] = pipe.closed
    try:
        pipe.step(*batches[1])
        out["step_after_close"] = "no error"
    except InputError as exc:
        out["step_after_close"] = str(exc)
    out["shard_after_close"] = sorted(pipe.state_dict()) == out["shard_keys"]
    pipe.close()  # idempotent
    return out


def _assert_receives_posted_at_the_start(timed: list[tuple[str, int, int, int, float]]) -> None:
    """With every receive of a step posted at its start (CPU stages over Gloo): each receive's
    recorded start (when it was posted) is before the step's first compute."""
    receives = [s for kind, _, _, _, s in timed if kind.startswith("recv")]
    compute = [s for kind, _, _, _, s in timed if kind in ("forward", "backward", "backward_input", "backward_weight")]
    assert receives and compute
    assert max(receives) <= min(compute), timed


def _assert_receives_posted_one_ahead(timed: list[tuple[str, int, int, int, float]]) -> None:
    """Over Gloo a receive of micro-batch m is posted when the program reaches the receive of
    m - 1 over the same edge, so before the compute of m - 1 starts (a recorded transfer starts
    when it is posted)."""
    start = {(kind, stage, mb, edge): s for kind, stage, mb, edge, s in timed}
    compute = {"recv_activation": "forward", "recv_gradient": "backward"}
    receives = [key for key in start if key[0] in compute]
    assert receives, "this rank received nothing"
    for kind, stage, mb, edge in receives:
        if mb > 0:
            before = (compute[kind], stage, mb - 1, -1)
            assert start[(kind, stage, mb, edge)] <= start[before], (kind, mb, timed)


def test_pipeline_api() -> None:
    results = run_ranks(_api_worker, 3, timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    values = [r.value for r in results]
    for v in values:
        torch.testing.assert_close(v["eval"], v["expected_eval"])
        assert "does not divide into 4 micro-batches" in v["indivisible"]
        assert v["full_keys"] == v["model_keys"]
        assert v["full_equal"]
        assert v["timings"] and all(end >= start for _, start, end in v["timings"])
        assert {tok[-3:] for tok, _, _ in v["timings"]} >= {"OPT"}
        assert v["posting"] == "whole_step"
        _assert_receives_posted_at_the_start(v["timed"])
        _assert_receives_posted_one_ahead(v["timed_one_ahead"])
        assert v["loss_one_ahead"] == v["loss_whole_step"] == v["loss_small_ring"]
        _assert_receives_posted_one_ahead(v["timed_small_ring"])
        with pytest.raises(AssertionError):
            _assert_receives_posted_at_the_start(v["timed_small_ring"])
        assert v["schedule_types"] == ("Plan", "Schedule")
        assert v["schedules_equal"] and all(v["schedules_equal"]) and v["simulated_same"]
        assert v["task_ranks"] == [0, 1, 2] and v["trace_events"] > v["num_tasks"] > 0
        assert v["optimizer_stepped"] and v["grads_zeroed"]
    shard_keys = [k for v in values for k in v["shard_keys"]]
    assert sorted(shard_keys) == sorted(values[0]["model_keys"])  # each entry on exactly one rank
    assert len({float(v["small_batch_loss"]) for v in values}) == 1
    for v in values:
        assert v["closed"] and v["shard_after_close"]
        assert "closed" in v["step_after_close"]


def _posting_budget_worker(rank: int, world: int) -> dict[str, Any]:
    """The receives a rank posts at a step's start fit what the plan leaves of its memory limit
    on that rank; the rest are posted one ahead, and the step computes the same loss."""
    import torch.distributed as dist

    import graphpipe
    from graphpipe._ext import _C
    from graphpipe.errors import GraphpipeError
    from graphpipe.models import default_loss

    model, example, batches = make_model("transformer")
    loss_fn = default_loss("transformer")
    plan = hand_plan(model, example, world)
    pipe = graphpipe.wrap(copy.deepcopy(model), example, loss_fn, plan=plan, timeout=60)
    out: dict[str, Any] = {"unlimited_budget": pipe.executor.whole_step_budget_bytes,
                           "loss": pipe.step(*batches[0])}
    every = pipe.executor.posted_at_start_bytes  # every receive of the step: the limit is far
    # Half of it, then nothing, set by hand: as many receives as fit, in program order, at the
    # start; the rest one ahead.
    for budget in (every // 2, 0):
        pipe.executor.set_receive_posting(_C.ReceivePosting.whole_step, float(budget))
        loss = pipe.step(*batches[0], record=True)
        out[budget] = (loss, pipe.executor.posted_at_start_bytes,
                       [(t.kind.name, t.stage, t.micro_batch, t.edge, t.start) for t in pipe.last_timings])
    out["every"], out["half"] = every, every // 2
    try:  # a headroom below zero is no budget: refused, naming it
        pipe.executor.set_receive_posting(_C.ReceivePosting.whole_step, -1.0)
        out["negative"] = "no error"
    except GraphpipeError as exc:
        out["negative"] = str(exc)
    pipe.close()
    # A plan whose limit leaves the fullest rank half the smallest step's receive buffers: wrap
    # hands each rank its headroom.
    least = torch.tensor([every], dtype=torch.int64)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    held = [plan.rank_memory_bytes(r) for r in range(world)]
    plan.memory_limit_bytes = max(held) + float(least.item() // 2)
    tight = graphpipe.wrap(copy.deepcopy(model), example, loss_fn, plan=plan, timeout=60)
    out["tight"] = {"headroom": plan.memory_headroom(rank), "held": held[rank], "limit": plan.memory_limit_bytes,
                    "budget": tight.executor.whole_step_budget_bytes, "loss": tight.step(*batches[0])}
    out["tight"]["posted"] = tight.executor.posted_at_start_bytes
    out["fullest"] = held[rank] == max(held)
    out["whole_step_bytes"] = _C.whole_step_bytes
    tight.close()
    return out


def test_receives_posted_ahead_fit_what_the_plans_memory_limit_leaves() -> None:
    results = run_ranks(_posting_budget_worker, 2, timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    for v in (r.value for r in results):
        # Without a limit that binds (the device's memory), the cap of host buffers; every
        # receive of the step fits it and is posted at the start.
        assert v["unlimited_budget"] == v["whole_step_bytes"]
        assert v["every"] > 0
        loss, posted, timed = v[v["half"]]
        assert loss == v["loss"]
        assert 0 < posted <= v["half"] < v["every"], (posted, v["half"], v["every"])
        with pytest.raises(AssertionError):  # not every receive at the start
            _assert_receives_posted_at_the_start(timed)
        assert "a memory headroom of -1.000000 bytes" in v["negative"] and "must be >= 0" in v["negative"], v
        loss, posted, timed = v[0]
        assert loss == v["loss"] and posted == 0
        _assert_receives_posted_one_ahead(timed)
        tight = v["tight"]
        assert tight["loss"] == v["loss"]
        assert tight["budget"] == int(tight["headroom"]) < v["whole_step_bytes"]
        # What the rank holds by the model plus what it posted ahead stays under the limit.
        assert tight["held"] + tight["posted"] <= tight["limit"]
        if v["fullest"]:
            assert tight["posted"] < v["every"]


def _lifetime_worker(rank: int, world: int) -> dict[str, Any]:
    """Two pipelines: the first closed (its groups parked), the second left open until the exit
    hook, which closes it and releases every parked group."""
    import gc
    import time

    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import default_loss
    from graphpipe.runtime import connections

    model, example, batches = make_model("candle_uno")
    pipes = [graphpipe.wrap(copy.deepcopy(model), example, default_loss("candle_uno"),
                            plan=hand_plan(model, example, world), timeout=60) for _ in range(2)]
    for pipe in pipes:
        pipe.step(*batches[0])
    first, second = pipes
    # A collective's completion callback that still holds the group when close() runs, as
    # torch's PowerSGD hook holds its state's: released on the group's own Gloo worker thread,
    # the last handle would destroy the group there and abort the process ("Resource deadlock
    # avoided"); parked, it is not the last.
    group = first._link.conn.pg
    slow = dist.all_reduce(torch.ones(1), group=group, async_op=True).get_future().then(
        lambda done, group=group: (time.sleep(0.3), done.value())[1])
    del group
    first.close()
    gc.collect()
    slow.wait()
    del slow
    time.sleep(0.3)  # the callback's closure is released on the worker thread meanwhile
    out = {"parked": [type(g).__name__ for g in connections._parked],
           "live_after_close": sorted(id(c) == id(first._link.conn) for c in connections._live.values())}
    connections._release_at_exit()
    out["second_closed"] = second.closed
    out["parked_after_exit"] = len(connections._parked)
    out["live_after_exit"] = len(connections._live)
    return out


def test_close_parks_groups_and_the_exit_hook_closes_open_pipelines() -> None:
    """close() keeps its groups' handles off the Gloo worker threads (destroyed, parked until
    the next clean close or exit); a pipeline never closed is closed by the exit hook."""
    for r in run_ranks(_lifetime_worker, 3, timeout=180):
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        v = r.value
        assert v["parked"] and set(v["parked"]) == {"ProcessGroup"}, v["parked"]
        assert v["live_after_close"] == [False], v  # only the second pipeline is still open
        assert v["second_closed"] and v["parked_after_exit"] == 0 and v["live_after_exit"] == 0


def _bad_plan_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, _ = make_model("candle_uno")
    graph = graphpipe.trace(model, example)
    doc = json.loads(hand_plan(model, example, world).to_json(graph))
    doc["edges"] = doc["edges"][:-1]  # a stage edge missing
    out: dict[str, Any] = {}
    for form, plan in (("text", json.dumps(doc)), ("dict", doc)):
        try:
            graphpipe.wrap(model, example, default_loss("candle_uno"), plan=plan, timeout=30)
            out[form] = ("accepted", "")
        except graphpipe.GraphpipeError as exc:
            out[form] = (type(exc).__name__, str(exc))
    try:
        graphpipe.Plan.from_json(json.dumps(doc), graph)
        out["loader"] = ("accepted", "")
    except graphpipe.GraphpipeError as exc:
        out["loader"] = (type(exc).__name__, str(exc))
    return out


def test_bad_plan_is_refused_by_the_cpp_validator() -> None:
    """A plan given to wrap as JSON (text or dict) with a stage edge missing is refused by the
    C++ loader, with the error graphpipe.Plan.from_json gives. Every rank loads it; a rank that
    is still exchanging the agreement when another has refused it fails together with it, with
    an InputError naming that rank and the same error."""
    results = run_ranks(_bad_plan_worker, 2, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        kind, message = r.value["loader"]
        assert kind in ("FormatError", "PlanningError") and "stage edges" in message, message
        for form in ("text", "dict"):
            got = r.value[form]
            assert got == (kind, message) or (
                got[0] == "InputError" and got[1].endswith(f": {kind}: {message}")), (form, got)
    assert any(r.value[form] == r.value["loader"] for r in results for form in ("text", "dict"))


class _TwoBranchBN(torch.nn.Module):
    """Two branches with BatchNorm (batch-dependent), joined by a head."""

    def __init__(self) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU()) for _ in range(2)
        )
        self.head = torch.nn.Linear(16, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.branches[0](a), self.branches[1](b)], dim=1))


def _bn_batches() -> list[Any]:
    g = torch.Generator().manual_seed(7)
    return [((torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)), torch.randn(8, 1, generator=g))
            for _ in range(3)]


def _bn_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.runtime import manual_plan
    from graphpipe.trace import trace_module

    torch.manual_seed(3)
    model = _TwoBranchBN()
    example = _bn_batches()[0][0]
    graph = trace_module(copy.deepcopy(model), example).graph  # tracing runs BatchNorm: use a copy
    assignment = {}
    for i in range(graph.num_nodes):
        node = graph.node(i)
        if node.module.startswith("branches."):
            assignment[node.name] = int(node.module.split(".")[1])
        elif node.module or node.name.startswith("cat"):
            assignment[node.name] = 2
    pipe = graphpipe.wrap(model, example, torch.nn.MSELoss(), plan=manual_plan(graph, assignment, MICRO_BATCHES), timeout=60)
    opt = torch.optim.SGD(list(pipe.parameters()), lr=LR)
    losses = [pipe.step(x, y, optimizer=opt) for x, y in _bn_batches()]
    return {"losses": torch.stack(losses), "state": pipe.full_state_dict()}


def test_batchnorm_equals_gradient_accumulation_over_micro_batches() -> None:
    results = run_ranks(_bn_worker, 3, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    torch.manual_seed(3)
    model = _TwoBranchBN()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for (a, b), y in _bn_batches():
        opt.zero_grad()
        total = torch.zeros(())
        for m in range(MICRO_BATCHES):
            sl = slice(2 * m, 2 * m + 2)
            loss = torch.nn.functional.mse_loss(model(a[sl], b[sl]), y[sl]) / MICRO_BATCHES
            loss.backward()
            total += loss.detach()
        opt.step()
        losses.append(total)
    got = results[0].value
    torch.testing.assert_close(got["losses"], torch.stack(losses))
    for k, v in model.state_dict().items():  # parameters and BatchNorm running statistics
        torch.testing.assert_close(got["state"][k], v, msg=lambda m, k=k: f"{k}: {m}")


def _single_rank_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")

    def failing_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom in loss_fn")

    pipe = graphpipe.wrap(model, example, failing_loss, partitioner="sequential", micro_batches=2, timeout=10)
    out: dict[str, Any] = {"stages": pipe.plan.num_stages}
    try:
        pipe.step(*batches[0])
    except ValueError as exc:  # the Python exception crosses the C++ executor unchanged
        out["error"] = str(exc)
    try:  # an error inside a step leaves the pipeline refusing to go on, naming the failure
        pipe.step(*batches[0])
    except graphpipe.InputError as exc:
        out["refusal"] = str(exc)
    model, example, batches = make_model("candle_uno")
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential", micro_batches=2, timeout=10)
    out["loss"] = pipe.step(*batches[0])
    return out


def test_single_rank_and_python_errors_cross_the_executor() -> None:
    (r,) = run_ranks(_single_rank_worker, 1, timeout=120)
    assert r.ok, f"{r.error_type}: {r.message}\n{r.traceback}"
    assert r.value["stages"] == 1 and r.value["error"] == "boom in loss_fn"
    assert "stopped after a failure (rank 0: ValueError: boom in loss_fn)" in r.value["refusal"]
    torch.testing.assert_close(r.value["loss"], reference("candle_uno")["losses"][0])


def _front_door_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    graph = graphpipe.trace(model, example)
    options = dict(memory_limit="64MiB", optimizer="sgd", micro_batch_size=2, device_kind="v100")
    out: dict[str, Any] = {}
    # wrap takes every option graphpipe.plan takes, and plans with it on rank 0.
    with graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="metis", timeout=30,
                        **options) as pipe:
        expected = graphpipe.plan(graph, world, "metis", **options)
        out["same_plan"] = pipe.plan.to_json(graph) == expected.to_json(graph)
        out["micro_batch_size"] = pipe.plan.micro_batch_size
        out["loss"] = float(pipe.step(*batches[0]))
    for bad in (dict(optimizer="lion"), dict(memory_limit="1KiB"), dict(partitioner="fastest")):
        try:
            graphpipe.wrap(model, example, default_loss("candle_uno"), timeout=30, **bad)
            out[str(bad)] = "accepted"
        except graphpipe.GraphpipeError as exc:
            out[str(bad)] = f"{type(exc).__name__}: {exc}"
    try:
        graphpipe.wrap(model, example, default_loss("candle_uno"), plan=expected, memory_limit="1GiB", timeout=30)
        out["plan and options"] = "accepted"
    except graphpipe.GraphpipeError as exc:
        out["plan and options"] = f"{type(exc).__name__}: {exc}"
    return out


def test_wrap_takes_every_planning_option_of_plan() -> None:
    results = run_ranks(_front_door_worker, 2, timeout=180)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        v = r.value
        assert v["same_plan"] is True
        assert v["micro_batch_size"] == 2
        assert v["loss"] == v["loss"]  # trained a step
        assert "unknown optimizer 'lion'" in v["{'optimizer': 'lion'}"]
        assert "does not fit" in v["{'memory_limit': '1KiB'}"].lower()
        assert "unknown partitioner 'fastest'" in v["{'partitioner': 'fastest'}"]
        assert v["plan and options"].startswith("InputError") and "memory_limit" in v["plan and options"]
