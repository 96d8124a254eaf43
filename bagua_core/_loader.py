"""Loads the extension module.

The module is opened with RTLD_DEEPBIND so that its calls into the system Gloo
resolve to that library, even when torch has been loaded with RTLD_GLOBAL and
exports its own, incompatible copy of Gloo's symbols.
"""

import importlib
import os
import sys

_flags = sys.getdlopenflags()
try:
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0))
    _C = importlib.import_module("bagua_core._C")
finally:
    sys.setdlopenflags(_flags)
