"""DCP checkpoints (graphpipe/runtime/checkpoint.py): ``Pipeline.save`` / ``Pipeline.load``.

- Gold: K steps, save, M more steps == K steps, save, fresh processes load, M steps: parameters,
  buffers, optimizer state and sync state bit-identical on every rank, for Adam and SGD with
  momentum, on a plan with replicated stages (2 stages x 2 replicas, BatchNorm in the replicated
  stage), with all-reduce, QSR (saved in the middle of a local round) and TopK (residuals).
- Another plan: a checkpoint saved by 4 ranks (2 x 2 replicas) loads into 2 ranks under the
  sequential partitioner and into the plain single-process model (``load_into_model``), Adam's
  state included: the next two losses agree to 1e-6. ``model_state_dict`` (one process) equals
  ``full_state_dict`` (gathered), and torch's ``dcp_to_torch_save`` reads the folder.
- Bad checkpoints (another model's, a missing shard, a missing folder, a truncated shard, a
  damaged metadata file): the same named ``InputError`` on every rank, nothing changed on any
  rank, and the pipeline still trains and loads a good checkpoint afterwards.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch
from test_replicated_stages import replicated_plan
from test_runtime_gold import make_model as make_bench_model
from torch import nn

from graphpipe.testing import run_cases, run_ranks

K, M = 2, 3
BATCH, MICRO_BATCHES, LR = 8, 2, 0.05
#: (optimizer, sync method): the gold cases, each at 4 ranks as 2 stages x 2 replicas.
GOLD_CASES = [("adam", "allreduce"), ("momentum", "allreduce"), ("momentum", "qsr"), ("adam", "topk")]


class Net(nn.Module):
    """A small MLP with a BatchNorm (buffers that each replica updates from its own rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.norm = nn.BatchNorm1d(32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.norm(self.fc2(torch.relu(self.fc1(x))))))


def _net_and_batches() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(7)
    model = Net()
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(BATCH, 16, generator=g), torch.randint(0, 4, (BATCH,), generator=g))
               for _ in range(K + M)]
    return model, batches


def _sync(name: str) -> Any:
    from graphpipe.sync import QSR, TopK

    # QSR at lr 0.05: rounds of floor((0.12 / 0.05)^2) = 5 steps, so step K is inside one.
    return {"allreduce": "allreduce", "qsr": QSR(base_period=1, alpha=0.12), "topk": TopK(0.25)}[name]


def _optimizer(name: str, params: list[nn.Parameter]) -> torch.optim.Optimizer | None:
    if not params:
        return None
    if name == "adam":
        return torch.optim.Adam(params, lr=LR)
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def _gold_pipe(sync: str) -> tuple[Any, list]:
    import graphpipe
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    model, batches = _net_and_batches()
    example = (batches[0][0],)
    graph = trace_module(model, example).graph
    plan = manual_plan(graph, {"fc1": 0, "fc2": 1, "norm": 1, "fc3": 1}, MICRO_BATCHES,
                       stage_devices=[[0, 1], [2, 3]])
    pipe = graphpipe.wrap(model, example, nn.functional.cross_entropy, plan=plan, timeout=60, sync=_sync(sync))
    return pipe, batches


def _snapshot(pipe: Any, optimizer: Any) -> dict[str, Any]:
    return {"state": {k: v.detach().clone() for k, v in pipe.state_dict().items()},
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "sync": pipe.sync_state_dict(), "step_count": pipe.step_count}


def gold_case(opt_name: str, sync: str, folder: str, resume: bool) -> dict[str, Any]:
    """``resume=False``: K steps, save, M steps. ``resume=True``: load, the same M steps."""
    pipe, batches = _gold_pipe(sync)
    with pipe:
        optimizer = _optimizer(opt_name, list(pipe.parameters()))
        if resume:
            extra = pipe.load(folder, optimizer=optimizer)
            assert extra == {"data_position": K}, extra
        else:
            for inputs, targets in batches[:K]:
                pipe.step(inputs, targets, optimizer=optimizer)
            pipe.save(folder, optimizer=optimizer, extra={"data_position": K})
        losses = [float(pipe.step(x, y, optimizer=optimizer)) for x, y in batches[K:]]
        return {"losses": losses, **_snapshot(pipe, optimizer)}


