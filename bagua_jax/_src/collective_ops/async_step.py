"""async_step: asynchronous model average's training step
(``csrc/sched/async_weights.h``) through the ``bagua_async_step`` FFI target
(``csrc/ffi/async_step.h``): the optimizer's updates of ``params`` moved onto
the weights the background loop averaged since, which it then holds. The
building block of the AsyncModelAverage transform
(``bagua_jax._src.async_average``), eagerly and inside ``jax.jit``."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bagua_jax import _compat
from bagua_jax._src import ffi
from bagua_jax._src.collective_ops.algorithm_step import refuse_batching

# (step, *params, *updates) -> (*new updates); the updates are updated in place.
async_step_p = _compat.define_primitive("bagua_async_step")
async_step_p.multiple_results = True


def async_step(
    step_number, params: Sequence[Any], updates: Sequence[Any], *, handle: int, per_device: bool = False
) -> list:
    """The step's updates at ``step_number`` (an int32 scalar) for the weights
    registered under ``handle`` (``_C.register_async_weights``), whose leaves
    ``params`` and ``updates`` are, in order. The weights are host memory, so
    any platform's arrays serve (the CUDA handler goes through host copies).
    ``per_device``: the call runs once per process under
    ``local_devices.run_once`` (``_compat.check_single_caller``)."""
    return list(async_step_p.bind(step_number, *params, *updates, handle=int(handle), per_device=bool(per_device)))


def _abstract_eval(step_number, *buffers, handle: int, per_device: bool):
    return [_compat.shaped_like(b) for b in buffers[len(buffers) // 2 :]]


def _lowering(ctx, step_number, *buffers, handle: int, per_device: bool):
    what = "transform (AsyncModelAverage)"
    platforms = _compat.lowering_platforms(ctx)
    ffi.check_lowerable(what, ffi.ASYNC_STEP, platforms)
    n = len(buffers) // 2
    return _compat.lower_ffi_with_token(
        ctx,
        ffi.ASYNC_STEP,
        step_number,
        *buffers,
        what=what,
        alias=False,
        aliases={1 + n + i: i for i in range(n)},  # operand 0 is the step number
        token_first=True,
        per_device=per_device,
        weights=np.int64(handle),
    )


def _no_autodiff(*args, **kwargs):
    raise NotImplementedError("bagua_jax.transform's weight averaging is not differentiable")


_compat.def_effectful_abstract_eval(async_step_p, _abstract_eval)
_compat.register_lowering(async_step_p, _lowering)
_compat.def_jvp(async_step_p, _no_autodiff)
_compat.def_batching(async_step_p, refuse_batching)
