"""Element types: :class:`DType` and conversion from numpy / torch / JAX names."""

from __future__ import annotations

from typing import Any

import numpy as np

from bagua_core._loader import _C

DType = _C.DType
# What as_dtype accepts: a DType, a name, a numpy / ml_dtypes / JAX dtype or scalar type, a torch dtype.
DTypeLike = Any

_BY_NAME = {t.name: t for t in DType.__members__.values()}


def as_dtype(x: DTypeLike) -> DType:
    """A :class:`DType` from a DType, a name ("float32", "bfloat16"), a numpy /
    ml_dtypes / JAX dtype or scalar type, or a torch dtype (never imports torch)."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        name = x
    else:
        try:
            name = np.dtype(x).name
        except TypeError:
            name = str(x)  # torch.float32 -> "torch.float32"
    name = name.lower().removeprefix("torch.")
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError(
            f"unsupported dtype {x!r}: Bagua communicates float32, float64, float16, bfloat16, int32, int64 and uint8"
        ) from None
