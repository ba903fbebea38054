"""Communication hooks of replicated stages' gradient buckets (csrc/runtime/comm_hook.h).

Real ranks (Gloo, spawned by ``graphpipe.testing.run_ranks``) drive
``_C.GradientBuckets`` directly: arm, a backward on each rank's own data, finish. Each rank
keeps its local gradients (the buckets only write results back in finish) and gathers every
rank's over the default group, so the expected results are computed here independently:

- the default hook gives the exact sum; a Python hook of torch's averaging convention
  (default_hooks.allreduce_hook) gives it too, sees the buckets in index order with ``is_last``
  on the last one only;
- top-k: on each rank, what was sent plus the new residual is the gradient plus the old residual,
  exactly, the sent entries are the k largest, and the result is the sum of what every rank sent;
  ratio 1 is the exact sum; residuals round-trip through state_dict / load_state_dict;
- hierarchical (4 ranks as 2 nodes of 2) equals the flat sum; groups that do not fit raise on
  every rank;
- torch's PowerSGD through python_comm_hook: exact sums while it still runs vanilla all-reduce,
  then compressed results and fewer bytes; fp16 compression within fp16 tolerance;
- traffic is measured by the counting group and checked against what each algorithm hands over,
  computed here from the parameters' shapes.

Bucket layout (runtime/gradient_buckets.h): reverse registration order, a new bucket when the
open one holds >= bucket_bytes; with bucket_bytes=1 every parameter is its own bucket.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from graphpipe.testing import run_ranks

TIMEOUT = 30.0


def _model() -> torch.nn.Module:
    # An odd width (11) gives odd bucket sizes, which the hierarchical hook must pad.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 11), torch.nn.Tanh(), torch.nn.Linear(11, 8))


def _backward(model: torch.nn.Module, rank: int, iteration: int) -> list[torch.Tensor]:
    """A backward on this rank's data of this iteration; this rank's local gradients."""
    g = torch.Generator().manual_seed(1000 * iteration + rank)
    x = torch.randn(5, 16, generator=g)
    for p in model.parameters():
        p.grad = None
    (model(x) ** 2).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def _gather(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Every rank's copy of `tensors` (over the default group), by rank."""
    import torch.distributed as dist

    world = dist.get_world_size()
    out: list[list[torch.Tensor]] = [[] for _ in range(world)]
    for t in tensors:
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t.contiguous())
        for r in range(world):
            out[r].append(parts[r])
    return out


