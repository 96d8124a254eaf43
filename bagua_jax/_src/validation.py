"""Argument checks shared by the collectives: clear Python errors at trace time
instead of failures deep inside XLA."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bagua_jax._src import groups
from bagua_jax._src.groups import GroupInfo

SUPPORTED_DTYPES = tuple(
    np.dtype(t) for t in (jnp.float32, jnp.float64, jnp.float16, jnp.bfloat16, jnp.int32, jnp.int64, jnp.uint8)
)

# ReduceOp values of the engine (csrc/common/dtype.h), the original Bagua's.
REDUCE_OPS = {"sum": 0, "prod": 1, "product": 1, "min": 2, "max": 3, "avg": 10, "mean": 10}
OP_NAMES = {0: "SUM", 1: "PROD", 2: "MIN", 3: "MAX", 10: "AVG"}
SUM, AVG = 0, 10


def reduce_op(op: Any) -> int:
    """Accepts "sum"/"avg"/"min"/"max"/"prod" (any case) or a ReduceOp enum/int."""
    if isinstance(op, str):
        try:
            return REDUCE_OPS[op.lower()]
        except KeyError:
            raise ValueError(
                f"bagua_jax: unknown reduce op {op!r}; use one of 'sum', 'avg', 'min', 'max', 'prod'"
            ) from None
    value = getattr(op, "value", op)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise TypeError(f"bagua_jax: op must be a string or ReduceOp, got {op!r}") from None
    if value not in OP_NAMES:
        raise ValueError(f"bagua_jax: invalid reduce op {op!r}")
    return value


def check_array(name: str, x: Any, group: GroupInfo) -> None:
    dtype = np.dtype(x.dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"bagua_jax.{name}: unsupported dtype {dtype}; supported: " + ", ".join(str(t) for t in SUPPORTED_DTYPES)
        )
    # A concrete array tells its device now; a traced one is checked at lowering.
    if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
        platforms = {d.platform for d in x.devices()}
        check_platform(name, platforms, group)


def check_platform(name: str, platforms: Any, group: GroupInfo) -> None:
    for p in platforms:
        p = "cuda" if p in ("cuda", "gpu", "rocm") else p
        if p == "cuda" and group.platform == "cpu":
            groups.staged_handle(group.handle, f"bagua_jax.{name}")  # through host memory
        elif p != group.platform:
            raise ValueError(
                f"bagua_jax.{name}: the array is on {p} but the process group "
                f"communicates {group.platform} memory; move the array with "
                f"jax.device_put or use a group for {p}"
            )
