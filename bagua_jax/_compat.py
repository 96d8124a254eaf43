"""The one place where bagua_jax touches JAX's private or semi-private API.

Everything JAX may move between releases is imported or wrapped here, so a JAX
upgrade means editing this file only. Checked against jax 0.10.

Why private API at all: ``jax.ffi.ffi_call(..., has_side_effect=True)`` only
attaches an *unordered* effect, which stops XLA from deleting the call but not
from reordering it. Collectives must run in the same order on every rank even
when they are data-independent (two allreduces of unrelated gradients), or the
ranks pair up different operations. JAX has no public way to give an FFI call
an ordered effect, so - as mpi4jax does - we define a primitive with an
*ordered* effect: JAX then threads one XLA token through every such primitive
of a program (and across jitted calls at run time), and the lowering passes
that token in and out of the FFI call, which fixes the order.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import jax
from jax._src import (
    clusters as _clusters,
    core as _core,
    dispatch as _dispatch,
    distributed as _distributed,
    effects as _effects,
    mesh as _mesh,
    sharding_impls as _sharding_impls,
)
from jax.extend.core import Primitive  # re-exported
from jax.interpreters import ad, batching, mlir

ShapedArray = _core.ShapedArray
abstract_token = _core.abstract_token

# Autodiff pieces used by the JVP and transpose rules.
Zero = ad.Zero
instantiate_zeros = ad.instantiate_zeros


def is_zero(t: Any) -> bool:
    """A symbolic zero tangent/cotangent (no value, nothing to communicate)."""
    return type(t) is ad.Zero


def zero_tangent_like(value: Any) -> Any:
    """The symbolic zero tangent of ``value``."""
    if hasattr(ad.Zero, "from_primal_value"):  # older jax
        return ad.Zero.from_primal_value(value)
    return ad.Zero(_core.typeof(value).to_tangent_aval())


@dataclasses.dataclass(frozen=True)
class CollectiveEffect(_effects.Effect):
    """Ordered effect shared by every bagua collective in a process.

    One effect (hence one token chain) for all process groups: collectives keep
    program order across groups as well, which is what each rank's peers expect.
    """

    def __str__(self) -> str:
        return "BaguaCollective"


def _register_ordered_effect(effect_type: type) -> Any:
    _effects.lowerable_effects.add_type(effect_type)
    _effects.ordered_effects.add_type(effect_type)
    # Allowed inside lax.cond/while/scan bodies, custom_jvp/vjp and remat.
    _effects.control_flow_allowed_effects.add_type(effect_type)
    _effects.custom_derivatives_allowed_effects.add_type(effect_type)
    _effects.remat_allowed_effects.add_type(effect_type)
    # Allowed in programs over several devices of this process: there, every
    # call runs on one device only (bagua_jax._src.local_devices), so the
    # ranks still see one chain of collectives.
    _effects.shardable_ordered_effects.add_type(effect_type)
    return effect_type()


collective_effect = _register_ordered_effect(CollectiveEffect)


def shaped_like(aval: Any, shape: Optional[Sequence[int]] = None) -> Any:
    """An output aval of ``aval``'s dtype (and shape unless given) that keeps
    its varying manual axes (``vma``), so shard_map's checks accept it."""
    vma = getattr(aval, "vma", None)
    shape = tuple(aval.shape if shape is None else shape)
    return ShapedArray(shape, aval.dtype) if vma is None else ShapedArray(shape, aval.dtype, vma=vma)


def define_primitive(name: str) -> Primitive:
    """A primitive evaluated eagerly by compiling it alone (like jax.lax ops)."""
    prim = Primitive(name)
    prim.def_impl(functools.partial(_dispatch.apply_primitive, prim))
    return prim


def def_effectful_abstract_eval(prim: Primitive, rule: Callable[..., Any]) -> None:
    """``rule`` returns the output aval; the collective effect is added here."""

    def with_effect(*avals, **params):
        return rule(*avals, **params), {collective_effect}

    prim.def_effectful_abstract_eval(with_effect)


def def_jvp(prim: Primitive, rule: Callable[..., Any]) -> None:
    ad.primitive_jvps[prim] = rule


def def_transpose(prim: Primitive, rule: Callable[..., Any]) -> None:
    ad.primitive_transposes[prim] = rule


def def_batching(prim: Primitive, rule: Callable[..., Any]) -> None:
    batching.primitive_batchers[prim] = rule


def register_lowering(prim: Primitive, rule: Callable[..., Any]) -> None:
    """One rule for every platform; the rule checks the platform itself, so an
    array on the wrong device gets our error rather than 'no lowering rule'."""
    mlir.register_lowering(prim, rule)


def cuda_device_index() -> int:
    """The CUDA ordinal of this process's first local GPU (JAX device ids are
    not CUDA ordinals). RuntimeError when JAX has no GPU backend."""
    import jax

    device = jax.local_devices(backend="gpu")[0]
    return int(getattr(device, "local_hardware_id", None) or 0)


