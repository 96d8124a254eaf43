"""Registers the engine's XLA FFI handlers with JAX, once per process.

The handlers live in the extension module (csrc/ffi/); ``_C.ffi_targets()``
returns them as capsules grouped by platform: "cpu" always, "CUDA" when the
module was built with CUDA (``_C.has_cuda_ffi``; csrc/ffi/cuda_handlers.cc).
Every platform registers the same target names, so a collective's lowering
does not depend on the platform (except ``bagua_leader_broadcast``, CPU only:
on GPUs XLA's collective-broadcast does its work).

Registering the CUDA handlers with a jaxlib that has no CUDA plugin is
harmless: JAX keeps registrations for a platform it has not loaded and hands
them over if that platform's plugin loads later.
"""

from __future__ import annotations

import threading

from bagua_core import _C
from bagua_jax import _compat

ALLREDUCE = "bagua_allreduce"
BROADCAST = "bagua_broadcast"
ALLGATHER = "bagua_allgather"
STEP = "bagua_step"  # algorithm steps on a bucket's leaves (csrc/ffi/xla_step_adapter.h)
ASYNC_STEP = "bagua_async_step"  # asynchronous model average's training step (csrc/ffi/async_step.h)
LEADER_BROADCAST = "bagua_leader_broadcast"  # CPU only: one device's arrays to the others (csrc/ffi/leader_broadcast.h)

# jax.ffi spells the platforms "cpu" and "CUDA"; lowering contexts say "cuda".
_JAX_PLATFORM = {"cpu": "cpu", "CUDA": "cuda", "cuda": "cuda"}

HAS_CUDA_HANDLERS = bool(getattr(_C, "has_cuda_ffi", False))

_lock = threading.Lock()
_registered: dict = {}


def register_targets() -> dict:
    """{lowering platform: set of target names}; idempotent."""
    with _lock:
        if _registered:
            return _registered
        if not getattr(_C, "has_xla_ffi", False):
            raise ImportError(
                "bagua_core was built without XLA FFI handlers (jax was not importable "
                "when it was built); reinstall bagua with jax installed"
            )
        registered: dict = {}
        for platform, targets in _C.ffi_targets().items():
            if platform == "CUDA" and not HAS_CUDA_HANDLERS:
                continue
            for name, capsule in targets.items():
                _compat.register_ffi_target(name, capsule, platform=platform)
                registered.setdefault(_JAX_PLATFORM[platform], set()).add(name)
        _registered.update(registered)
        return _registered


def check_lowerable(name: str, target: str, platforms) -> None:
    """Raises a clear error when no handler exists for a lowering platform."""
    have = register_targets()
    for p in platforms:
        if target not in have.get(p, ()):
            raise NotImplementedError(
                f"bagua_jax.{name}: no {p} implementation in this build (available on: {', '.join(sorted(have))})"
            )
