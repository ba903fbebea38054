"""Sync methods of replicated stages (graphpipe/sync.py, graphpipe/runtime/replica_sync.py).

Every case trains a small MLP (two stages, each on two ranks: a 2 x 2 placement, or one stage on
four ranks where a hierarchy is needed) for a few steps on 4 ranks and compares with a
single-process reference on the same batches:
- exact methods (``"allreduce"``, hierarchical all-reduce, ``TopK(1.0)``, ``LocalSGD(1)``) equal
  plain single-process SGD;
- ``LocalSGD(H)`` and ``QSR`` equal a single-process local SGD: one model copy per replica, each
  stepping on its rows of every micro-batch, their parameters averaged at the end of each round;
  QSR's rounds come from the optimizer's learning rate under a cosine schedule;
- ``PowerSGD`` sums exactly before its start iteration (torch's hook), and trains after;
- ``TopK`` below ratio 1 and PowerSGD hand fewer bytes to the collectives, and the measured bytes
  equal the cost model's (``_C.sync_payload_bytes``);
- checkpoints: 3 steps, save (parameters, optimizer, sync state), a new pipeline loads them and
  runs 3 more: equal to 6 uninterrupted steps, for every stateful method;
- a method written outside graphpipe (``FP16Compress`` below, docs/extending.md's example: one
  class, torch's fp16 compression hook) runs: half the all-reduce's bytes, and float16 rounding
  away from the exact sum.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from graphpipe._ext import _C
from graphpipe.sync import QSR, AllReduce, GradientHook, LocalSGD, PowerSGD, SyncMethod, TopK, qsr_period
from graphpipe.testing import run_cases, run_ranks

BATCH, MICRO_BATCHES, STEPS, LR = 8, 2, 6, 0.1
PLACEMENTS = {"2x2": [[0, 1], [2, 3]], "dp4": [[0, 1, 2, 3]]}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def make_model() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(7)
    model = MLP()
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g)) for _ in range(STEPS)]
    return model, batches


def cosine(step: int) -> float:
    """The learning rate of step ``step`` under CosineAnnealingLR(T_max=STEPS) from LR."""
    return 0.5 * LR * (1 + math.cos(math.pi * step / STEPS))


class FP16Compress(SyncMethod):
    """Every step, the replicas' gradients summed in float16 (torch's DDP hook): a sync method
    defined here, as a user would, to show that one class is all the runtime needs."""

    def cost_method(self) -> _C.SyncMethod:
        return _C.SyncMethod(kind="all_reduce")  # priced as the float32 all-reduce: an upper bound

    def gradient_hook(self, group: Any, hierarchy: Any) -> GradientHook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return GradientHook(_C.python_comm_hook(group, default_hooks.fp16_compress_hook))

    def __repr__(self) -> str:
        return "FP16Compress()"


def sync_method(name: str) -> Any:
    return {
        "allreduce": "allreduce",
        "all_reduce": "all_reduce",  # the C++ parser's spelling, which plan() takes too
        "hierarchical": AllReduce(hierarchical=True, ranks_per_node=2),
        "topk1": TopK(1.0),
        "topk": TopK(0.25),
        "local1": LocalSGD(1),
        "local3": LocalSGD(3),
        "qsr": QSR(base_period=1, alpha=0.12),
        "powersgd": PowerSGD(rank=1, start_iter=3),
        "fp16": FP16Compress(),
    }[name]


def build_pipe(name: str, placement: str) -> Any:
    import graphpipe
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    model, batches = make_model()
    example = (batches[0][0],)
    graph = trace_module(model, example).graph
    assignment = {"fc1": 0, "fc2": 1, "fc3": 1} if placement == "2x2" else {"": 0}
    plan = manual_plan(graph, assignment, MICRO_BATCHES, stage_devices=PLACEMENTS[placement])
    if name == "all_reduce":  # the same options as one WrapOptions object
        options = graphpipe.WrapOptions(plan=plan, timeout=60, sync=sync_method(name), bucket_bytes=2048)
        return graphpipe.wrap(model, example, nn.functional.cross_entropy, options), batches
    pipe = graphpipe.wrap(model, example, nn.functional.cross_entropy, plan=plan, timeout=60,
                          sync=sync_method(name), bucket_bytes=2048)
    return pipe, batches


def train(pipe: Any, batches: list, start: int = 0, optimizer_state: Any = None) -> tuple[list[float], Any]:
    """SGD with a cosine schedule from step ``start``; the losses and the optimizer."""
    optimizer = torch.optim.SGD(list(pipe.parameters()), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state["optimizer"])
        scheduler.load_state_dict(optimizer_state["scheduler"])
    losses = []
    for inputs, targets in batches[start:]:
        losses.append(float(pipe.step(inputs, targets, optimizer=optimizer)))
        scheduler.step()
    return losses, (optimizer, scheduler)


def train_case(name: str, placement: str) -> dict[str, Any]:
    pipe, batches = build_pipe(name, placement)
    with pipe:
        losses, _ = train(pipe, batches)
        return {"losses": losses, "params": {k: v.detach().clone() for k, v in pipe.named_parameters()},
                "stats": pipe.sync_stats, "stage": pipe.stage, "replica": pipe.executor.replica,
                "expected_bytes": expected_bytes(pipe, name)}


def expected_bytes(pipe: Any, name: str) -> float:
    """The cost model's payload bytes per replica for the STEPS steps just run."""
    from graphpipe._ext import _C

    method = sync_method(name)
    method = AllReduce() if isinstance(method, str) else method
    shapes = [_C.ParamShape(name=n, shape=list(p.shape), element_size=p.element_size())
              for n, p in pipe.named_parameters() if p.requires_grad]
    replicas = len(pipe.executor.schedule.stage_ranks[pipe.stage])
    per_node = method.ranks_per_node or 0 if isinstance(method, AllReduce) else 0
    per_step = _C.sync_payload_bytes(method.cost_method(), shapes, 2048, replicas, replicas_per_node=per_node)
    if isinstance(method, PowerSGD):
        # torch's hook all-reduces plainly for its first start_iter iterations; the cost model
        # prices its steady state.
        plain = _C.sync_payload_bytes(AllReduce().cost_method(), shapes, 2048, replicas)
        return plain * method.start_iter + per_step * (STEPS - method.start_iter)
    return per_step * STEPS


