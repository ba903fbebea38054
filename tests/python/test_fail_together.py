"""One rank's failure is every rank's clear error, fast: no hang, no desync, no crash.

- A rank that raises inside a step (forward, backward, loss, optimizer hook), keeps the
  exception and stays alive past 5 s: every other rank raises PeerError naming it and its
  exception within 5 s, with timeout=300 (so its connections closed at the failure, not when the
  exception or the process went).
- A rank that sees a peer leave names the peer's cause, not "a peer left" (single process).
- A stuck output rank before the loss sum (skip_nonfinite=False): PipelineTimeout at the timeout (5 s here).
- A bad batch after good steps (another feature size, float64, an input missing or extra,
  targets of another dtype or shape): the same InputError on every rank, and the next good step
  gives single-process training's loss.
- A rank whose model or options differ: InputError on every rank inside wrap, within 5 s.
Each test prints the time the survivors took (pytest -s shows it).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from test_runtime_gold import make_model, reference

from graphpipe._ext import _C
from graphpipe.testing import run_ranks

FAILING = 1   # the rank that fails (holds a middle stage of the 3-rank sequential plan)
FAST = 5.0    # seconds within which every survivor must have raised


def _step_failure_worker(rank: int, world: int, where: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    loss_fn = default_loss("candle_uno")
    failing = FAILING
    if where == "loss":
        base = default_loss("candle_uno")

        def loss_fn(output: Any, target: Any) -> torch.Tensor:
            if calls["steps"] == 1:
                raise ValueError("bad loss on purpose")
            return base(output, target)
    pipe = graphpipe.wrap(model, example, loss_fn, partitioner="sequential", micro_batches=4, timeout=300)
    if where == "loss":
        failing = pipe.output_rank
    calls = {"steps": 0}

    class Broken(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:  # type: ignore[override]
            if calls["steps"] == 1:
                raise ValueError("bad optimizer on purpose")
            return super().step(closure)

    kind = Broken if (rank == failing and where == "optimizer") else torch.optim.SGD
    optimizer = kind(pipe.parameters(), lr=0.01) if list(pipe.parameters()) else None
    if rank == failing and where == "forward":
        stage_forward = pipe.module.forward

        def forward(*args: Any) -> Any:
            if calls["steps"] == 1:
                raise ValueError("bad forward on purpose")
            return stage_forward(*args)

        pipe.module.forward = forward
    if rank == failing and where == "backward":
        def hook(grad: torch.Tensor) -> torch.Tensor:
            if calls["steps"] == 1:
                raise ValueError("bad backward on purpose")
            return grad

        next(iter(pipe.parameters())).register_hook(hook)
    out: dict[str, Any] = {"failing": failing}
    kept: list[BaseException] = []
    for k, (inputs, targets) in enumerate(batches):
        calls["steps"] = k
        start = time.monotonic()
        try:
            pipe.step(inputs, targets, optimizer=optimizer)
        except Exception as exc:
            out.update(error=type(exc).__name__, message=str(exc), seconds=time.monotonic() - start)
            kept.append(exc)  # as a logger or a retry loop would: its traceback holds the step's frames
            break
    if rank == failing:
        # Stays alive, the exception kept, past FAST: the others must depend neither on its exit
        # nor on the exception (and the frames that hold the executor) going away.
        time.sleep(FAST + 1.0)
    try:
        pipe.step(*batches[0])
    except Exception as exc:
        out["after"] = (type(exc).__name__, str(exc))
    return out


@pytest.mark.parametrize("where", ["forward", "backward", "loss", "optimizer"])
def test_rank_that_raises_fails_every_rank_fast(where: str) -> None:
    results = run_ranks(_step_failure_worker, 3, where, timeout=120)
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
    failing = results[0].value["failing"]
    times = {}
    for r in results:
        got = r.value
        assert "error" in got, f"rank {r.rank} raised nothing"
        if r.rank == failing:
            assert got["error"] == "ValueError" and "on purpose" in got["message"]
        else:
            assert got["error"] == "PeerError", got
            assert f"rank {failing}: ValueError: bad {where} on purpose" in got["message"], got["message"]
            assert got["seconds"] < FAST, got
            times[r.rank] = round(got["seconds"], 3)
        # afterwards the pipeline refuses to go on, on every rank, naming the failure
        assert got["after"][0] == "InputError" and f"rank {failing}: ValueError" in got["after"][1], got["after"]
    print(f"\n{where}: rank {failing} raised; survivors raised PeerError after {times} s (timeout 300 s)")


def test_a_peer_that_left_is_named_by_its_own_cause() -> None:
    """Gloo closes a timed-out rank's connections inside the collective, before that rank has
    published why: the survivor that sees "connection closed" first must still name the
    timeout, not itself, as the pipeline's failure (what CI once saw: PeerError on rank 0)."""
    import threading

    import torch.distributed as dist

    from graphpipe.runtime.failure import Failure, FailureBoard, Failures

    store = dist.HashStore()
    closed = []
    failures = Failures(FailureBoard(store, rank=0, world=3, timeout=5.0), 5.0, lambda: closed.append(True))
    cause = Failure(1, "PipelineTimeout", "rank 1: timed out after 5 s in the loss sum from rank 2")
    late = threading.Timer(0.3, lambda: FailureBoard(store, 1, 3, 5.0).publish(_C.PipelineTimeout(cause.message)))
    late.start()
    seen = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:23253")
    error = failures.fail(seen, "in the loss sum from rank 2")
    late.join()
    assert closed == [True]
    assert isinstance(error, _C.PipelineTimeout), error
    assert str(error).startswith(f"rank 0: the pipeline failed on {cause}"), str(error)
    assert failures.cause == cause
    # A peer that left without a word (a killed process): after the grace, its own PeerError.
    alone = Failures(FailureBoard(dist.HashStore(), rank=0, world=3, timeout=0.5), 0.5, lambda: None)
    start = time.monotonic()
    error = alone.fail(RuntimeError("Connection closed by peer"), "in the loss sum from rank 2")
    assert type(error) is _C.PeerError and str(error).startswith("rank 0: a peer left in the loss sum"), str(error)
    assert 0.45 < time.monotonic() - start < 2.0


