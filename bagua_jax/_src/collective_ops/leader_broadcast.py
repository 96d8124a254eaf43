"""leader_broadcast: the leader device's values on every device of the
process's mesh axes, inside shard_map: how the result of an engine step that
ran on one device (``local_devices.run_once``) reaches the others.

On CPU the ``bagua_leader_broadcast`` FFI target (``csrc/ffi/leader_broadcast.h``)
copies the leader's buffers into each other device's (XLA:CPU devices share the
process's memory; an XLA psum would all-reduce them instead, several times the
work); on GPUs XLA's own collective-broadcast (``lax.pbroadcast``)."""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence, Tuple

import numpy as np
from jax import lax

from bagua_core import config
from bagua_jax import _compat
from bagua_jax._src import ffi
from bagua_jax._src.collective_ops.algorithm_step import refuse_batching

# (position, *values) -> (*values); results alias the values.
leader_broadcast_p = _compat.define_primitive("bagua_leader_broadcast")
leader_broadcast_p.multiple_results = True

_sites = itertools.count(1)  # one id per lowering: the call site the devices meet at


def leader_broadcast(values: Sequence[Any], axes: Tuple[str, ...]) -> list:
    """``values`` as the device at index 0 of every axis in ``axes`` holds
    them, on every device of ``axes`` (called inside shard_map)."""
    if not values:
        return []
    position = lax.axis_index(axes).astype(np.int32)
    participants = math.prod(lax.axis_size(a) for a in axes)
    return list(leader_broadcast_p.bind(position, *values, axes=tuple(axes), participants=int(participants)))


def _abstract_eval(position, *values, axes, participants):
    return [_compat.shaped_like(v) for v in values]


def _lowering(ctx, position, *values, axes, participants):
    platforms = _compat.lowering_platforms(ctx)
    if platforms != ("cpu",):  # GPUs: XLA's collective-broadcast (NCCL over NVLink)
        return _compat.lower_fun(lambda _, *vs: [lax.pbroadcast(v, axes, 0) for v in vs])(ctx, position, *values)
    ffi.check_lowerable("transform", ffi.LEADER_BROADCAST, platforms)
    rule = _compat.ffi_lowering(
        ffi.LEADER_BROADCAST, has_side_effect=True, operand_output_aliases={1 + i: i for i in range(len(values))}
    )
    return rule(
        ctx,
        position,
        *values,
        site=np.int64(next(_sites)),
        participants=np.int64(participants),
        timeout_ms=np.int64(math.ceil(config.load().timeout_s * 1000)),
    )


def _no_autodiff(*args, **kwargs):
    raise NotImplementedError("bagua_jax.transform's communication is not differentiable")


leader_broadcast_p.def_abstract_eval(_abstract_eval)
_compat.register_lowering(leader_broadcast_p, _lowering)
_compat.def_jvp(leader_broadcast_p, _no_autodiff)
_compat.def_batching(leader_broadcast_p, refuse_batching)
