"""Bagua 0.9.2's package paths, so scripts written for it run unchanged.

``import bagua.torch_api as bagua`` gives :mod:`bagua_torch` under the original
module names; ``python -m bagua.distributed.launch`` (and ``.run``) start jobs
with the original launcher flags through ``bagua-run``. Nothing here is a
second implementation: every name is the one of ``bagua_torch`` or
``bagua_core``. Importing this package loads neither torch nor the engine.
"""

from bagua_core import __version__

__all__ = ["__version__"]
