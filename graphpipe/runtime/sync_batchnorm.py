"""``torch.nn.SyncBatchNorm`` inside a replicated stage: statistics over the stage's replicas.

A user who wants BatchNorm to see the whole micro-batch rather than each replica's rows converts
the model as for DDP (``nn.SyncBatchNorm.convert_sync_batchnorm(model)``) and wraps it. ``wrap``
then makes every SyncBatchNorm module a :class:`StageSyncBatchNorm` (the same module, its class
swapped, so names, parameters and buffers stay) and, on a replicated stage, points its
``process_group`` at that stage's replica group: the statistics of each micro-batch are those of
the union of the replicas' rows, exactly BatchNorm over the whole micro-batch. On a stage of one
rank there is nothing to synchronise and it is plain BatchNorm (torch's own fallback for a group
of one).

Why a subclass: torch's SyncBatchNorm runs only on GPUs (its kernels, ``batch_norm_stats`` and
friends, have no CPU implementation, and its forward raises on CPU tensors, also while
``graphpipe.trace`` runs the model once). On GPUs the subclass defers to torch's forward with
the stage's group; on CPU it computes the same statistics with two differentiable sums over the
group (mean, then the centred second moment, which is as stable as BatchNorm's own), whose
backward sums the statistics' gradients over the replicas as torch's backward does.

Buffers (running statistics) are updated from the synchronised statistics, so they agree on
every replica; ``Pipeline.step`` still re-broadcasts them from the first replica after the step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["StageSyncBatchNorm", "adopt_sync_batchnorm", "bind_sync_batchnorm"]


class _SumOverReplicas(torch.autograd.Function):
    """All-reduce (sum) over a group whose backward all-reduces the gradient: the sum's
    derivative with respect to each replica's part is the sum of every replica's upstream
    gradient. (torch.distributed.nn.functional.all_reduce is this, and deprecated.)"""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return _SumOverReplicas.apply(grad, ctx.group), None


class StageSyncBatchNorm(nn.SyncBatchNorm):
    """SyncBatchNorm over a replicated stage's replicas (``process_group``), on CPU and GPU;
    plain BatchNorm where ``process_group`` is None (a stage of one rank) or in evaluation."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        group = self.process_group
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        if group is None or not bn_training or dist.get_world_size(group) == 1:
            return _BatchNorm.forward(self, input)
        if input.device.type != "cpu":
            return super().forward(input)  # torch's kernels, over the stage's group
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        dims = [0, *range(2, input.dim())]
        channels = input.shape[1]
        shape = [1, channels] + [1] * (input.dim() - 2)
        local = torch.cat([input.sum(dims), input.new_full((1,), input.numel() // channels)])
        total = _SumOverReplicas.apply(local, group)
        count = total[channels]
        mean = total[:channels] / count
        centred = input - mean.reshape(shape)
        var = _SumOverReplicas.apply((centred * centred).sum(dims), group) / count
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.training and self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                n = float(count)
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return out


def adopt_sync_batchnorm(model: nn.Module) -> bool:
    """Makes every ``nn.SyncBatchNorm`` of ``model`` a :class:`StageSyncBatchNorm` without a group
    (plain BatchNorm until :func:`bind_sync_batchnorm`), so that tracing runs on CPU. Returns
    whether there was any."""
    found = False
    for m in model.modules():
        if isinstance(m, nn.SyncBatchNorm):
            if type(m) is not StageSyncBatchNorm:
                m.__class__ = StageSyncBatchNorm
            m.process_group = None
            found = True
    return found


def bind_sync_batchnorm(module: nn.Module, replica_group: Any) -> int:
    """Points the SyncBatchNorm modules of a stage's module at its replica group (None: a stage of
    one rank). Returns how many there are."""
    n = 0
    for m in module.modules():
        if isinstance(m, StageSyncBatchNorm):
            m.process_group = replica_group
            n += 1
    return n
