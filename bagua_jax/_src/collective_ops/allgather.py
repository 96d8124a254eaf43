"""allgather: every rank gets the stack of all ranks' x."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from bagua_jax import _compat
from bagua_jax._src import ffi, groups, validation
from bagua_jax._src.collective_ops.allreduce import allreduce_p
from bagua_jax._src.groups import GroupInfo

if TYPE_CHECKING:
    from bagua_core.process_group import ProcessGroup

allgather_p = _compat.define_primitive("bagua_allgather")


def allgather(x: ArrayLike, group: Optional[ProcessGroup] = None) -> jax.Array:
    """Returns ``stack([x of rank 0, x of rank 1, ...])`` on every rank.

    The result has shape ``(group.size, *x.shape)``; every rank passes the same
    shape and dtype. Works eagerly and inside ``jax.jit``. Differentiable: the
    cotangent of rank r's input is the sum over ranks of their cotangents' row r.

    Args:
      x: array of a supported dtype (see ``allreduce``).
      group: a ``bagua_core`` process group; default: the one ``bagua_jax.init_process_group()`` made.
    """
    g = groups.resolve(group)
    x = jnp.asarray(x)
    validation.check_array("allgather", x, g)
    return allgather_p.bind(x, group=g)


def _abstract_eval(x, *, group: GroupInfo):
    return _compat.shaped_like(x, (group.size, *x.shape))


def _lowering(ctx, x, *, group: GroupInfo):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform("allgather", platforms, group)
    ffi.check_lowerable("allgather", ffi.ALLGATHER, platforms)
    # The output is size() times larger than the input: no aliasing.
    return _compat.lower_ffi_with_token(
        ctx,
        ffi.ALLGATHER,
        x,
        what="allgather",
        alias=False,
        comm=np.int64(groups.handle_for(group.handle, platforms, group.platform)),
    )


def _batching(args, dims, *, group: GroupInfo):
    # The gathered (rank) axis is prepended, so the batch axis moves by one.
    (x,), (d,) = args, dims
    return allgather_p.bind(x, group=group), d + 1


def _jvp(primals, tangents, *, group: GroupInfo):
    (x,), (t,) = primals, tangents
    y = allgather_p.bind(x, group=group)
    if _compat.is_zero(t):
        return y, _compat.zero_tangent_like(y)
    return y, allgather_p.bind(t, group=group)


def _transpose(ct, x, *, group: GroupInfo):
    if _compat.is_zero(ct):
        return [_compat.Zero(x.aval)]
    # A reduce-scatter, done as allreduce + own row (simple; size x the traffic).
    total = allreduce_p.bind(ct, group=group, op=validation.SUM, alias=False)
    return [total[group.rank]]


_compat.def_effectful_abstract_eval(allgather_p, _abstract_eval)
_compat.register_lowering(allgather_p, _lowering)
_compat.def_batching(allgather_p, _batching)
_compat.def_jvp(allgather_p, _jvp)
_compat.def_transpose(allgather_p, _transpose)
