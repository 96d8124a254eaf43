"""broadcast: every rank gets rank ``root``'s x."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

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

broadcast_p = _compat.define_primitive("bagua_broadcast")


def broadcast(x: ArrayLike, root: int = 0, group: Optional[ProcessGroup] = None) -> jax.Array:
    """Returns rank ``root``'s ``x`` on every rank of ``group``.

    Every rank passes an array of the same shape and dtype (its values are
    ignored except on ``root``). Works eagerly and inside ``jax.jit``; with x
    donated the result reuses its buffer. Differentiable: the cotangents of all
    ranks are summed into root's input (zero on the other ranks).

    Args:
      x: array of a supported dtype (see ``allreduce``).
      root: rank (within ``group``) whose data is sent.
      group: a ``bagua_core`` process group; default: the one ``bagua_jax.init_process_group()`` made.
    """
    g = groups.resolve(group)
    root = _check_root(root, g)
    x = jnp.asarray(x)
    validation.check_array("broadcast", x, g)
    return broadcast_p.bind(x, group=g, root=root, alias=True)


def _check_root(root: Any, g: GroupInfo) -> int:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"bagua_jax.broadcast: root must be an int, got {root!r}")
    if not 0 <= int(root) < g.size:
        raise ValueError(f"bagua_jax.broadcast: root {root} is not a rank of a group of size {g.size}")
    return int(root)


def _abstract_eval(x, *, group: GroupInfo, root: int, alias: bool):
    return _compat.shaped_like(x)


def _lowering(ctx, x, *, group: GroupInfo, root: int, alias: bool):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform("broadcast", platforms, group)
    ffi.check_lowerable("broadcast", ffi.BROADCAST, platforms)
    return _compat.lower_ffi_with_token(
        ctx,
        ffi.BROADCAST,
        x,
        what="broadcast",
        alias=alias,
        comm=np.int64(groups.handle_for(group.handle, platforms, group.platform)),
        root=np.int64(root),
    )


def _batching(args, dims, *, group: GroupInfo, root: int, alias: bool):
    (x,), (d,) = args, dims
    return broadcast_p.bind(x, group=group, root=root, alias=alias), d


def _jvp(primals, tangents, *, group: GroupInfo, root: int, alias: bool):
    (x,), (t,) = primals, tangents
    y = broadcast_p.bind(x, group=group, root=root, alias=alias)
    if _compat.is_zero(t):
        return y, _compat.zero_tangent_like(y)
    return y, broadcast_p.bind(t, group=group, root=root, alias=alias)


def _transpose(ct, x, *, group: GroupInfo, root: int, alias: bool):
    if _compat.is_zero(ct):
        return [ct]
    # Every rank takes part in the sum; only root's input received the data.
    total = allreduce_p.bind(ct, group=group, op=validation.SUM, alias=alias)
    return [total if group.rank == root else jnp.zeros_like(total)]


_compat.def_effectful_abstract_eval(broadcast_p, _abstract_eval)
_compat.register_lowering(broadcast_p, _lowering)
_compat.def_batching(broadcast_p, _batching)
_compat.def_jvp(broadcast_p, _jvp)
_compat.def_transpose(broadcast_p, _transpose)