def test_a_failure_crosses_the_store_whole() -> None:
    """The store holds a failure's rank, type and first message line as fields, and a survivor
    reads back the same three, whatever the message holds."""
    from graphpipe.runtime.failure import Failure

    sent = Failure.of(2, _C.PipelineTimeout("rank 2: timed out: a: b\nsecond line"))
    assert sent == Failure(2, "PipelineTimeout", "rank 2: timed out: a: b")
    assert Failure.decode(sent.encode()) == sent
    assert str(sent) == "rank 2: PipelineTimeout: rank 2: timed out: a: b"
    assert str(Failure.of(0, ValueError())) == "rank 0: ValueError"


def _stuck_output_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    # skip_nonfinite=False: the optimizer steps before the step's closing loss sum (with the
    # check on, it steps after it, once every rank's flag is in), so a stuck optimizer stalls it.
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential",
                          micro_batches=4, timeout=FAST, skip_nonfinite=False)

    class Stuck(torch.optim.SGD):
        def step(self, closure: Any = None) -> None:  # type: ignore[override]
            time.sleep(3 * FAST)  # the output rank hangs before the loss sum

    optimizer = Stuck(pipe.parameters(), lr=0.01) if rank == pipe.output_rank else None
    start = time.monotonic()
    try:
        pipe.step(*batches[0], optimizer=optimizer)
    except Exception as exc:
        return {"output_rank": pipe.output_rank, "error": type(exc).__name__, "message": str(exc),
                "seconds": time.monotonic() - start}
    return {"output_rank": pipe.output_rank, "error": None}


def test_stuck_output_rank_times_out_the_loss_sum() -> None:
    results = run_ranks(_stuck_output_worker, 3, timeout=120)
    output_rank = results[0].value["output_rank"]
    times = {}
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        if r.rank == output_rank:
            continue
        got = r.value
        assert got["error"] == "PipelineTimeout", got
        assert "loss sum" in got["message"] and f"rank {output_rank}" in got["message"], got["message"]
        assert FAST * 0.9 < got["seconds"] < FAST + 3.0, got
        times[r.rank] = round(got["seconds"], 2)
    print(f"\nstuck output rank {output_rank}: survivors raised PipelineTimeout after {times} s (timeout {FAST} s)")


