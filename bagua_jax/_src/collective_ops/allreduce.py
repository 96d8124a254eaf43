"""allreduce: every rank gets the reduction (sum, avg, min, max, prod) of x."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from bagua_jax import _compat
from bagua_jax._src import ffi, groups, validation
from bagua_jax._src.groups import GroupInfo

if TYPE_CHECKING:
    from bagua_core.comm import Op
    from bagua_core.process_group import ProcessGroup

allreduce_p = _compat.define_primitive("bagua_allreduce")


def allreduce(x: ArrayLike, op: Op = "sum", group: Optional[ProcessGroup] = None) -> jax.Array:
    """Reduces ``x`` over every rank of ``group``; each rank gets the result.

    Works eagerly and inside ``jax.jit``; collectives keep program order on
    every rank, even when data-independent. Under ``jax.jit`` with ``x``
    donated (``donate_argnums``), the result reuses x's buffer: no copy.

    Differentiable for ``op="sum"`` and ``op="avg"`` (linear maps). The
    transpose follows ``torch.distributed.nn.all_reduce`` and ``jax.lax.psum``
    under pmap: the objective is the sum of every rank's objective, so the
    cotangent is allreduced with the same op.

    Args:
      x: array of dtype float32, float64, float16, bfloat16, int32, int64 or uint8.
      op: "sum", "avg", "min", "max", "prod" (any case) or a ``bagua_core.ReduceOp``.
      group: a ``bagua_core`` process group; default: the one ``bagua_jax.init_process_group()`` made.

    Returns:
      An array with the shape and dtype of ``x``.
    """
    g = groups.resolve(group)
    op = validation.reduce_op(op)
    x = jnp.asarray(x)
    validation.check_array("allreduce", x, g)
    return allreduce_p.bind(x, group=g, op=op, alias=True)


def _abstract_eval(x, *, group: GroupInfo, op: int, alias: bool):
    return _compat.shaped_like(x)


def _lowering(ctx, x, *, group: GroupInfo, op: int, alias: bool):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform("allreduce", platforms, group)
    ffi.check_lowerable("allreduce", ffi.ALLREDUCE, platforms)
    return _compat.lower_ffi_with_token(
        ctx,
        ffi.ALLREDUCE,
        x,
        what="allreduce",
        alias=alias,
        comm=np.int64(groups.handle_for(group.handle, platforms, group.platform)),
        op=np.int64(op),
    )


def _batching(args, dims, *, group: GroupInfo, op: int, alias: bool):
    # Elementwise across ranks, so the batch axis just rides along.
    (x,), (d,) = args, dims
    return allreduce_p.bind(x, group=group, op=op, alias=alias), d


def _check_linear(op: int) -> None:
    if op not in (validation.SUM, validation.AVG):
        raise NotImplementedError(
            f"bagua_jax.allreduce: differentiation is defined for op='sum' and "
            f"op='avg' only, not {validation.OP_NAMES[op]}"
        )


def _jvp(primals, tangents, *, group: GroupInfo, op: int, alias: bool):
    _check_linear(op)
    (x,), (t,) = primals, tangents
    y = allreduce_p.bind(x, group=group, op=op, alias=alias)
    # Symbolic zeros are structural (identical on every rank): skipping their
    # collective keeps the ranks in step.
    if _compat.is_zero(t):
        return y, _compat.zero_tangent_like(y)
    return y, allreduce_p.bind(t, group=group, op=op, alias=alias)


def _transpose(ct, x, *, group: GroupInfo, op: int, alias: bool):
    _check_linear(op)
    if _compat.is_zero(ct):
        return [ct]
    return [allreduce_p.bind(ct, group=group, op=op, alias=alias)]


_compat.def_effectful_abstract_eval(allreduce_p, _abstract_eval)
_compat.register_lowering(allreduce_p, _lowering)
_compat.def_batching(allreduce_p, _batching)
_compat.def_jvp(allreduce_p, _jvp)
_compat.def_transpose(allreduce_p, _transpose)
