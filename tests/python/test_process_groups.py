"""The pipeline's own process group (graphpipe/runtime/process_group.py): ranks always agree on it.

- Many pipelines in one process, with process groups that only some ranks belong to created in
  between (what benchmarks/compare.py does under torchrun, where it once hung): every wrap
  builds, and each trains to single-process training's losses.
- A pipeline over a subgroup of the world trains like single-process training.
- A subgroup pipeline whose ranks hold different numbers of process groups (torch would name
  its group differently on each) fails on every rank with an error that says so, not a hang.
- Tied parameters whose holders are some of the ranks, after uneven groups: their gradient
  group is made by every rank, and training equals one process's.
"""

from __future__ import annotations

from typing import Any

import torch
from test_runtime_gold import LR, make_model, reference

from graphpipe.testing import run_ranks

MODEL = "candle_uno"


def _train(pipe: Any, batches: list) -> list[float]:
    opt = torch.optim.SGD(pipe.parameters(), lr=LR) if list(pipe.parameters()) else None
    losses = []
    for inputs, targets in batches:
        losses.append(float(pipe.step(inputs, targets, optimizer=opt)))
    return losses


def _repeated_worker(rank: int, world: int) -> list[list[float]]:
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import default_loss

    runs = []
    for _ in range(4):
        model, example, batches = make_model(MODEL)
        # A group that rank 0 alone belongs to, as torch's pipelining baseline makes for a plan
        # with fewer stages than ranks: rank 0 now holds one more process group than rank 1.
        dist.new_group([0])
        with graphpipe.wrap(model, example, default_loss(MODEL), partitioner="sequential", micro_batches=2,
                            timeout=60) as pipe:
            runs.append(_train(pipe, batches[:2]))
    return runs


def test_repeated_wraps_with_uneven_groups_in_between() -> None:
    results = run_ranks(_repeated_worker, 2, timeout=240)
    assert all(r.ok for r in results), [(r.rank, r.error_type, r.message) for r in results]
    expected = reference(MODEL)["losses"][:2].tolist()
    for r in results:
        assert len(r.value) == 4
        for losses in r.value:
            torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)


def _subgroup_worker(rank: int, world: int, uneven: bool) -> Any:
    import torch.distributed as dist

    import graphpipe
    from graphpipe.models import default_loss

    group = dist.new_group([0, 1])  # every rank of the world calls it; rank 2 is not in it
    if uneven and rank == 0:
        dist.new_group([0], use_local_synchronization=True)
    if rank == 2:
        return None
    model, example, batches = make_model(MODEL)
    pipe = graphpipe.wrap(model, example, default_loss(MODEL), group=group, partitioner="sequential",
                          micro_batches=2, timeout=30)
    losses = _train(pipe, batches)
    params = {f"{pipe.stage}:{k}": v.detach().clone() for k, v in pipe.named_parameters()}
    pipe.close()
    return {"losses": losses, "params": params}


def test_pipeline_over_a_subgroup_trains_like_one_process() -> None:
    results = run_ranks(_subgroup_worker, 3, False, timeout=240)
    assert all(r.ok for r in results), [(r.rank, r.error_type, r.message) for r in results]
    gold = reference(MODEL)
    for r in results[:2]:
        torch.testing.assert_close(torch.tensor(r.value["losses"], dtype=gold["losses"].dtype), gold["losses"],
                                   rtol=1e-5, atol=1e-6)
    seen = 0
    for r in results[:2]:
        for key, value in r.value["params"].items():
            name = key.split(":", 1)[1]
            torch.testing.assert_close(value, gold["params"][name], rtol=1e-5, atol=1e-6)
            seen += 1
    assert seen == len(gold["params"])


def test_subgroup_with_uneven_group_counts_is_refused_on_every_rank() -> None:
    results = run_ranks(_subgroup_worker, 3, True, timeout=120)
    assert results[2].ok
    for r in results[:2]:
        assert not r.ok
        assert r.error_type == "InputError", (r.error_type, r.message)
        assert "name the pipeline's process group" in r.message or "number of process groups" in r.message
        assert r.seconds < 30


def _tied_worker(rank: int, world: int) -> dict[tuple, Any]:
    import torch.distributed as dist
    from test_corpus import train

    out = {}
    for partitioner in ("metis", "sequential"):
        # Rank 0 alone gets one more group before each wrap, so the ranks hold different numbers of
        # process groups when the tied parameters' group (of 2 of the 3 ranks) is made.
        dist.new_group([0])
        out[("tied_embedding", partitioner, "1f1b")] = train("tied_embedding", partitioner, "1f1b")
    return out


def test_tied_parameter_groups_of_some_ranks_after_uneven_groups() -> None:
    # The tied embedding's two users on different stages of a 3-rank plan: its gradient is summed
    # in a group of the ranks that hold it. Made by those ranks alone, torch named that group from
    # each process's group count, and the ranks waited for each other forever (the corpus's
    # tied_embedding at 3 and 4 ranks hung so).
    import test_corpus as tc

    results = run_ranks(_tied_worker, 3, timeout=300)
    assert all(r.ok for r in results), [(r.rank, r.error_type, r.message) for r in results]
    for partitioner in ("metis", "sequential"):
        tc._check_against_reference("tied_embedding", results, ("tied_embedding", partitioner, "1f1b"))
