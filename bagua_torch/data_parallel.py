"""``bagua_torch.DistributedDataParallel``: the torch DDP-style way to use Bagua."""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

from bagua_core.process_group import ProcessGroup
from bagua_torch.algorithms.gradient_allreduce import GradientAllReduceAlgorithm
from bagua_torch.distributed import wrap

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.Module):
    """Wraps ``module`` like ``torch.nn.parallel.DistributedDataParallel``,
    communicating with a Bagua algorithm (default: GradientAllReduce).

    Args:
        module: the model (same on every rank; rank 0's state is broadcast).
        optimizers: the optimizers stepping its parameters (their state is
            broadcast, and their ``step`` ends an open communication step).
        algorithm: a :mod:`bagua_torch.algorithms` algorithm or a
            :mod:`bagua_core.algorithms` description.
        process_group: a ``bagua_core.ProcessGroup`` (default: the world group).
        find_unused_parameters: parameters that get no gradient in a backward
            pass are communicated as zeros instead of raising.
        broadcast_buffers: broadcast rank 0's buffers (e.g. BatchNorm running
            statistics) before each training forward.
        gradient_as_bucket_view: gradients (or weights) live in the
            communication buckets (no copies); ``do_flatten`` of ``with_bagua``.
        bucket_cap_mb: bucket size (default: ``BAGUA_BUCKET_SIZE``, 10 MiB).
    """

    def __init__(self, module: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer] = (),
                 algorithm=None, process_group: Optional[ProcessGroup] = None,
                 find_unused_parameters: bool = False, broadcast_buffers: bool = True,
                 gradient_as_bucket_view: bool = True, bucket_cap_mb: Optional[float] = None):
        super().__init__()
        self.module = module
        bucket_bytes = None if bucket_cap_mb is None else max(1, int(bucket_cap_mb * 1024 * 1024))
        self.inner = wrap(
            module, optimizers, GradientAllReduceAlgorithm() if algorithm is None else algorithm, process_group,
            module_name=f"DistributedDataParallel_{id(module)}", do_flatten=gradient_as_bucket_view,
            find_unused_parameters=find_unused_parameters, broadcast_buffers=broadcast_buffers,
            bucket_bytes=bucket_bytes,
        )

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it
        communicates their sum (mean over ranks)."""
        with self.inner.no_sync():
            yield

    @property
    def require_backward_grad_sync(self) -> bool:
        return self.inner.require_backward_grad_sync

    @property
    def bagua_algorithm(self):
        return self.inner.impl

    @property
    def bagua_optimizers(self):
        return self.inner.optimizers

    @property
    def bagua_buckets(self):
        return self.inner.bagua_buckets

    @property
    def parameters_to_ignore(self):
        return sorted(self.inner.ignored)

    def close(self) -> None:
        """Removes the hooks and stops the engine; the module trains locally again."""
        self.inner.close()