def _sum(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    total = [t.clone() for t in per_rank[0]]
    for tensors in per_rank[1:]:
        for acc, t in zip(total, tensors):
            acc += t
    return total


def _iteration(model: torch.nn.Module, buckets: Any, rank: int, iteration: int) -> tuple[list, list]:
    """(local gradients, synchronised gradients) of one iteration through `buckets`."""
    buckets.arm()
    local = _backward(model, rank, iteration)
    buckets.finish()
    return local, [p.grad.detach().clone() for p in model.parameters()]


def _check(results: list) -> list:
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    return [r.value for r in results]


# ---- default hook and torch's averaging convention ------------------------------------------
def _default_and_python_allreduce(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from graphpipe import _C

    model = _model()
    params = list(model.parameters())
    group = dist.new_group(list(range(world)))
    buckets = _C.GradientBuckets(params, group, TIMEOUT, 1.0)
    assert buckets.num_buckets == len(params)
    assert buckets.hook.name == "all_reduce" and buckets.hook.convention == "sum"
    for it in range(2):
        local, synced = _iteration(model, buckets, rank, it)
        expected = _sum(_gather(local))
        for got, want in zip(synced, expected):
            assert torch.equal(got, want), (it, (got - want).abs().max())
    # One all-reduce of each bucket per iteration, counted by the group the hook used.
    assert buckets.collectives == 2 * buckets.num_buckets
    assert buckets.bytes_communicated == 2 * buckets.bytes == 2 * sum(p.numel() * 4 for p in params)
    buckets.reset_traffic()
    assert buckets.bytes_communicated == 0 and buckets.collectives == 0
    del buckets

    # torch's allreduce_hook averages (DDP's convention): handed share x replicas, it sums.
    counted = _C.counting_group(group)
    seen: list[tuple[int, bool]] = []

    def recording_allreduce(state: list, bucket: Any) -> Any:
        state.append((bucket.index(), bucket.is_last()))
        return default_hooks.allreduce_hook(counted, bucket)

    hook = _C.python_comm_hook(seen, recording_allreduce)
    assert hook.convention == "average" and hook.serial
    buckets = _C.GradientBuckets(params, counted, TIMEOUT, 1.0, hook)
    for it in range(2, 4):
        local, synced = _iteration(model, buckets, rank, it)
        for got, want in zip(synced, _sum(_gather(local))):
            assert torch.equal(got, want), (it, (got - want).abs().max())
    n = buckets.num_buckets
    # Buckets run in index order; is_last() only on the last, once per iteration.
    assert seen == [(k, k == n - 1) for k in range(n)] * 2, seen
    assert counted.bytes_communicated == 2 * buckets.bytes and counted.collectives == 2 * n
    return {"buckets": n}


def test_default_hook_sums_exactly_and_torch_averaging_hooks_sum_too() -> None:
    values = _check(run_ranks(_default_and_python_allreduce, 2, timeout=120))
    assert values[0]["buckets"] == 4


# ---- top-k with error feedback ---------------------------------------------------------------
def _topk(rank: int, world: int) -> dict:
    import torch.distributed as dist

    from graphpipe import _C

    model = _model()
    params = list(model.parameters())
    # bucket k holds parameter P - 1 - k alone (bucket_bytes=1)
    layout = list(reversed(params))
    group = dist.new_group(list(range(world)))
    ratio = 0.3
    hook = _C.topk_hook(ratio)
    buckets = _C.GradientBuckets(params, group, TIMEOUT, 1.0, hook)
    assert hook.attached and hook.convention == "sum" and not hook.serial
    ks = [math.ceil(ratio * p.numel()) for p in layout]
    assert [hook.k_for(p.numel()) for p in layout] == ks

    saved: dict[str, torch.Tensor] = {}
    results: list[list[torch.Tensor]] = []
    for it in range(3):
        if it == 2:
            saved = hook.state_dict()
        old = hook.state_dict()
        local, synced = _iteration(model, buckets, rank, it)
        results.append(synced)
        new = hook.state_dict()
        assert sorted(new) == [f"residual.{k}" for k in range(len(layout))]
        grads = {id(p): g for p, g in zip(params, local)}
        sent_by_bucket = []
        for k, p in enumerate(layout):
            grad = grads[id(p)].reshape(-1)
            acc = grad + old.get(f"residual.{k}", torch.zeros_like(grad))
            residual = new[f"residual.{k}"]
            sent = acc - residual
            # Exact error feedback: every entry was either sent whole (residual 0) or kept whole.
            assert torch.equal(sent + residual, acc)
            kept = residual == acc
            assert torch.all(kept | (residual == 0))
            chosen = ~kept
            assert int(chosen.sum()) == ks[k]
            # The sent entries are the k of largest magnitude.
            assert acc[chosen].abs().min() >= acc[kept].abs().max()
            sent_by_bucket.append(sent)
        # The result is the sum of what every rank sent, added in rank order.
        everyone = _gather(sent_by_bucket)
        for k in range(len(layout)):
            expected = torch.zeros_like(everyone[0][k])
            for r in range(world):
                expected += everyone[r][k]
            got = synced[len(params) - 1 - k].reshape(-1)
            assert torch.equal(got, expected), (it, k)
    # One all-gather per bucket of k values (float32) and k positions (int32).
    assert buckets.collectives == 3 * len(layout)
    assert buckets.bytes_communicated == 3 * sum(k * (4 + 4) for k in ks)
    final = hook.state_dict()
    del buckets

    # The residuals round-trip: a fresh hook loaded with iteration 2's state repeats iteration 2.
    fresh = _C.topk_hook(ratio)
    fresh.load_state_dict(saved)
    assert all(torch.equal(fresh.state_dict()[name], saved[name]) for name in saved)
    buckets = _C.GradientBuckets(params, group, TIMEOUT, 1.0, fresh)
    _, again = _iteration(model, buckets, rank, 2)
    assert all(torch.equal(a, b) for a, b in zip(again, results[2]))
    assert all(torch.equal(fresh.state_dict()[name], final[name]) for name in final)
    del buckets

    # ratio 1: everything is sent, the exact sum, nothing left over.
    whole = _C.topk_hook(1.0)
    buckets = _C.GradientBuckets(params, group, TIMEOUT, 1.0, whole)
    local, synced = _iteration(model, buckets, rank, 5)
    for got, want in zip(synced, _sum(_gather(local))):
        assert torch.equal(got, want)
    assert all(int(r.count_nonzero()) == 0 for r in whole.state_dict().values())
    return {}


def test_topk_error_feedback_is_exact_and_its_state_round_trips() -> None:
    _check(run_ranks(_topk, 2, timeout=120))


def test_topk_rejects_bad_ratio_and_bad_state() -> None:
    import graphpipe
    from graphpipe import _C

    for ratio in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(graphpipe.GraphpipeError, match="ratio"):
            _C.topk_hook(ratio)
    hook = _C.topk_hook(0.1)
    with pytest.raises(graphpipe.GraphpipeError, match="unexpected key 'weight'"):
        hook.load_state_dict({"weight": torch.zeros(3)})
    with pytest.raises(graphpipe.GraphpipeError, match="1-D"):
        hook.load_state_dict({"residual.0": torch.zeros(3, 2)})
    with pytest.raises(graphpipe.GraphpipeError, match="no state"):
        _C.all_reduce_hook().load_state_dict({"residual.0": torch.zeros(3)})


# ---- hierarchical all-reduce -----------------------------------------------------------------
def _hierarchical(rank: int, world: int) -> dict:
    import torch.distributed as dist

    import graphpipe
    from graphpipe import _C

    model = _model()
    params = list(model.parameters())
    stage = dist.new_group(list(range(world)))
    # Nodes {0, 1} and {2, 3}; the inter-node groups join the ranks of one local index.
    nodes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    across = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    whole = dist.new_group(list(range(world)))
    intra, inter = nodes[rank // 2], across[rank % 2]
    buckets = _C.GradientBuckets(params, stage, TIMEOUT, 1.0, _C.hierarchical_all_reduce_hook(intra, inter))
    assert buckets.hook.serial and buckets.hook.convention == "sum"
    for it in range(2):
        local, synced = _iteration(model, buckets, rank, it)
        for got, want in zip(synced, _sum(_gather(local))):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # Per bucket of n floats, chunks of c = ceil(n / 2): reduce-scatter of the padded 2c,
    # all-reduce of c across nodes, all-gather of c.
    per_iteration = sum(4 * (2 * c + c + c) for c in (math.ceil(p.numel() / 2) for p in params))
    assert buckets.bytes_communicated == 2 * per_iteration
    assert buckets.collectives == 2 * 3 * len(params)
    del buckets

    errors = {}
    # Inter-node "groups" that are the nodes again: sizes fit (2 x 2), membership does not.
    try:
        _C.GradientBuckets(params, stage, TIMEOUT, 1.0, _C.hierarchical_all_reduce_hook(intra, intra))
    except graphpipe.GraphpipeError as exc:
        errors["membership"] = str(exc)
    # An inter-node group of every rank: 2 x 4 != 4.
    try:
        _C.GradientBuckets(params, stage, TIMEOUT, 1.0, _C.hierarchical_all_reduce_hook(intra, whole))
    except graphpipe.GraphpipeError as exc:
        errors["sizes"] = str(exc)
    return errors


def test_hierarchical_equals_the_flat_sum_and_refuses_groups_that_do_not_fit() -> None:
    values = _check(run_ranks(_hierarchical, 4, timeout=120))
    for errors in values:
        assert "do not factor" in errors.get("membership", ""), errors
        assert "do not fit" in errors.get("sizes", "") and "2 x 4" in errors["sizes"], errors


# ---- torch's Python hooks: PowerSGD and fp16 compression -----------------------------------
def _powersgd_bytes(params: list[torch.nn.Parameter], rank: int, min_rate: float = 2.0) -> int:
    """Bytes PowerSGD hands over for one bucket holding `params` once compressing: an all-reduce
    of the uncompressed tensors, one of the Ps and one of the Qs (torch's _should_compress rule:
    an n x m matrix is compressed when (n + m) r x min_rate < n m)."""
    uncompressed = ps = qs = 0
    for p in params:
        n = p.shape[0]
        m = p.numel() // n
        r = min(n, m, rank)
        if (n + m) * r * min_rate < n * m:
            ps += n * r
            qs += m * r
        else:
            uncompressed += p.numel()
    return 4 * (uncompressed + ps + qs)


def _torch_hooks(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    import graphpipe
    from graphpipe import _C

    model = _model()
    params = list(model.parameters())
    group = dist.new_group(list(range(world)))
    errors = {}
    # A state on another group than the buckets' counting group is refused on every rank.
    for name, state in (("plain", powerSGD_hook.PowerSGDState(process_group=group)), ("none", None)):
        try:
            _C.GradientBuckets(params, group, TIMEOUT, 1.0, _C.python_comm_hook(state, powerSGD_hook.powerSGD_hook))
        except graphpipe.GraphpipeError as exc:
            errors[name] = str(exc)

    # 300-byte buckets: [bias 2, weight 2] and [bias 1, weight 1], so two buckets run in series.
    counted = _C.counting_group(group)
    state = powerSGD_hook.PowerSGDState(process_group=counted, matrix_approximation_rank=1, start_powerSGD_iter=2)
    buckets = _C.GradientBuckets(params, counted, TIMEOUT, 300.0, _C.python_comm_hook(state, powerSGD_hook.powerSGD_hook))
    assert buckets.num_buckets == 2
    w1, b1, w2, b2 = params
    compressed = _powersgd_bytes([b2, w2], 1) + _powersgd_bytes([b1, w1], 1)
    traffic = []
    for it in range(4):
        buckets.reset_traffic()
        local, synced = _iteration(model, buckets, rank, it)
        exact = _sum(_gather(local))
        traffic.append((buckets.bytes_communicated, buckets.collectives))
        if it < 2:  # vanilla all-reduce (averaging) of share x 2: the exact sum
            assert all(torch.equal(g, e) for g, e in zip(synced, exact)), it
            assert traffic[-1] == (buckets.bytes, 2)
        else:  # compressed weights; the biases are all-reduced uncompressed
            assert all(torch.isfinite(g).all() for g in synced)
            assert not torch.equal(synced[0], exact[0]) and not torch.equal(synced[2], exact[2])
            if it == 2:  # exactly: no error feedback yet
                assert torch.equal(synced[1], exact[1]) and torch.equal(synced[3], exact[3])
            else:  # plus the average of the replicas' errors, which is zero up to rounding
                torch.testing.assert_close(synced[1], exact[1], rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(synced[3], exact[3], rtol=1e-5, atol=1e-6)
            assert traffic[-1] == (compressed, 6), (traffic[-1], compressed)
    # is_last() on one bucket per iteration: PowerSGD counted 4 iterations.
    assert state.iter == 4
    del buckets

    counted16 = _C.counting_group(group)
    buckets = _C.GradientBuckets(params, counted16, TIMEOUT, 1.0,
                                 _C.python_comm_hook(counted16, default_hooks.fp16_compress_hook))
    local, synced = _iteration(model, buckets, rank, 7)
    for got, want in zip(synced, _sum(_gather(local))):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3 * float(want.abs().max()))
    assert buckets.bytes_communicated == sum(2 * p.numel() for p in params)
    return {"errors": errors, "traffic": traffic, "compressed": compressed}


def test_torch_powersgd_and_fp16_hooks_run_through_the_buckets() -> None:
    values = _check(run_ranks(_torch_hooks, 2, timeout=120))
    for v in values:
        assert "not the stage's counting group" in v["errors"].get("plain", ""), v["errors"]
        assert "default (world) group" in v["errors"].get("none", ""), v["errors"]
        vanilla, powersgd = v["traffic"][0][0], v["traffic"][-1][0]
        assert powersgd < vanilla / 3, v["traffic"]
