"""Bagua's extras beside the algorithms, under their original names.

- :func:`fuse_optimizer` — ``optimizer.fuse_step()``: one step over many small
  parameters as a few flat tensors, bitwise equal to ``step()``.
"""

from bagua_torch.contrib.fused_optimizer import fuse_optimizer, is_fused_optimizer

__all__ = ["fuse_optimizer", "is_fused_optimizer"]
