"""Whether this machine can run the ``gpu``-marked tests, and why not: the
one check every GPU test uses (they skip with the reason here)."""

from __future__ import annotations

import functools
from typing import Optional


@functools.lru_cache(maxsize=None)
def gpu_skip_reason(torch_needed: bool = True) -> Optional[str]:
    """None when a CUDA device is usable (this build has CUDA, a device is
    visible and, with ``torch_needed``, torch sees it too), else the reason."""
    from bagua_core import _C

    if not _C.built_with_cuda:
        return "built without CUDA"
    if _C.cuda_device_count() == 0:
        return f"no CUDA device: {_C.cuda_unavailable_reason()}"
    if torch_needed:
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        if not torch.cuda.is_available():
            return "torch was built without CUDA or sees no device"
    return None


def need_gpu() -> None:
    """Skips the calling test when :func:`gpu_skip_reason` gives a reason."""
    import pytest

    why = gpu_skip_reason()
    if why:
        pytest.skip(why)
