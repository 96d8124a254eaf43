"""Bagua's extras beside the algorithms, under their original names.

- :func:`fuse_optimizer` — ``optimizer.fuse_step()``: one step over many small
  parameters as a few flat tensors, bitwise equal to ``step()``.
- :class:`SyncBatchNorm`, :func:`convert_sync_batchnorm` — batch statistics
  over every rank, through Bagua's collectives (CPU included).
- :class:`LoadBalancingDistributedSampler`,
  :class:`LoadBalancingDistributedBatchSampler` — ranks get samples of
  similar complexity at each step; :class:`ResumableDistributedSampler` —
  torch's DistributedSampler; both samplers keep their place in the epoch and
  resume it on another number of ranks.
- :class:`CachedDataset`, :class:`CacheLoader` — samples cached after their
  first load, in an embedded LMDB shared by a node's ranks or in Redis.
"""

from bagua_torch.contrib.cache_loader import CacheLoader
from bagua_torch.contrib.cached_dataset import CachedDataset
from bagua_torch.contrib.fused_optimizer import fuse_optimizer, is_fused_optimizer
from bagua_torch.contrib.load_balancing_data_loader import (
    LoadBalancingDistributedBatchSampler,
    LoadBalancingDistributedSampler,
    ResumableDistributedSampler,
)
from bagua_torch.contrib.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm

__all__ = [
    "fuse_optimizer",
    "is_fused_optimizer",
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "LoadBalancingDistributedSampler",
    "LoadBalancingDistributedBatchSampler",
    "ResumableDistributedSampler",
    "CachedDataset",
    "CacheLoader",
]