def _gold_worker(rank: int, world: int, root: str, resume: bool) -> dict[tuple, Any]:
    return run_cases(gold_case, [(o, s, os.path.join(root, f"{o}-{s}"), resume) for o, s in GOLD_CASES])


def _ok(results: list[Any]) -> list[Any]:
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return [r.value for r in results]


def _assert_identical(a: Any, b: Any, where: str) -> None:
    """Bit-identical nested state (tensors, dicts, lists, scalars)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: differs by {float((a.double() - b.double()).abs().max())}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(map(str, a)) == sorted(map(str, b)), f"{where}: {list(a)} vs {list(b)}"
        for k in a:
            _assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


@pytest.fixture(scope="module")
def gold(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Any]]:
    root = str(tmp_path_factory.mktemp("dcp-gold"))
    straight = _ok(run_ranks(_gold_worker, 4, root, False, timeout=300))
    resumed = _ok(run_ranks(_gold_worker, 4, root, True, timeout=300))
    return straight, resumed


@pytest.mark.parametrize("opt_name,sync", GOLD_CASES, ids=["-".join(c) for c in GOLD_CASES])
def test_resume_is_bit_identical(gold: tuple[list[Any], list[Any]], opt_name: str, sync: str) -> None:
    straight, resumed = gold
    for rank, (a, b) in enumerate(zip(straight, resumed)):
        got_a = next(v for k, v in a.items() if k[:2] == (opt_name, sync))
        got_b = next(v for k, v in b.items() if k[:2] == (opt_name, sync))
        assert "error" not in got_a, f"rank {rank}: {got_a['error']}"
        assert "error" not in got_b, f"rank {rank}: {got_b['error']}"
        assert got_a["losses"] == got_b["losses"], f"rank {rank}: {got_a['losses']} vs {got_b['losses']}"
        for part in ("state", "optimizer", "sync", "step_count"):
            _assert_identical(got_a[part], got_b[part], f"rank {rank} {opt_name}/{sync} {part}")


def _idle_rank_worker(rank: int, world: int, folder: str, resume: bool) -> dict[str, Any]:
    """One stage on ranks 0 and 1; rank 2 has no stage (as a replicated plan that uses fewer
    devices than ranks leaves one) and still builds its optimizer over ``pipe.parameters()``."""
    import graphpipe
    from graphpipe.runtime.plan import manual_plan
    from graphpipe.trace import trace_module

    model, batches = _net_and_batches()
    example = (batches[0][0],)
    plan = manual_plan(trace_module(model, example).graph, {"fc1": 0, "fc2": 0, "norm": 0, "fc3": 0},
                       MICRO_BATCHES, stage_devices=[[0, 1]])
    with graphpipe.wrap(model, example, nn.functional.cross_entropy, plan=plan, timeout=60) as pipe:
        optimizer = _optimizer("sgd", list(pipe.parameters()))
        if resume:
            pipe.load(folder, optimizer=optimizer)
        else:
            for inputs, targets in batches[:K]:
                pipe.step(inputs, targets, optimizer=optimizer)
            pipe.save(folder, optimizer=optimizer)
        losses = [float(pipe.step(x, y, optimizer=optimizer)) for x, y in batches[K:]]
        return {"losses": losses, **_snapshot(pipe, optimizer)}


def test_a_rank_without_a_stage_saves_and_loads(tmp_path: Any) -> None:
    """A rank without a stage holds only the placeholder parameter, which no rank saves: it
    loads all the same (it used to refuse, naming the placeholder's missing learning rate),
    and the resumed run equals the uninterrupted one."""
    folder = str(tmp_path / "idle")
    straight = _ok(run_ranks(_idle_rank_worker, 3, folder, False, timeout=240))
    resumed = _ok(run_ranks(_idle_rank_worker, 3, folder, True, timeout=240))
    for rank, (a, b) in enumerate(zip(straight, resumed)):
        assert a["losses"] == b["losses"], f"rank {rank}"
        for part in ("state", "optimizer", "step_count"):
            _assert_identical(a[part], b[part], f"rank {rank} {part}")


def test_replicas_write_one_copy(gold: tuple[list[Any], list[Any]], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every model entry is stored once although two replicas hold it; each rank's sync record
    under its own key."""
    import torch.distributed.checkpoint as dcp

    folder = next(p for p in tmp_path_factory.getbasetemp().glob("dcp-gold*/adam-topk"))
    entries = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    model, _ = _net_and_batches()
    assert sorted(k[len("model."):] for k in entries if k.startswith("model.")) == sorted(model.state_dict())
    for key, md in entries.items():
        if key.startswith("model."):
            assert len(md.chunks) == 1, key
    assert sorted(k for k in entries if k.startswith("sync.")) == [f"sync.rank{r}" for r in range(4)]


# ---- another plan -----------------------------------------------------------------------------
NAME = "mmt"


def _bench_loss() -> Any:
    from graphpipe.models import default_loss

    return default_loss(NAME)


def _other_plan_worker(rank: int, world: int, folder: str, save: bool) -> dict[str, Any]:
    """4 ranks (2 x 2 replicas), K Adam steps, save, the next two losses; or 2 ranks under the
    sequential partitioner: load, the next two losses."""
    import graphpipe

    model, example, batches = make_bench_model(NAME)
    batches = batches + [batches[0], batches[1]]  # make_model gives 3 batches: K + 2 = 4 needed
    if save:
        plan = replicated_plan(model, example, [[0, 1], [2, 3]], "sequential")
        pipe = graphpipe.wrap(model, example, _bench_loss(), plan=plan, timeout=60)
    else:
        pipe = graphpipe.wrap(model, example, _bench_loss(), partitioner="sequential", micro_batches=2, timeout=60)
    with pipe:
        params = list(pipe.parameters())
        optimizer = torch.optim.Adam(params, lr=0.01) if params else None
        if save:
            for x, y in batches[:K]:
                pipe.step(x, y, optimizer=optimizer)
            pipe.save(folder, optimizer=optimizer)
            full = pipe.full_state_dict()
        else:
            pipe.load(folder, optimizer=optimizer)
            full = None
        losses = [float(pipe.step(x, y, optimizer=optimizer)) for x, y in batches[K:K + 2]]
        return {"losses": losses, "full": full}


def test_resume_on_another_plan_and_the_plain_model(tmp_path: Any) -> None:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from graphpipe.runtime.checkpoint import load_into_model, model_state_dict

    folder = str(tmp_path / "ckpt")
    at4 = _ok(run_ranks(_other_plan_worker, 4, folder, True, timeout=240))
    at2 = _ok(run_ranks(_other_plan_worker, 2, folder, False, timeout=240))
    expected = at4[0]["losses"]
    for r in at2:
        assert r["losses"] == pytest.approx(expected, abs=1e-6, rel=0), (r["losses"], expected)

    # One process, no process group: the plain model and its Adam.
    model, _, batches = make_bench_model(NAME)
    batches = batches + [batches[0], batches[1]]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    load_into_model(model, folder, optimizer=optimizer)
    losses = []
    for x, y in batches[K:K + 2]:
        optimizer.zero_grad()
        loss = _bench_loss()(model(*x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses == pytest.approx(expected, abs=1e-6, rel=0), (losses, expected)

    # The gathered state == the one read on one process == torch's own conversion.
    full = at4[0]["full"]
    alone = model_state_dict(folder)
    assert list(alone) == list(full)
    for k in full:
        assert torch.equal(alone[k], full[k]), k
    dcp_to_torch_save(folder, str(tmp_path / "whole.pt"))
    whole = torch.load(str(tmp_path / "whole.pt"), weights_only=False)
    for k in full:
        assert torch.equal(whole["model"][k], full[k]), k


# ---- bad checkpoints --------------------------------------------------------------------------
BAD = ["another model", "missing shard", "missing folder", "truncated shard", "damaged metadata"]


def _bad_worker(rank: int, world: int, root: str) -> dict[str, Any]:
    """Saves a good checkpoint and another model's, damages copies of the good one (rank 0), and
    loads each bad one: the error on this rank, and whether anything changed."""
    import torch.distributed as dist
    from test_runtime_pipeline import hand_plan

    import graphpipe

    other, other_example, _ = make_bench_model("dlrm")
    from graphpipe.models import default_loss

    with graphpipe.wrap(other, other_example, default_loss("dlrm"), plan=hand_plan(other, other_example, world),
                        timeout=60) as pipe:
        pipe.save(os.path.join(root, "another model"))
    model, example, batches = make_bench_model(NAME)
    pipe = graphpipe.wrap(model, example, _bench_loss(), plan=hand_plan(model, example, world), timeout=60)
    with pipe:
        optimizer = torch.optim.SGD(list(pipe.parameters()), lr=LR, momentum=0.9)
        pipe.step(*batches[0], optimizer=optimizer)
        good = os.path.join(root, "good")
        pipe.save(good, optimizer=optimizer)
        pipe.step(*batches[1], optimizer=optimizer)  # now differs from the checkpoint
        if rank == 0:
            for what in BAD[1:]:
                if what != "missing folder":
                    shutil.copytree(good, os.path.join(root, what))
            os.remove(os.path.join(root, "missing shard", "__1_0.distcp"))
            shard = os.path.join(root, "truncated shard", "__0_0.distcp")
            os.truncate(shard, os.path.getsize(shard) // 2)
            meta = os.path.join(root, "damaged metadata", ".metadata")
            os.truncate(meta, os.path.getsize(meta) // 3)
        dist.barrier()
        out: dict[str, Any] = {}
        for what in BAD:
            before = _snapshot(pipe, optimizer)
            try:
                pipe.load(os.path.join(root, what), optimizer=optimizer)
                out[what] = {"error": None}
            except Exception as exc:
                out[what] = {"error": type(exc).__name__, "message": str(exc)}
            after = _snapshot(pipe, optimizer)
            try:
                _assert_identical(before, after, what)
                out[what]["unchanged"] = True
            except AssertionError as exc:
                out[what]["unchanged"] = str(exc)
        # Still in step and usable: a good checkpoint loads, training goes on.
        pipe.load(good, optimizer=optimizer)
        out["after"] = float(pipe.step(*batches[1], optimizer=optimizer))
        return out


def test_bad_checkpoints_are_input_errors_on_every_rank(tmp_path: Any) -> None:
    from graphpipe.runtime.checkpoint import load_into_model

    results = _ok(run_ranks(_bad_worker, 3, str(tmp_path), timeout=240))
    hints = {"another model": "another model", "missing shard": "missing or damaged",
             "missing folder": "does not exist", "truncated shard": "missing or damaged",
             "damaged metadata": "metadata"}
    for what in BAD:
        messages = {r[what].get("message") for r in results}
        for rank, r in enumerate(results):
            assert r[what]["error"] == "InputError", (rank, what, r[what])
            assert hints[what] in r[what]["message"], (rank, what, r[what]["message"])
            assert r[what]["unchanged"] is True, (rank, what, r[what]["unchanged"])
        assert len(messages) == 1, (what, messages)  # the same verdict everywhere
    assert len({r["after"] for r in results}) == 1

    # The plain model refuses them the same way, and stays as it was.
    model, _, _ = make_bench_model(NAME)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for what in BAD:
        with pytest.raises(Exception) as info:
            load_into_model(model, str(tmp_path / what))
        assert type(info.value).__name__ == "InputError", (what, info.value)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