def check_single_caller(ctx: Any, what: str, per_device: bool) -> None:
    """Refuses an FFI call that XLA would run on several devices of this
    process at once (each one joining the collective as the same rank).

    ``per_device``: the call was made inside shard_map under a guard that lets
    one device of the process run it (bagua_jax._src.local_devices)."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
        if per_device:
            return
        raise NotImplementedError(
            f"bagua_jax.{what}: cannot run inside shard_map, where every device of the process would "
            "call it; use bagua_jax.transform(..., axis_name=...) inside shard_map, or call it outside"
        )
    if isinstance(axis_context, _sharding_impls.ShardingContext) and axis_context.num_devices > 1:
        raise NotImplementedError(
            f"bagua_jax.{what}: the arrays span {axis_context.num_devices} devices of this process; "
            "Bagua communicates once per process: pass mesh=your_mesh to bagua_jax.transform "
            "(global arrays under jax.jit), or axis_name=... inside shard_map"
        )


def manual_axes() -> Tuple[str, ...]:
    """The mesh axes a surrounding shard_map has made manual (none outside one)."""
    return tuple(getattr(_mesh.get_abstract_mesh(), "manual_axes", ()) or ())


def lowering_platforms(ctx: Any) -> Sequence[str]:
    """Platforms being lowered for, e.g. ('cpu',) or ('cuda',)."""
    return tuple(ctx.platforms or ctx.module_context.platforms)


def lower_ffi_with_token(
    ctx: Any,
    target: str,
    *operands: Any,
    what: str,
    alias: bool,
    aliases: Optional[dict] = None,
    token_first: bool = False,
    per_device: bool = False,
    **attributes: Any,
) -> Any:
    """Emits the FFI call ``target(*operands, token) -> (*results, token)``
    (one result per output aval of ``ctx``); with ``token_first``,
    ``target(token, *operands) -> (token, *results)``, for targets whose
    operands end in a variable number of buffers.

    The token comes from the lowering context (the previous collective's) and
    the new one is handed back to JAX, which chains it into the next collective.
    With ``alias`` the first result reuses the first operand's buffer (no copy
    when the operand is donated; XLA inserts one otherwise); ``aliases``
    ({operand index: result index}, not counting the token) adds more such pairs.
    ``what`` names the call in errors; ``per_device``: see check_single_caller.
    """
    check_single_caller(ctx, what, per_device)
    token = ctx.tokens_in.get(collective_effect)
    pairs = dict(aliases or {})
    if alias:
        pairs[0] = 0
    if token_first:
        pairs = {i + 1: o + 1 for i, o in pairs.items()}
        token_ctx = ctx.replace(avals_in=[abstract_token, *ctx.avals_in], avals_out=[abstract_token, *ctx.avals_out])
    else:
        token_ctx = ctx.replace(avals_in=[*ctx.avals_in, abstract_token], avals_out=[*ctx.avals_out, abstract_token])
    rule = jax.ffi.ffi_lowering(
        target,
        has_side_effect=True,
        operand_output_aliases=pairs or None,
    )
    if token_first:
        token_out, *results = rule(token_ctx, token, *operands, **attributes)
    else:
        *results, token_out = rule(token_ctx, *operands, token, **attributes)
    ctx.set_tokens_out(mlir.TokenSet({collective_effect: token_out}))
    return list(results)


def ffi_lowering(target: str, **kwargs: Any) -> Callable[..., Any]:
    """The lowering rule of an FFI call without a token (public API)."""
    return jax.ffi.ffi_lowering(target, **kwargs)


def lower_fun(fun: Callable[..., Any]) -> Callable[..., Any]:
    """A lowering rule that lowers ``fun`` (returning a list) in place of a primitive."""
    return mlir.lower_fun(fun, multiple_results=True)


def register_ffi_target(name: str, capsule: Any, platform: str) -> None:
    """Registers a typed-FFI handler for ``platform`` ("cpu" or "CUDA").

    Public API. For a platform whose plugin is not loaded (the CUDA handlers on
    a CPU-only jaxlib) JAX keeps the registration pending and hands it over if
    the plugin loads later; nothing fails (tests/jax/test_jax_cuda_registration.py).
    """
    jax.ffi.register_ffi_target(name, capsule, platform=platform, api_version=1)


# jax.distributed's cluster environments: subclasses are detected when
# defined, and jax.distributed.initialize() without arguments asks them.
ClusterEnv = _clusters.ClusterEnv


def jax_coordinator_address() -> Optional[str]:
    """The coordinator's "host:port" once jax.distributed is initialised, else None."""
    if not jax.distributed.is_initialized():
        return None
    return getattr(_distributed.global_state, "coordinator_address", None)


def reset_effect_tokens() -> None:
    """Forgets the ordered-effect tokens JAX threads from one jitted call to
    the next (``dispatch.runtime_tokens``). After a collective failed, its
    token carries the error into every later call with the same effect; a
    live job that rebuilt its group starts a new chain (its old group's calls
    have all ended: ``jax.effects_barrier()`` first)."""
    _dispatch.runtime_tokens.clear()
