"""Which communicator a process group runs on: NCCL or Gloo.

The setting (``BAGUA_BACKEND``, or the ``backend`` argument of
``init_process_group()`` / ``new_group()``) is parsed by
:mod:`bagua_core.config`: ``auto``, ``nccl`` or ``gloo``. This module decides:

* each rank finds out whether it can run NCCL (:func:`local_availability`):
  this build has CUDA, a CUDA device is visible for its ``LOCAL_RANK`` (the
  device index of its NCCL communicators), and an NCCL library is found
  (:func:`bagua_core._nccl.find_library`) and passes the version check;
* the ranks exchange their answers through the store, so every rank decides
  the same (:func:`choose`): ``auto`` is NCCL when every member can, else
  Gloo; ``nccl`` raises :class:`NcclUnavailableError` on every rank, naming
  each rank that cannot and why, and the three ways to supply NCCL; ``gloo``
  is Gloo.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

from bagua_core import _nccl, config
from bagua_core._loader import _C


class NcclUnavailableError(_C.BaguaError):
    """``backend="nccl"`` was asked for, but some rank cannot run NCCL."""


@dataclasses.dataclass(frozen=True)
class Availability:
    """Whether this rank can run NCCL: ``reason`` is "" when it can."""

    reason: str
    device: Optional[int] = None
    library: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not self.reason

    def encode(self) -> bytes:
        return b"ok" if self.ok else b"no:" + self.reason.encode()

    @staticmethod
    def decode(value: bytes) -> "Availability":
        return Availability("") if value == b"ok" else Availability(value[3:].decode(errors="replace"))


def local_availability(
    settings: config.Settings,
    *,
    built_with_cuda: Optional[bool] = None,
    device_count: Optional[Callable[[], int]] = None,
    find_library: Optional[Callable[[], str]] = None,
    check_library: Optional[Callable[[str], int]] = None,
) -> Availability:
    """Whether this process can run NCCL on device ``LOCAL_RANK``. The keyword
    arguments replace the build flag, ``_C.cuda_device_count``, the library
    search and its version check (for tests)."""
    built = _C.built_with_cuda if built_with_cuda is None else built_with_cuda
    if not built:
        return Availability("bagua_core was built without CUDA (no nvcc at build time)")
    count = (device_count or _C.cuda_device_count)()
    if count == 0:
        why = _C.cuda_unavailable_reason() if device_count is None else "no device"
        return Availability(f"no CUDA device is visible ({why})")
    index = settings.local_rank
    if index >= count:
        return Availability(
            f"LOCAL_RANK={index} but only {count} CUDA device(s) are visible (device index "
            f"= LOCAL_RANK: one process per GPU; check CUDA_VISIBLE_DEVICES and "
            f"LOCAL_WORLD_SIZE)"
        )
    try:
        path = (find_library or (lambda: _nccl.process_library() or _nccl.find_library()))()
        (check_library or _nccl.check_library)(path)
    except _C.BaguaError as e:
        return Availability(f"no usable NCCL library: {e}")
    return Availability("", device=index, library=path)


def choose(requested: str, everyone: Sequence[Availability], members: Sequence[int], what: str) -> str:
    """ "nccl" or "gloo" for a group of global ``members``, given every rank's
    availability (indexed by global rank). The same on every rank."""
    if requested == "gloo":
        return "gloo"
    missing = [(r, everyone[r].reason) for r in members if not everyone[r].ok]
    if not missing:
        return "nccl"
    if requested == "auto":
        return "gloo"
    shown = "; ".join(f"rank {r}: {why}" for r, why in missing[:8]) + ("; ..." if len(missing) > 8 else "")
    raise NcclUnavailableError(
        f"{what}: backend 'nccl' was asked for (BAGUA_BACKEND or backend=), but "
        f"{'a rank' if len(missing) == 1 else f'{len(missing)} ranks'} cannot run NCCL: {shown}. "
        f"NCCL groups need a CUDA build, one visible device per local rank and an NCCL library. To "
        f"{_nccl.HOW_TO_SUPPLY}. Or use backend 'gloo' (or 'auto')"
    )


def fallback_reason(everyone: Sequence[Availability], members: Sequence[int]) -> str:
    """Why ``auto`` chose Gloo ("" when it chose NCCL)."""
    for r in members:
        if not everyone[r].ok:
            return f"rank {r}: {everyone[r].reason}"
    return ""
