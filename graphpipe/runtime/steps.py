"""The collective part of a step. Training: the executor runs the rank's schedule (through the
stage call), then tied parameters' and replicated stages' gradients are summed, the ranks' loss
parts and non-finite flags are summed in one closing all-reduce, and the optimizer steps (or
every rank skips it alike). Evaluation: the forwards, then the output reaches every rank. Any
failure fails the pipeline on every rank (failure.py).

Replicated stages: each replica's loss is scaled by its share of the micro-batch's rows, so that
with a mean-reduced loss every replica's gradients are exact shares of the single-process
gradient; the executor sums them over the stage's replicas (runtime/gradient_buckets.h) before
the optimizer steps, and the full-batch loss is the sum of every replica's part."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from graphpipe.errors import InputError
from graphpipe.runtime import faults, microbatch
from graphpipe.runtime.nonfinite import StepGuard
from graphpipe.runtime.replica_agreement import broadcast_buffers_from_first_replica
from graphpipe.runtime.stage_call import StageFn

if TYPE_CHECKING:
    from graphpipe.runtime.pipeline import Pipeline

__all__ = ["loss_callback", "run_eval", "run_step"]


def loss_callback(loss_fn: Callable[[Any, Any], torch.Tensor], targets: list[Any], share: float, micro_batches: int,
                  scaler: Any, losses: list[torch.Tensor]) -> Callable[[int, Any], torch.Tensor]:
    """The output stage's ``on_output``: micro-batch ``m``'s loss, scaled by 1/micro_batches
    (and by a replica's share of the rows, so that the replicas' losses add up to the
    micro-batch's), recorded in ``losses`` and returned (through ``scaler``) for the backward."""
    def on_output(m: int, output: Any) -> torch.Tensor:
        loss = loss_fn(output, targets[m])
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise InputError("loss_fn must return a scalar tensor")
        scaled = loss * share / micro_batches if share != 1.0 else loss / micro_batches
        losses.append(scaled.detach())
        return scaler.scale(scaled) if scaler is not None else scaled

    return on_output


def _activity(pipe: Pipeline, what: str, peers: list[int] | None = None) -> Any:
    """What this rank does outside the executor, for its peers to see (flight.py)."""
    flight = getattr(pipe, "_flight", None)
    return flight.activity(what, peers) if flight is not None else contextlib.nullcontext()


def _optimizer_phase(pipe: Pipeline, body: Callable[[], None]) -> None:
    """The optimizer step (``body``), with the ``optimizer`` faults due (faults.py) first."""
    with _activity(pipe, "in the optimizer step"):
        faults.fire(pipe, "optimizer")
        body()


def _step_optimizer(optimizer: Any) -> None:
    optimizer.step()
    optimizer.zero_grad()


def run_step(pipe: Pipeline, fn: StageFn, losses: list[torch.Tensor], mbs: int, optimizer: Any, scaler: Any,
             record: bool) -> torch.Tensor:
    """Runs one step of ``pipe`` with the stage call ``fn``; returns the full-batch loss
    (float64, every rank's). ``losses`` fills as the output stage computes them."""
    conn = pipe._conn
    # conn.replica_sync is read where it is used, never kept in a local: after a failure the
    # closed connections drop it, and a kept exception's traceback (this frame) must not hold
    # it, and with it the replicas' group, open.
    if conn.replica_sync is not None:
        conn.replica_sync.before_step(optimizer)
    # Whether the optimizer waits for every rank's verdict on its gradients (nonfinite.py).
    guarded = optimizer is not None and (pipe.skip_nonfinite or scaler is not None)
    StepGuard.prime(scaler, pipe.device)
    saved_buffers = StepGuard.save_buffers(pipe.module) if guarded or pipe._replica_check_due() else []
    # What the step is doing, for the error that names a failure (_finish_step moves it on).
    during = ["in the pipelined forward and backward"]
    divergence: str | None = None
    if getattr(pipe, "_flight", None) is not None:
        pipe._flight.step = pipe.step_count
    try:
        executor = pipe._executor()
        faults.arm(pipe, executor)
        pipe.last_timings = executor.run(fn, True, record)
        during[0] = "summing tied parameters' gradients"
        if conn.shared.active:
            conn.shared.all_reduce()
        if conn.replica_sync is not None:
            begin, end = executor.my_rows(mbs)
            conn.replica_sync.after_backward((end - begin) / mbs)
        if pipe._replica_check_due():
            # check_replicas_every: before the optimizer step, so a divergent step never lands.
            during[0] = "comparing the replicas before the optimizer step"
            divergence = pipe._replica_disagreement(before_step=True)
        if divergence is None:
            return _finish_step(pipe, losses, optimizer, scaler, guarded, saved_buffers, during)
    except BaseException as exc:
        raise pipe._fail(exc, during[0])  # noqa: B904 (_fail sets the cause)
    # Every rank found the same divergence in the same exchange: still in step, nothing applied
    # (the forward's buffer updates undone, as for a skipped step).
    StepGuard.restore_buffers(pipe.module, saved_buffers)
    if optimizer is not None:
        optimizer.zero_grad()
    raise InputError(f"Pipeline.step (check_replicas_every={pipe.check_replicas_every}): {divergence}; the "
                     "optimizer step was not applied on any rank")


def _finish_step(pipe: Pipeline, losses: list[torch.Tensor], optimizer: Any, scaler: Any, guarded: bool,
                 saved_buffers: list[Any], during: list[str]) -> torch.Tensor:
    """The rest of a step once the gradients are complete: the closing loss sum, the optimizer
    step (or every rank skips it alike) and the replicas' sync; ``during[0]`` says which."""
    conn = pipe._conn
    total = torch.stack(losses).sum() if losses else torch.zeros((), device=pipe.device)
    # One closing all-reduce (sum) of [this rank's part of the loss, its non-finite flag]:
    # the loss stage's ranks add their parts, every other rank adds 0. Every rank sends
    # float64 (exact for any float loss): a rank without the output does not know the
    # loss's dtype, and a size mismatch aborts gloo.
    flag = StepGuard.local_flag(pipe.module.parameters(), optimizer, scaler) if guarded else 0.0
    buf = torch.stack([total.detach().to(torch.float64).reshape(()).cpu(),
                       torch.tensor(flag, dtype=torch.float64)]).to(pipe.device)
    if not guarded:  # local work first: the all-reduce waits for peers
        during[0] = "in the optimizer step"
        _optimizer_phase(pipe, lambda: _step_optimizer(optimizer) if optimizer is not None else None)
    during[0] = (f"in the loss sum from rank {pipe.output_rank}" if len(pipe.output_ranks) == 1
                 else f"in the loss sum over the loss stage's ranks {pipe.output_ranks}")
    if pipe.world_size > 1:  # over one rank the sum is this rank's buffer: no gloo round trip
        with _activity(pipe, during[0], [r for r in range(pipe.world_size) if r != pipe.rank]):
            dist.all_reduce(buf, group=conn.pg)
    if guarded:
        during[0] = "in the optimizer step"
        _optimizer_phase(pipe, lambda: pipe._guard.finish(bool(buf[1].item() > 0), optimizer, scaler, pipe.rank,
                                                          pipe.module, saved_buffers))
    if conn.replica_sync is not None:
        during[0] = f"synchronising the replicas of stage {pipe.stage} ({pipe.sync_method.describe()})"
        conn.replica_sync.after_optimizer_step()
        broadcast_buffers_from_first_replica(pipe.module, conn.my_replica_group)
    return buf[0]


def run_eval(pipe: Pipeline, make_fn: Callable[[Callable[[int, Any], None]], StageFn]) -> Any:
    """Runs the forwards of ``pipe`` with the stage call ``make_fn(on_output)``; returns the
    merged output, on every rank."""
    conn = pipe._conn
    outputs: dict[int, Any] = {}
    fn = make_fn(outputs.__setitem__)  # the output stage's ranks keep each micro-batch's output
    try:
        with torch.no_grad():
            pipe._executor().run(fn, False, False)
        mine = [outputs[m] for m in range(pipe.num_micro_batches)] if outputs else None
        if len(pipe.output_ranks) == 1:
            box = [microbatch.merge(mine) if mine is not None else None]
            if pipe.world_size > 1:  # one rank holds the output already: no pickling round trip
                dist.broadcast_object_list(box, src=pipe._global_ranks[pipe.output_rank], group=conn.pg)
            return box[0]
        # A replicated output stage: every replica holds its rows of each micro-batch.
        parts: list[Any] = [None] * pipe.world_size
        dist.all_gather_object(parts, mine, group=conn.pg)
    except BaseException as exc:
        raise pipe._fail(exc, "in eval_forward")  # noqa: B904 (_fail sets the cause)
    return microbatch.merge([parts[r][m] for m in range(pipe.num_micro_batches) for r in pipe.output_ranks])