# ---- bad batches -------------------------------------------------------------------------------

BAD_BATCHES = ["feature_size", "float64", "missing_input", "extra_input", "target_dtype", "target_shape"]


def _bad_batch_worker(rank: int, world: int) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import default_loss

    model, example, batches = make_model("candle_uno")
    pipe = graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential",
                          micro_batches=4, timeout=60)
    inputs, targets = batches[0]
    first = pipe.step(inputs, targets)  # a good step first
    bad = {
        "feature_size": ((torch.randn(inputs[0].shape[0], inputs[0].shape[1] + 1), *inputs[1:]), targets),
        "float64": ((inputs[0].double(), *inputs[1:]), targets),
        "missing_input": (tuple(inputs[:-1]), targets),
        "extra_input": ((*inputs, inputs[-1]), targets),
        "target_dtype": (inputs, targets.double()),
        "target_shape": (inputs, targets.reshape(targets.shape[0], -1).repeat(1, 2)),
    }
    errors = {}
    for name in BAD_BATCHES:
        try:
            pipe.step(*bad[name])
            errors[name] = None
        except Exception as exc:
            errors[name] = (type(exc).__name__, str(exc))
    second = pipe.step(*batches[1])  # good again: in step, with the right loss
    return {"first": first, "second": second, "errors": errors}


def test_bad_batch_raises_input_error_everywhere_and_training_goes_on() -> None:
    results = run_ranks(_bad_batch_worker, 3, timeout=180)
    ref_model, _, batches = make_model("candle_uno")
    from graphpipe.models import default_loss

    with torch.no_grad():
        expected_second = default_loss("candle_uno")(ref_model(*batches[1][0]), batches[1][1])
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        got = r.value
        torch.testing.assert_close(got["first"], reference("candle_uno")["losses"][0])
        for name in BAD_BATCHES:
            assert got["errors"][name] is not None, f"{name}: accepted"
            assert got["errors"][name][0] == "InputError", (name, got["errors"][name])
        # no optimizer stepped in between, so the model is the initial one: the loss of batch 1
        torch.testing.assert_close(got["second"], expected_second)
    messages = [r.value["errors"] for r in results]
    assert all(m == messages[0] for m in messages), "every rank must raise the same error"
    print("\n" + "\n".join(f"{k}: {v[1]}" for k, v in messages[0].items()))


# ---- ranks that disagree in wrap ---------------------------------------------------------------


def _disagree_worker(rank: int, world: int, what: str) -> dict[str, Any]:
    import graphpipe
    from graphpipe.models import build_model, default_loss

    spec = "candle_uno:batch=8"
    micro_batches = 4
    if rank == 1 and what == "width":
        spec = "candle_uno:batch=8,width=48"
    if rank == 1 and what == "branches":
        spec = "candle_uno:batch=8,branches=3"
    if rank == 1 and what == "micro_batches":
        micro_batches = 2
    torch.manual_seed(0)
    model, example = build_model(spec)
    start = time.monotonic()
    try:
        graphpipe.wrap(model, example, default_loss("candle_uno"), partitioner="sequential",
                       micro_batches=micro_batches, timeout=300)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


@pytest.mark.parametrize("what", ["width", "branches", "micro_batches"])
def test_rank_with_another_model_or_options_fails_wrap_everywhere(what: str) -> None:
    results = run_ranks(_disagree_worker, 3, what, timeout=120)
    times = {}
    for r in results:
        assert r.ok, f"rank {r.rank}: {r.error_type}: {r.message}\n{r.traceback}"
        assert r.value["error"] == "InputError", (r.rank, r.value)
        assert "rank 1" in r.value["message"], r.value["message"]
        times[r.rank] = round(r.value["seconds"], 2)
    slowest_gap = max(times.values()) - min(times.values())
    assert slowest_gap < FAST, times
    print(f"\n{what}: " + "; ".join(f"rank {r.rank}: {r.value['message'][:160]}" for r in results))
