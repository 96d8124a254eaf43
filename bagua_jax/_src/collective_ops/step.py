"""algorithm_step: one engine algorithm step (``csrc/ops/registry.h``) on a
flat bucket, inside ``jax.jit`` through the ``bagua_step`` FFI target. The
building block of :func:`bagua_jax.transform`; the same C++ step the torch
frontend runs on its engine buckets."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from bagua_jax import _compat
from bagua_jax._src import ffi, validation
from bagua_jax._src.groups import GroupInfo

algorithm_step_p = _compat.define_primitive("bagua_algorithm_step")
# Steps with state: (data, step, state) -> (data, state), both in place.
algorithm_step_state_p = _compat.define_primitive("bagua_algorithm_step_state")
algorithm_step_state_p.multiple_results = True


class BoundStep(NamedTuple):
    """A plan's step bound to a group's communicators (static, hashable)."""

    name: str  # registry name, e.g. "bytegrad"
    params: str  # "key=value;..."
    group: GroupInfo  # the flat group (platform checks, error messages)
    intra: int  # communicator handles; -1 when the step does not use one
    inter: int
    has_result: bool  # result is separate from the data (weights -> peer average)
    num_state: int = 0  # state spans the step keeps (e.g. replicas); its state has num_state * data size elements


def algorithm_step(data, step_number, bound: BoundStep):
    """Runs ``bound`` on the 1-D array ``data`` at step ``step_number`` (an
    int32 scalar); returns the data after the step (in-place steps) or its
    result (weight steps; the weights themselves when it does not communicate)."""
    return algorithm_step_p.bind(data, step_number, bound=bound)


def algorithm_step_with_state(data, step_number, state, bound: BoundStep):
    """Runs the stateful step ``bound`` on ``data`` with its ``state`` (1-D,
    ``bound.num_state * data.size`` elements of data's dtype); returns
    ``(data, state)`` after the step, both updated in place."""
    return tuple(algorithm_step_state_p.bind(data, step_number, state, bound=bound))


def _abstract_eval(data, step_number, *, bound: BoundStep):
    return _compat.ShapedArray(data.shape, data.dtype)


def _lowering(ctx, data, step_number, *, bound: BoundStep):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform(f"transform ({bound.name})", platforms, bound.group)
    ffi.check_lowerable(f"transform ({bound.name})", ffi.STEP, platforms)
    return _compat.lower_ffi_with_token(
        ctx, ffi.STEP, data, step_number, alias=not bound.has_result,
        step=bound.name, params=bound.params, comm=np.int64(bound.group.handle),
        intra=np.int64(bound.intra), inter=np.int64(bound.inter))


def _abstract_eval_state(data, step_number, state, *, bound: BoundStep):
    return [_compat.ShapedArray(data.shape, data.dtype), _compat.ShapedArray(state.shape, state.dtype)]


def _lowering_state(ctx, data, step_number, state, *, bound: BoundStep):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform(f"transform ({bound.name})", platforms, bound.group)
    ffi.check_lowerable(f"transform ({bound.name})", ffi.STEP_STATE, platforms)
    return _compat.lower_ffi_with_token(
        ctx, ffi.STEP_STATE, data, step_number, state, alias=True, aliases={2: 1},
        step=bound.name, params=bound.params, comm=np.int64(bound.group.handle),
        intra=np.int64(bound.intra), inter=np.int64(bound.inter))


def _no_autodiff(*args, **kwargs):
    raise NotImplementedError(
        "bagua_jax.transform's communication is not differentiable; call tx.update outside jax.grad")


def _no_batching(*args, **kwargs):
    raise NotImplementedError(
        "bagua_jax.transform cannot run under jax.vmap: every rank must run each step exactly once")


_compat.def_effectful_abstract_eval(algorithm_step_p, _abstract_eval)
_compat.register_lowering(algorithm_step_p, _lowering)
_compat.def_jvp(algorithm_step_p, _no_autodiff)
_compat.def_batching(algorithm_step_p, _no_batching)
_compat.def_effectful_abstract_eval(algorithm_step_state_p, _abstract_eval_state)
_compat.register_lowering(algorithm_step_state_p, _lowering_state)
_compat.def_jvp(algorithm_step_state_p, _no_autodiff)
_compat.def_batching(algorithm_step_state_p, _no_batching)
