"""algorithm_step: one engine algorithm step (``csrc/ops/registry.h``) on the
leaves of one bucket, inside ``jax.jit`` through the ``bagua_step`` FFI target
(``csrc/ffi/xla_step_adapter.h``), which gathers them into the engine's bucket layout,
runs the step and scatters the result back. The building block of
:func:`bagua_jax.transform`; the same C++ step the torch frontend runs on its
engine buckets."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence, Tuple

import numpy as np

from bagua_jax import _compat
from bagua_jax._src import ffi, groups, local_devices, validation
from bagua_jax._src.groups import GroupInfo

# (step, *data, *state) -> (*data, *state); the state is updated in place.
algorithm_step_p = _compat.define_primitive("bagua_algorithm_step")
algorithm_step_p.multiple_results = True


class BoundStep(NamedTuple):
    """A plan's step bound to a group's communicators (static, hashable)."""

    name: str  # registry name, e.g. "bytegrad"
    params: str  # "key=value;..."
    group: GroupInfo  # the flat group (platform checks, error messages)
    intra: int  # communicator handles; -1 when the step does not use one
    inter: int
    has_result: bool  # result is separate from the data (weights -> peer average)
    num_state: int = 0  # state spans the step keeps (e.g. replicas); its state has num_state * data size elements
    model: str = ""  # the transform's name: its row in a BAGUA_TRACE trace
    local_axes: Tuple[str, ...] = ()  # the process's device axes: the step runs once over them (local_devices)


def algorithm_step(
    leaves: Sequence[Any], step_number, bound: BoundStep, state: Sequence[Any] = (), bucket: int = 0
) -> Tuple[list, tuple]:
    """Runs ``bound`` at step ``step_number`` (an int32 scalar) on one bucket
    made of ``leaves`` (one dtype, in bucket order). Returns ``(leaves,
    state)``: the leaves after the step (in-place steps) or its result (weight
    steps; the weights themselves when it does not communicate), and the state
    after it. ``state`` (stateful steps only) is either one 1-D block of
    ``bound.num_state`` x the padded bucket size, or one leaf per data leaf of
    the same shape (``num_state == 1``). ``bucket``: the bucket's index, for
    BAGUA_TRACE."""
    out = local_devices.run_once(
        lambda buffers: algorithm_step_p.bind(
            step_number, *buffers, bound=bound, n_data=len(leaves), bucket=int(bucket)
        ),
        [*leaves, *state],
        bound.local_axes,
    )
    return list(out[: len(leaves)]), tuple(out[len(leaves) :])


def _abstract_eval(step_number, *buffers, bound: BoundStep, n_data: int, bucket: int):
    return [_compat.shaped_like(b) for b in buffers]


def _lowering(ctx, step_number, *buffers, bound: BoundStep, n_data: int, bucket: int):
    platforms = _compat.lowering_platforms(ctx)
    validation.check_platform(f"transform ({bound.name})", platforms, bound.group)
    ffi.check_lowerable(f"transform ({bound.name})", ffi.STEP, platforms)
    # operand 0 is the step number; data leaf i is operand 1 + i, result i
    aliases = {1 + i: i for i in range(len(buffers)) if i >= n_data or not bound.has_result}

    def handle(h):
        return groups.handle_for(h, platforms, bound.group.platform)

    return _compat.lower_ffi_with_token(
        ctx,
        ffi.STEP,
        step_number,
        *buffers,
        what=f"transform ({bound.name})",
        alias=False,
        aliases=aliases,
        token_first=True,
        per_device=bool(bound.local_axes),
        step=bound.name,
        params=bound.params,
        comm=np.int64(handle(bound.group.handle)),
        intra=np.int64(handle(bound.intra)),
        inter=np.int64(handle(bound.inter)),
        n_data=np.int64(n_data),
        model=bound.model,
        bucket=np.int64(bucket),
    )


def _no_autodiff(*args, **kwargs):
    raise NotImplementedError(
        "bagua_jax.transform's communication is not differentiable; call tx.update outside jax.grad"
    )


def refuse_batching(*args, **kwargs):
    """The batching rule of the transform's primitives."""
    raise NotImplementedError(
        "bagua_jax.transform cannot run under jax.vmap: every rank must run each step exactly once"
    )


_compat.def_effectful_abstract_eval(algorithm_step_p, _abstract_eval)
_compat.register_lowering(algorithm_step_p, _lowering)
_compat.def_jvp(algorithm_step_p, _no_autodiff)
_compat.def_batching(algorithm_step_p, refuse_batching)