def checkpoint_case(name: str, placement: str) -> dict[str, Any]:
    """3 steps, a checkpoint, a new pipeline resumes from it for 3 more."""
    pipe, batches = build_pipe(name, placement)
    with pipe:
        half = batches[: STEPS // 2]
        _, (optimizer, scheduler) = train(pipe, half)
        saved = {"params": {k: v.clone() for k, v in pipe.state_dict().items()},
                 "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                 "sync": pipe.sync_state_dict()}
    resumed, batches = build_pipe(name, placement)
    with resumed:
        resumed.load_state_dict(saved["params"])
        resumed.load_sync_state_dict(saved["sync"])
        train(resumed, batches, start=STEPS // 2, optimizer_state=saved)
        return {"params": {k: v.detach().clone() for k, v in resumed.named_parameters()}}


EXACT = [("allreduce", "2x2"), ("all_reduce", "2x2"), ("hierarchical", "dp4"), ("topk1", "2x2"), ("local1", "2x2")]
LOCAL = [("local3", "2x2"), ("qsr", "2x2")]
LOSSY = [("topk", "2x2"), ("powersgd", "2x2"), ("fp16", "2x2")]
STATEFUL = ["local3", "qsr", "topk", "powersgd"]


def planned_case() -> dict[str, Any]:
    """wrap without a plan: rank 0 plans for the sync method the pipeline will run."""
    import graphpipe

    model, batches = make_model()
    with graphpipe.wrap(model, (batches[0][0],), nn.functional.cross_entropy, devices=4, replicate=True,
                        micro_batches=MICRO_BATCHES, sync=TopK(0.5), timeout=60) as pipe:
        params = list(pipe.parameters())  # a rank the planner left without a stage has none
        optimizer = torch.optim.SGD(params, lr=LR) if params else None
        loss = float(pipe.step(*batches[0], optimizer=optimizer))
        return {"plan_sync": pipe.plan.sync.kind, "ratio": pipe.plan.sync.ratio, "loss": loss}


def refused_case(what: str) -> dict[str, Any]:
    """Bad uses, on every rank: the error each rank raises (type and message)."""
    import graphpipe
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    model, batches = make_model()
    example = (batches[0][0],)
    graph = trace_module(model, example).graph
    plan = manual_plan(graph, {"fc1": 0, "fc2": 1, "fc3": 1}, MICRO_BATCHES, stage_devices=PLACEMENTS["2x2"])
    sync = LocalSGD(2) if what == "no optimizer" else AllReduce(hierarchical=True, ranks_per_node=2)
    try:
        with graphpipe.wrap(model, example, nn.functional.cross_entropy, plan=plan, timeout=30, sync=sync) as pipe:
            pipe.step(*batches[0])  # no optimizer=
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return {"type": None}


def _worker(rank: int, world: int) -> dict[str, Any]:
    return {"train": run_cases(train_case, EXACT + LOCAL + LOSSY),
            "checkpoint": run_cases(checkpoint_case, [(n, "2x2") for n in STATEFUL]),
            "planned": run_cases(planned_case, [()]),
            "refused": {what: refused_case(what) for what in ("no optimizer", "no hierarchy")}}


_RESULTS: list[Any] = []


def results() -> list[Any]:
    if not _RESULTS:
        _RESULTS.extend(run_ranks(_worker, 4, timeout=400))
    for r in _RESULTS:  # every test that reads the run names its failure, not a None value
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return _RESULTS


# ---- references -------------------------------------------------------------------------------
def single_process() -> dict[str, torch.Tensor]:
    model, batches = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        scheduler.step()
    return {k: v.detach() for k, v in model.named_parameters()}


def local_sgd_reference(rounds: list[int], replicas: int = 2) -> list[dict[str, torch.Tensor]]:
    """One model copy per replica, each on its rows of every micro-batch (as torch.tensor_split
    cuts them), stepping alone; parameters averaged at the end of each complete round."""
    model, batches = make_model()
    copies = [MLP() for _ in range(replicas)]
    for c in copies:
        c.load_state_dict(model.state_dict())
    optimizers = [torch.optim.SGD(c.parameters(), lr=LR) for c in copies]
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS) for o in optimizers]
    sync_after = {sum(rounds[: i + 1]) - 1 for i in range(len(rounds))}
    for step, (x, y) in enumerate(batches):
        for i, (c, o, s) in enumerate(zip(copies, optimizers, schedulers)):
            o.zero_grad()
            loss = sum(nn.functional.cross_entropy(c(xm.tensor_split(replicas)[i]), ym.tensor_split(replicas)[i])
                       for xm, ym in zip(x.tensor_split(MICRO_BATCHES), y.tensor_split(MICRO_BATCHES))) / MICRO_BATCHES
            loss.backward()
            o.step()
            s.step()
        if step in sync_after:
            with torch.no_grad():
                for ps in zip(*(c.parameters() for c in copies)):
                    mean = sum(ps) / replicas
                    for p in ps:
                        p.copy_(mean)
    return [{k: v.detach() for k, v in c.named_parameters()} for c in copies]


def _case(r: Any, key: tuple) -> dict[str, Any]:
    got = r.value["train"][key]
    assert "error" not in got, f"rank {r.rank}: {got['error']}"
    return got


# ---- tests --------------------------------------------------------------------------------------
def test_qsr_periods_match_the_rule_on_a_cosine_schedule() -> None:
    """Hand-computed: lr_t = 0.05 (1 + cos(pi t / 20)), H_base = 2, alpha = 0.2:
    t=0  lr=0.1        (0.2/0.1)^2 = 4        -> 4
    t=4  lr=0.0904508  (2.21115)^2 = 4.889    -> 4
    t=8  lr=0.0654508  (3.05573)^2 = 9.3375   -> 9
    t=17 lr=0.0054497  (36.700)^2 = 1346.9    -> 1346, cut to the 3 steps left."""
    qsr = QSR(base_period=2, alpha=0.2)
    lrs = [0.05 * (1 + math.cos(math.pi * t / 20)) for t in range(20)]
    assert qsr.rounds(lrs) == [4, 4, 9, 3]
    assert [qsr.period(lr) for lr in (0.1, 0.2, 0.5)] == [4, 2, 2]  # H_base is the floor
    assert qsr_period(2, 0.2, 0.0654508) == 9
    assert qsr.mean_period_of(lrs) == 5.0
    with pytest.raises(Exception, match="learning rate must be positive"):
        qsr.period(0.0)


def test_bad_sync_arguments_are_named() -> None:
    import graphpipe.sync as sync

    with pytest.raises(Exception, match="period must be a positive integer"):
        LocalSGD(0)
    with pytest.raises(Exception, match=r"ratio must be in \(0, 1\]"):
        TopK(1.5)
    with pytest.raises(Exception, match="start_iter must be at least 2"):
        PowerSGD(rank=2, start_iter=1)
    with pytest.raises(Exception, match="sync must be 'allreduce' or a graphpipe.sync method"):
        sync.parse("gossip")
    with pytest.raises(Exception, match="needs its parameters"):
        sync.parse("local_sgd")


def test_sync_names_are_the_cpp_parsers() -> None:
    """wrap (graphpipe.sync.parse) and plan (planner.sync_method) read names with one rule, the
    C++ parser's: both spellings of the all-reduce are accepted by both."""
    import graphpipe.sync as sync
    from graphpipe.planner import sync_method as plan_sync

    for name in ("allreduce", "all_reduce"):
        assert sync.parse(name) == AllReduce()
        assert plan_sync(name) == AllReduce().cost_method()


@pytest.mark.parametrize("name,placement", EXACT, ids=[n for n, _ in EXACT])
def test_exact_methods_equal_single_process_training(name: str, placement: str) -> None:
    ref = single_process()
    for r in results():
        got = _case(r, (name, placement))
        for k, v in got["params"].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")


@pytest.mark.parametrize("name", ["local3", "qsr"])
def test_local_methods_equal_single_process_local_sgd(name: str) -> None:
    lrs = [cosine(t) for t in range(STEPS)]
    rounds = [3, 3] if name == "local3" else sync_method("qsr").rounds(lrs)
    # QSR's rounds on this schedule: lr 0.1 -> max(1, floor(1.44)) = 1; 0.0933 -> 1; 0.075 -> 2
    # (the round covers steps 2-3); 0.025 -> 23, cut to the 2 steps left and never completed.
    if name == "qsr":
        assert rounds == [1, 1, 2, 2]
    complete = rounds if name == "local3" else rounds[:-1]
    refs = local_sgd_reference(complete)
    for r in results():
        got = _case(r, (name, "2x2"))
        ref = refs[got["replica"]]
        for k, v in got["params"].items():
            torch.testing.assert_close(v, ref[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")
        assert got["stats"]["syncs"] == len(complete)


def test_local_sgd_replicas_agree_only_after_a_round() -> None:
    by_stage: dict[int, list[dict[str, torch.Tensor]]] = {}
    for r in results():
        got = _case(r, ("qsr", "2x2"))  # its last round is incomplete: the replicas differ
        by_stage.setdefault(got["stage"], []).append(got["params"])
    for params in by_stage.values():
        assert any(not torch.equal(params[0][k], params[1][k]) for k in params[0])
    for r in results():
        assert _case(r, ("local3", "2x2"))["stats"]["syncs"] == 2


def test_lossy_methods_send_fewer_bytes_and_train() -> None:
    for r in results():
        exact = _case(r, ("allreduce", "2x2"))
        for name in ("topk", "powersgd"):
            got = _case(r, (name, "2x2"))
            assert all(math.isfinite(v) for v in got["losses"])
            assert got["stats"]["bytes"] < exact["stats"]["bytes"], (name, got["stats"], exact["stats"])


def test_a_method_defined_outside_graphpipe_runs() -> None:
    ref = single_process()
    for r in results():
        exact, got = _case(r, ("allreduce", "2x2")), _case(r, ("fp16", "2x2"))
        assert got["stats"]["method"] == "FP16Compress()"
        assert got["stats"]["bytes"] * 2 == exact["stats"]["bytes"], (got["stats"], exact["stats"])
        for k, v in got["params"].items():  # float16 sums: near the exact training...
            torch.testing.assert_close(v, ref[k], rtol=1e-2, atol=1e-3)
        # ...but not equal to it: the hook ran
        assert any(not torch.equal(v, exact["params"][k]) for k, v in got["params"].items())


def test_powersgd_sums_exactly_before_its_start_iteration() -> None:
    """torch's hook all-reduces plainly for its first start_powerSGD_iter (3) iterations: the
    losses up to the fourth step's are exact."""
    for r in results():
        exact = _case(r, ("allreduce", "2x2"))["losses"]
        got = _case(r, ("powersgd", "2x2"))["losses"]
        assert got[:4] == pytest.approx(exact[:4], rel=1e-6)
        assert got[4:] != pytest.approx(exact[4:], rel=1e-6)


@pytest.mark.parametrize("name", ["allreduce", "topk", "powersgd", "local3", "qsr", "hierarchical"])
def test_measured_bytes_equal_the_cost_model(name: str) -> None:
    placement = "dp4" if name == "hierarchical" else "2x2"
    for r in results():
        got = _case(r, (name, placement))
        if name == "qsr":
            continue  # priced by its mean period; its measured syncs are checked above
        assert got["stats"]["bytes"] == pytest.approx(got["expected_bytes"], rel=1e-9), got["stats"]


@pytest.mark.parametrize("name", STATEFUL)
def test_a_resumed_run_equals_an_uninterrupted_one(name: str) -> None:
    for r in results():
        resumed = r.value["checkpoint"][(name, "2x2")]
        assert "error" not in resumed, f"rank {r.rank}: {resumed['error']}"
        straight = _case(r, (name, "2x2"))
        for k, v in resumed["params"].items():
            torch.testing.assert_close(v, straight["params"][k], rtol=0, atol=0,
                                       msg=lambda m, k=k, r=r: f"rank {r.rank} {k}: {m}")


def test_wrap_plans_for_the_sync_method_it_runs() -> None:
    for r in results():
        got = r.value["planned"][()]
        assert "error" not in got, f"rank {r.rank}: {got['error']}"
        assert (got["plan_sync"], got["ratio"]) == ("top_k", 0.5)
        assert math.isfinite(got["loss"])


def test_bad_uses_are_every_ranks_named_error() -> None:
    """A local method stepped without its optimizer, and a hierarchical all-reduce for replicas
    that share one node: every rank raises InputError naming the problem (none hangs)."""
    for r in results():
        no_opt = r.value["refused"]["no optimizer"]
        assert no_opt["type"] in ("InputError", "PeerError"), no_opt
        assert "pass optimizer= to step()" in no_opt["message"], no_opt
        flat = r.value["refused"]["no hierarchy"]
        assert flat["type"] in ("InputError", "PeerError"), flat
        assert "lie on one node" in flat["message"], flat
