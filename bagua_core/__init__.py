"""Bagua engine: process groups, communicators and collectives on any DLPack array.

This package imports neither torch nor jax; the frontends ``bagua_torch`` and
``bagua_jax`` build on it.
"""

from bagua_core._loader import _C  # noqa: F401  (loads the extension safely)

__version__ = "0.1.0"
