"""A step state saved under another ``BAGUA_BUCKET_SIZE``, moved into this
model's buckets tensor by tensor (:mod:`bagua_core.state_relayout` finds the
saved buckets and the moves; this copies the numbers)."""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import torch

from bagua_core import state_relayout
from bagua_core.log import logger


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def step_state_for(name: str, saved: Any, ops: Sequence[Any], buckets: Sequence[Any], declared, alignment: int) -> Any:
    """``saved`` (``state_dict()["state"]["step_state"]``) laid out for
    ``buckets``, when it holds the same tensors' data-shaped state in other
    buckets; otherwise ``saved`` unchanged (the algorithm's load checks it).
    ``declared``: ``(name, numel, dtype)`` in the order the buckets were
    planned from. ValueError when it is data-shaped but fits no layout."""
    views = [torch.from_dlpack(op.state_view()) for op in ops]
    if not isinstance(saved, (list, tuple)) or not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in saved):
        return saved
    if [tuple(t.shape) for t in saved] == [tuple(v.shape) for v in views]:
        return saved
    spans = views[0].shape[0]
    if not all(op.state_data_shaped for op in ops) or any(t.shape[0] != spans for t in saved):
        return saved
    sizes: List[Tuple[str, int]] = [(dtype_name(t.dtype), int(t.shape[1])) for t in saved]
    try:
        old = state_relayout.saved_buckets(declared, sizes, alignment)
    except ValueError as e:
        raise ValueError(
            f"{name} state: 'step_state' holds {len(saved)} buckets of sizes {[n for _, n in sizes]}, this model's "
            f"{len(views)} buckets need {[int(v.shape[1]) for v in views]}, and it is not their state under "
            f"another bucket size ({e})"
        ) from None
    numel_of = {name: numel for name, numel, _ in declared}
    out = []
    for bucket_moves, view in zip(state_relayout.moves(old, [b.tensor_names for b in buckets], numel_of), views):
        t = torch.zeros_like(view)
        for m in bucket_moves:
            source = saved[m.source][:, m.source_offset : m.source_offset + m.count]
            t[:, m.target_offset : m.target_offset + m.count] = source.to(t.device)
        out.append(t)
    logger.info("a step state of %d buckets laid out for these %d buckets", len(saved), len(views))
    return out
