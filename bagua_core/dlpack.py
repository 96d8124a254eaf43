"""DLPack import: borrow any array's memory (numpy, torch, JAX, CuPy, Buffer) zero-copy.

:func:`import_array` returns a :class:`DLPackView` (data address, element
count, shape, dtype, device, read-only flag). The view keeps the producer's
memory alive until it is garbage collected; keep it referenced for as long as
the engine uses its address. Exports go the other way through
:class:`bagua_core.Buffer`, which numpy, torch and JAX view with their own
``from_dlpack``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from bagua_core._loader import _C
from bagua_core.dtypes import DType

if TYPE_CHECKING:
    DLPackView = Any  # the extension's class; bagua_core._C has no type stubs
else:
    DLPackView = _C.DLPackView

# DLDeviceType codes (dlpack.h) of memory the engine can address.
_HOST_DEVICES = (1, 3)  # kDLCPU, kDLCUDAHost
_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged
_LEGACY_DEFAULT_STREAM = 1  # DLPack's name for CUDA's legacy default stream


def is_immutable(obj: Any) -> bool:
    """True for arrays that must never be written (JAX arrays), which export no
    read-only flag of their own. Never imports jax."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(obj, jax.Array)


def import_array(obj: Any, *, stream: Optional[int] = None) -> DLPackView:
    """Borrows ``obj``'s memory through DLPack, without copying.

    A versioned capsule is requested first (it carries the read-only flag), then
    the legacy one. CUDA arrays are handed over on ``stream`` (default: the
    legacy default stream, which Bagua's CUDA primitives use).

    Raises TypeError for objects without ``__dlpack__``, unsupported dtypes
    (bool, int8, complex...) and devices; ValueError for non-contiguous arrays.
    """
    if isinstance(obj, DLPackView):
        return obj
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise TypeError(
            f"expected an array with DLPack support (numpy, torch, JAX, CuPy, bagua_core.Buffer), "
            f"got {type(obj).__module__}.{type(obj).__qualname__}"
        )
    override = None
    source = obj
    lazy = _lazy_sign(obj)
    if lazy:
        # A torch view with the negative (or conjugate) bit set exports its
        # memory without the bit: communicate the resolved values, from a copy
        # that is read-only to the caller (writes into it would be lost).
        source = obj.resolve_neg().resolve_conj()
    if isinstance(obj, np.ndarray) and obj.dtype.name == "bfloat16":
        # numpy cannot name ml_dtypes' bfloat16 in DLPack: export the bits.
        source, override = obj.view(np.uint16), DType.bfloat16
    device_type, _ = obj.__dlpack_device__()
    kwargs = {}
    if int(device_type) in _CUDA_DEVICES:
        kwargs["stream"] = _LEGACY_DEFAULT_STREAM if stream is None else stream
    elif int(device_type) not in _HOST_DEVICES:
        raise TypeError(f"unsupported device {obj.__dlpack_device__()!r}: Bagua communicates CPU and CUDA arrays")
    try:
        try:
            capsule = source.__dlpack__(max_version=(1, 0), **kwargs)
        except TypeError:  # a producer older than DLPack 1.0
            capsule = source.__dlpack__(**kwargs)
    except BufferError as e:
        dtype = getattr(obj, "dtype", "?")
        raise TypeError(f"cannot borrow a {type(obj).__name__} of dtype {dtype} through DLPack: {e}") from e
    if override is not None:
        return DLPackView(capsule, override, False)
    return DLPackView(capsule, None, lazy or is_immutable(obj))


def _lazy_sign(obj) -> bool:
    """True for a torch tensor whose values are its memory negated or
    conjugated (``z.conj().imag``, ``torch._neg_view``). Never imports torch."""
    is_neg, is_conj = getattr(obj, "is_neg", None), getattr(obj, "is_conj", None)
    return bool((callable(is_neg) and is_neg()) or (callable(is_conj) and is_conj()))
