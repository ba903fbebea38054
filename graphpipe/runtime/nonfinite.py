"""One decision for every stage: a step whose gradients are not finite anywhere is skipped
everywhere.

In one process a NaN or an overflow reaches every gradient, and ``torch.amp.GradScaler`` (or a
Megatron-style check) skips the whole update. In a pipeline each rank holds only its stage's
gradients: a NaN born in the last stage's loss reaches every stage, but an overflow in one
stage's weight gradients does not, and a GradScaler per rank would step the stages that saw none
and skip the one that did, leaving the model half updated and the ranks' loss scales apart. So
each rank computes its own flag (torch's ``_amp_foreach_non_finite_check_and_unscale_``, the
kernel GradScaler uses, or the GradScaler's own ``unscale_``), the flags travel summed with the
loss in the step's one closing all-reduce, and every rank acts on the sum. With a GradScaler the
combined flag is written into its per-optimizer ``found_inf`` before ``scaler.step``, which is what
torch's ``ShardedGradScaler`` does for FSDP; then every rank's scaler skips or steps, and updates
its scale, alike.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from graphpipe.errors import InputError

__all__ = ["StepGuard"]


class StepGuard:
    """Counts and applies the skipped steps of one rank (``Pipeline.skipped_steps``)."""

    def __init__(self) -> None:
        self.skipped_steps = 0
        self._warned = False

    @staticmethod
    def check_arguments(optimizer: Any, scaler: Any) -> None:
        """A scaler steps an optimizer: it needs one."""
        if scaler is not None and optimizer is None:
            raise InputError("step(scaler=...) needs optimizer=: the scaler unscales, steps and skips that optimizer")

    @staticmethod
    def prime(scaler: Any, device: torch.device) -> None:
        """A GradScaler creates its scale on the first ``scale`` call, which only the loss
        stage makes; every other rank's scaler must have one before ``unscale_``."""
        if scaler is not None and scaler.is_enabled():
            scaler.scale(torch.zeros((), device=device))

    @staticmethod
    def local_flag(parameters: Iterable[torch.nn.Parameter], optimizer: Any, scaler: Any) -> float:
        """1.0 when this rank's gradients hold a NaN or an infinity, else 0.0. With a scaler,
        its ``unscale_`` computes that (and unscales the gradients, once per step)."""
        if scaler is not None and scaler.is_enabled():
            scaler.unscale_(optimizer)
            found = _scaler_found_inf(scaler, optimizer)
            return float(sum(float(v.item()) for v in found.values()) > 0)
        by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for p in parameters:
            if p.grad is not None:
                by_device.setdefault((p.grad.device, p.grad.dtype), []).append(p.grad)
        bad = 0.0
        for (device, _), grads in by_device.items():
            # float32 whatever torch's default dtype (the kernel requires it; a model trained with
            # torch.set_default_dtype(torch.float64) would otherwise get float64 flags).
            found = torch.zeros(1, device=device, dtype=torch.float32)
            # Multiplies by 1.0 in place: the values stay exactly as they were.
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found,
                                                              torch.ones(1, device=device, dtype=torch.float32))
            bad = max(bad, float(found.item()))
        return bad

    @staticmethod
    def save_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
        """Copies of the buffers the forward is about to update (BatchNorm's running statistics),
        so that a skipped step leaves them as they were: a NaN sample would poison them."""
        return [b.detach().clone() for b in module.buffers()]

    @staticmethod
    def restore_buffers(module: torch.nn.Module, saved_buffers: list[torch.Tensor]) -> None:
        """Puts back the buffers :meth:`save_buffers` copied (a step that does not land)."""
        with torch.no_grad():
            for buffer, saved in zip(module.buffers(), saved_buffers):
                buffer.copy_(saved)

    def finish(self, any_bad: bool, optimizer: Any, scaler: Any, rank: int, module: torch.nn.Module,
               saved_buffers: list[torch.Tensor]) -> bool:
        """Steps or skips ``optimizer`` on the combined verdict (the same on every rank) and
        zeroes the gradients; a skipped step also restores ``module``'s buffers from
        ``saved_buffers``. Returns whether it stepped."""
        if scaler is not None and scaler.is_enabled():
            for found in _scaler_found_inf(scaler, optimizer).values():
                found.fill_(1.0 if any_bad else 0.0)
            scaler.step(optimizer)
            scaler.update()
        elif not any_bad:
            optimizer.step()
        if any_bad:
            self.restore_buffers(module, saved_buffers)
            self.skipped_steps += 1
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"graphpipe (rank {rank}): a gradient was NaN or infinite on some stage, so every rank skipped "
                    "this optimizer step (counted in Pipeline.skipped_steps; warned once)", RuntimeWarning,
                    stacklevel=3)
        optimizer.zero_grad()
        return not any_bad


def _scaler_found_inf(scaler: Any, optimizer: Any) -> dict[Any, torch.Tensor]:
    """The GradScaler's found-inf tensors for ``optimizer`` (one per device), after
    ``unscale_``; a rank whose stage has no gradient gets one, so ``scaler.step`` has a
    verdict to read."""
    state = scaler._per_optimizer_states[id(optimizer)]
    found = state["found_inf_per_device"]
    if not found:
        found[torch.device("cpu")] = torch.zeros(1, dtype=torch.float32)
    return found
