"""torchft's Lighthouse client, without torch: the one place that reaches into
torchft's private extension.

``torchft._torchft`` (Rust; links no torch) holds ``LighthouseClient``; the
package's ``__init__`` imports torch, which a JAX-only worker must not need.
So the extension file is loaded on its own, under its own name. Needs
``torchft==0.2.0`` installed (``pip install 'bagua[ft]'``); the Lighthouse
service itself is torchft's ``torchft_lighthouse`` command.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_NAME = "torchft._torchft"


def extension():
    """The ``torchft._torchft`` module (loaded once)."""
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("torchft")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "per-step fault tolerance needs torchft's Lighthouse client: pip install 'bagua[ft]' (torchft==0.2.0)"
        )
    for folder in spec.submodule_search_locations:
        for name in sorted(os.listdir(folder)):
            if name.startswith("_torchft.") and name.endswith(".so"):
                path = os.path.join(folder, name)
                loader = importlib.machinery.ExtensionFileLoader(_NAME, path)
                module_spec = importlib.util.spec_from_file_location(_NAME, path, loader=loader)
                module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
                loader.exec_module(module)
                sys.modules[_NAME] = module
                return module
    raise ImportError(f"torchft is installed in {spec.submodule_search_locations} but has no _torchft extension")
