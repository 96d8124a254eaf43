"""``SyncBatchNorm``: batch normalisation over the union of every rank's batch.

Contract: in training, each rank's output, input gradient and the running
statistics equal those of one ``torch.nn.BatchNorm`` over the concatenation of
all ranks' batches (up to float rounding); weight and bias gradients are the
rank's own share (the data-parallel algorithm reduces them, as for any other
parameter). In eval mode with running statistics, or alone in its group, it is
a plain local BatchNorm. Works on CPU (Gloo), where ``torch.nn.SyncBatchNorm``
refuses to run; CUDA inputs take the same path on a NCCL group.

Communication goes through Bagua's collectives: forward allgathers each rank's
(count, mean, sum of squared deviations) and combines them exactly (Chan's
formula, so ranks with empty batches and large means are fine); backward
allreduces the two per-channel sums the input gradient needs. Every rank must
call forward and backward in the same order (they are collectives).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import bagua_core
from bagua_core.process_group import ProcessGroup
from bagua_torch import communication as comm

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _per_channel(x: torch.Tensor) -> torch.Tensor:
    """(N, C, *) as (C, N * prod(*)) in the statistics dtype."""
    return x.transpose(0, 1).reshape(x.shape[1], -1).to(_stats_dtype(x))


def _channel_shape(x: torch.Tensor):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, group):
        xc = _per_channel(x)
        channels, local_n = xc.shape
        local_mean = xc.mean(dim=1) if local_n else xc.new_zeros(channels)
        local_m2 = (xc - local_mean[:, None]).square().sum(dim=1)
        mine = torch.cat([xc.new_full((1,), float(local_n)), local_mean, local_m2])
        every = comm.allgather(mine.contiguous(), comm=group)  # (world, 1 + 2C)
        counts, means, m2s = every[:, :1], every[:, 1 : 1 + channels], every[:, 1 + channels :]
        n = counts.sum()
        if n.item() == 0:
            raise ValueError("SyncBatchNorm got an empty batch on every rank")
        mean = (counts * means).sum(dim=0) / n
        m2 = m2s.sum(dim=0) + (counts * (means - mean).square()).sum(dim=0)
        var = m2 / n
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = m2 / (n - 1) if n.item() > 1 else var
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = _channel_shape(x)
        xhat = (x.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.to(mean.dtype).view(shape) + bias.to(mean.dtype).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd, n)
        ctx.group = group
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, invstd, n = ctx.saved_tensors
        shape = _channel_shape(x)
        dyc, xc = _per_channel(dy), _per_channel(x)
        xmu = xc - mean[:, None]
        sums = torch.cat([dyc.sum(dim=1), (dyc * xmu).sum(dim=1)])
        local_sum_dy_xmu = sums[mean.numel() :].clone()
        local_sum_dy = sums[: mean.numel()].clone()
        if ctx.needs_input_grad[0]:
            comm.allreduce_inplace(sums, comm=ctx.group)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            mean_dy = sums[: mean.numel()] / n
            mean_dy_xmu = sums[mean.numel() :] / n
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_x = (
                dy.to(mean.dtype)
                - mean_dy.view(shape)
                - (x.to(mean.dtype) - mean.view(shape)) * (invstd * invstd * mean_dy_xmu).view(shape)
            )
            grad_x = (grad_x * scale.view(shape)).to(x.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (local_sum_dy_xmu * invstd).to(weight.dtype)
        if weight is not None and ctx.needs_input_grad[2]:
            grad_b = local_sum_dy.to(weight.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """``torch.nn.BatchNorm{1,2,3}d`` whose training statistics span every rank
    of ``process_group`` (default: Bagua's world group). Input: (N, C, *)."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Optional[ProcessGroup] = None,
        device: Union[torch.device, str, None] = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if process_group is not None and not isinstance(process_group, ProcessGroup):
            raise TypeError(f"process_group must be a bagua_core.ProcessGroup, got {type(process_group).__name__}")
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(
                f"SyncBatchNorm expects an input of at least 2 dimensions (N, C, ...), "
                f"got {input.dim()}-D of shape {tuple(input.shape)}"
            )
        if input.shape[1] != self.num_features:
            raise ValueError(
                f"SyncBatchNorm has {self.num_features} features, the input has {input.shape[1]} channels (dimension 1)"
            )

    def _group(self) -> Optional[ProcessGroup]:
        if self.process_group is not None:
            return self.process_group
        return bagua_core.get_default_group() if bagua_core.is_initialized() else None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or not self.track_running_stats
        group = self._group()
        if not use_batch_stats or group is None or group.size == 1:
            return F.batch_norm(
                input,
                self.running_mean if not self.training or self.track_running_stats else None,
                self.running_var if not self.training or self.track_running_stats else None,
                self.weight,
                self.bias,
                use_batch_stats,
                factor,
                self.eps,
            )
        if not group.is_member:
            raise ValueError("this process is not a member of the SyncBatchNorm's process group")
        update = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if update else None,
            self.running_var if update else None,
            self.eps,
            factor,
            group,
        )


def convert_sync_batchnorm(module: torch.nn.Module, process_group: Optional[ProcessGroup] = None) -> torch.nn.Module:
    """Returns ``module`` with every BatchNorm layer replaced by a
    :class:`SyncBatchNorm` sharing its weight, bias and running statistics
    (call it before ``with_bagua``). A BatchNorm ``module`` itself is returned converted."""
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats, process_group
        )
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group))
    return out
