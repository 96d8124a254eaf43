"""Loads the extension module.

The module is opened with RTLD_DEEPBIND so that its calls into the system Gloo
resolve to that library, even when torch has been loaded with RTLD_GLOBAL and
exports its own, incompatible copy of Gloo's symbols.

Except under a sanitizer (a build with -DBAGUA_SANITIZE=..., its runtime
preloaded): the runtimes intercept malloc, pthread and friends by being first in
the global symbol order, which RTLD_DEEPBIND bypasses, so they abort the dlopen.
Sanitized runs therefore load the module without it (and must not rely on torch's
Gloo staying out of the way).
"""

import ctypes
import importlib
import os
import sys


def _sanitizer_loaded() -> bool:
    """Whether a ThreadSanitizer or AddressSanitizer runtime is in the process."""
    process = ctypes.CDLL(None)
    return any(hasattr(process, name) for name in ("__tsan_init", "__asan_init"))


# A sanitizer runtime aborts a dlopen with RTLD_DEEPBIND (see the module docstring).
_deepbind = 0 if _sanitizer_loaded() else getattr(os, "RTLD_DEEPBIND", 0)
_flags = sys.getdlopenflags()
try:
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | _deepbind)
    _C = importlib.import_module("bagua_core._C")
finally:
    sys.setdlopenflags(_flags)
