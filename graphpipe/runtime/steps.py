"""The collective part of a step. Training: the executor runs the rank's schedule (through the
stage call), then tied parameters' and replicated stages' gradients are summed, the ranks' loss
parts and non-finite flags are summed in one closing all-reduce, and the optimizer steps (or
every rank skips it alike). Evaluation: the forwards, then the output reaches every rank. Each
is one collective part (``Link.collective``): any failure in it fails the pipeline on every
rank (failure.py).

:class:`Steps` holds what they use, each collaborator for one thing: the pipeline's link (its
executor and groups, and failing together), this rank's stage, where it sits among the ranks,
the step guard (non-finite gradients, nonfinite.py), the fault injector (faults.py) and the
replica check (replica_check.py). It knows nothing of ``Pipeline``, which prepares the batch
and the stage call and hands them over.

Replicated stages: each replica's loss is scaled by its share of the micro-batch's rows, so that
with a mean-reduced loss every replica's gradients are exact shares of the single-process
gradient; the executor sums them over the stage's replicas (runtime/gradient_buckets.h) before
the optimizer steps, and the full-batch loss is the sum of every replica's part."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from graphpipe.errors import InputError
from graphpipe.runtime import microbatch
from graphpipe.runtime.connections import Link
from graphpipe.runtime.failure import Collective
from graphpipe.runtime.faults import Injector
from graphpipe.runtime.measure import SavedActivations
from graphpipe.runtime.nonfinite import StepGuard
from graphpipe.runtime.process_group import Ranks
from graphpipe.runtime.replica_agreement import broadcast_buffers_from_first_replica
from graphpipe.runtime.replica_check import ReplicaCheck
from graphpipe.runtime.stage_call import StageFn
from graphpipe.runtime.stages import LocalStage
from graphpipe.sync import SyncMethod

__all__ = ["Steps", "loss_callback"]


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


def _step_optimizer(optimizer: Any) -> None:
    optimizer.step()
    optimizer.zero_grad()


@dataclass
class Steps:
    """The collective part of one pipeline's steps and evaluations (see the module docstring).

    ``saved``: the activations autograd stashed during the last ``step(record=True)``."""

    link: Link
    local: LocalStage
    ranks: Ranks
    device: torch.device
    sync_method: SyncMethod
    skip_nonfinite: bool
    guard: StepGuard
    faults: Injector
    replicas: ReplicaCheck
    saved: SavedActivations | None = None
    # The stage module's buffers, listed once per module object (DDP lists its module's buffers
    # once, at construction): walking every submodule for them cost 0.3 ms a step on the bench
    # Transformer's captured module. A module swapped in (Pipeline.swap_stage_module) is listed anew.
    _buffers_of: Any = field(default=None, repr=False)
    _buffers: list[torch.Tensor] = field(default_factory=list, repr=False)

    def _replica_buffers(self) -> list[torch.Tensor]:
        module = self.local.module
        if self._buffers_of is not module:
            self._buffers_of, self._buffers = module, list(module.buffers())
        return self._buffers

    def _optimizer_phase(self, step_count: int, body: Callable[[], None]) -> None:
        """The optimizer step (``body``), with the ``optimizer`` faults due (faults.py) first."""
        with self.link.activity("in the optimizer step"):
            self.faults.fire("optimizer", step_count)
            body()

    def run(self, fn: StageFn, losses: list[torch.Tensor], mbs: int, optimizer: Any, scaler: Any, record: bool,
            step_count: int, timings: list[Any]) -> torch.Tensor:
        """Runs step ``step_count`` (the steps done before it) with the stage call ``fn``; returns
        the full-batch loss (float64, every rank's). ``losses`` fills as the output stage
        computes them; ``timings`` gets the executor's per-instruction records."""
        link = self.link
        # link.conn.replica_sync is read where it is used, never kept in a local: after a failure
        # the closed connections drop it, and a kept exception's traceback (this frame) must not
        # hold it, and with it the replicas' group, open.
        if link.conn.replica_sync is not None:
            link.conn.replica_sync.before_step(optimizer)
        # Whether the optimizer waits for every rank's verdict on its gradients (nonfinite.py).
        guarded = optimizer is not None and (self.skip_nonfinite or scaler is not None)
        StepGuard.prime(scaler, self.device)
        check = self.replicas.due(step_count)
        saved_buffers = StepGuard.save_buffers(self.local.module) if guarded or check else []
        divergence: str | None = None
        if link.flight is not None:
            link.flight.step = step_count
        executor = link.executor()
        # part.what: what the step is doing, for the error that names a failure.
        with link.collective("in the pipelined forward and backward") as part:
            self.faults.arm(executor, step_count)
            timings[:] = executor.run(fn, True, record)
            part.what = "summing tied parameters' gradients"
            if link.conn.shared.active:
                link.conn.shared.all_reduce()
            if link.conn.replica_sync is not None:
                begin, end = executor.my_rows(mbs)
                link.conn.replica_sync.after_backward((end - begin) / mbs)
            if check:
                # check_replicas_every: before the optimizer step, so a divergent step never lands.
                part.what = "comparing the replicas before the optimizer step"
                divergence = self.replicas.disagreement(before_step=True)
            if divergence is None:
                return self._finish(part, losses, optimizer, scaler, guarded, saved_buffers, step_count)
        # Every rank found the same divergence in the same exchange: still in step, nothing applied
        # (the forward's buffer updates undone, as for a skipped step).
        StepGuard.restore_buffers(self.local.module, saved_buffers)
        if optimizer is not None:
            optimizer.zero_grad()
        raise InputError(f"Pipeline.step (check_replicas_every={self.replicas.every}): {divergence}; the "
                         "optimizer step was not applied on any rank")

    def _finish(self, part: Collective, losses: list[torch.Tensor], optimizer: Any, scaler: Any, guarded: bool,
                saved_buffers: list[Any], step_count: int) -> torch.Tensor:
        """The rest of a step once the gradients are complete: the closing loss sum, the optimizer
        step (or every rank skips it alike) and the replicas' sync; ``part.what`` says which."""
        link, module, ranks = self.link, self.local.module, self.ranks
        total = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
        # One closing all-reduce (sum) of [this rank's part of the loss, its non-finite flag]:
        # the loss stage's ranks add their parts, every other rank adds 0. Every rank sends
        # float64 (exact for any float loss): a rank without the output does not know the
        # loss's dtype, and a size mismatch aborts gloo.
        flag = StepGuard.local_flag(module.parameters(), optimizer, scaler) if guarded else 0.0
        buf = torch.stack([total.detach().to(torch.float64).reshape(()).cpu(),
                           torch.tensor(flag, dtype=torch.float64)]).to(self.device)
        if not guarded:  # local work first: the all-reduce waits for peers
            part.what = "in the optimizer step"
            self._optimizer_phase(step_count, lambda: _step_optimizer(optimizer) if optimizer is not None else None)
        output_ranks = self.local.output_ranks
        part.what = (f"in the loss sum from rank {output_ranks[0]}" if len(output_ranks) == 1
                     else f"in the loss sum over the loss stage's ranks {output_ranks}")
        if ranks.world_size > 1:  # over one rank the sum is this rank's buffer: no gloo round trip
            with link.activity(part.what, ranks.others()):
                dist.all_reduce(buf, group=link.conn.pg)
        if guarded:
            part.what = "in the optimizer step"
            self._optimizer_phase(step_count, lambda: self.guard.finish(bool(buf[1].item() > 0), optimizer, scaler,
                                                                        ranks.rank, module, saved_buffers))
        if link.conn.replica_sync is not None:
            part.what = f"synchronising the replicas of stage {self.local.index} ({self.sync_method.describe()})"
            link.conn.replica_sync.after_optimizer_step()
            broadcast_buffers_from_first_replica(self._replica_buffers(), link.conn.my_replica_group)
        return buf[0]

    def eval(self, make_fn: Callable[[Callable[[int, Any], None]], StageFn], micro_batches: int) -> Any:
        """Runs the forwards with the stage call ``make_fn(on_output)``; returns the merged
        output, on every rank."""
        link, ranks, output_ranks = self.link, self.ranks, self.local.output_ranks
        outputs: dict[int, Any] = {}
        fn = make_fn(outputs.__setitem__)  # the output stage's ranks keep each micro-batch's output
        executor = link.executor()
        with link.collective("in eval_forward"):
            with torch.no_grad():
                executor.run(fn, False, False)
            mine = [outputs[m] for m in range(micro_batches)] if outputs else None
            if len(output_ranks) == 1:
                box = [microbatch.merge(mine) if mine is not None else None]
                if ranks.world_size > 1:  # one rank holds the output already: no pickling round trip
                    dist.broadcast_object_list(box, src=ranks.global_ranks[output_ranks[0]], group=link.conn.pg)
                return box[0]
            # A replicated output stage: every replica holds its rows of each micro-batch.
            parts: list[Any] = [None] * ranks.world_size
            dist.all_gather_object(parts, mine, group=link.conn.pg)
        return microbatch.merge([parts[r][m] for m in range(micro_batches) for r in output_ranks])
