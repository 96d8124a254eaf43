"""Torch tensors over the engine's memory: zero-copy views of its buckets,
and the test that two tensors are the same memory."""

from __future__ import annotations

from typing import Dict, Optional

import torch


def torch_view(view) -> torch.Tensor:
    """A torch tensor over engine memory (zero-copy DLPack; keeps the memory alive)."""
    return torch.from_dlpack(view)


def bucket_tensors(bucket, names) -> Dict[str, torch.Tensor]:
    """The named tensors of ``bucket`` as views of one torch tensor over the
    whole bucket: one storage, like torch's own flattened buffers, so code
    that checks storages (fuse_optimizer) sees one buffer, not its own
    allocation per tensor."""
    flat = torch_view(bucket.flat_view())
    out = {}
    for n in names:
        s = bucket.slot(n)
        out[n] = flat.narrow(0, s["offset"], s["numel"]).view(s["shape"])
    return out


def same_memory(a: Optional[torch.Tensor], b: torch.Tensor) -> bool:
    return a is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.dtype == b.dtype
