"""Finds the NCCL library (``libnccl.so.2``) that NCCL communicators load.

Bagua opens NCCL at run time by full path (a soname alone fails unless its
directory is on the loader path). The path is resolved in this order:

1. an explicit path: the ``library`` argument, else ``BAGUA_NCCL_LIBRARY``
   (read through :mod:`bagua_core.config`); a directory is searched for
   ``libnccl.so.2``;
2. the ``nvidia-nccl-cu13`` / ``nvidia-nccl-cu12`` wheel
   (``nvidia/nccl/lib/libnccl.so.2``, found without importing torch);
3. a ``libnccl.so*`` already mapped into this process (e.g. the one torch
   loaded), so that the process uses one NCCL, not two.

When none is found, :class:`NcclNotFoundError` lists what was tried.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional, Sequence

from bagua_core import config
from bagua_core._loader import _C

LIBRARY_NAME = "libnccl.so.2"


class NcclNotFoundError(_C.BaguaError):
    """No usable NCCL library was found."""


def _in_directory(directory: str) -> Optional[str]:
    path = os.path.join(directory, LIBRARY_NAME)
    return path if os.path.isfile(path) else None


def wheel_candidates(search_path: Optional[Sequence[str]] = None) -> List[str]:
    """``nvidia/nccl/lib`` directories of installed nvidia-nccl wheels.

    ``search_path`` defaults to ``sys.path``; ``nvidia`` is a namespace
    package shared by many wheels, so every entry is looked at.
    """
    dirs: List[str] = []
    if search_path is None:
        try:
            spec = importlib.util.find_spec("nvidia.nccl")
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            dirs.extend(os.path.join(loc, "lib") for loc in (spec.submodule_search_locations or []))
        search_path = sys.path
    for entry in search_path:
        if entry:
            dirs.append(os.path.join(entry, "nvidia", "nccl", "lib"))
    seen, out = set(), []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def mapped_libraries(maps_text: str) -> List[str]:
    """Paths of ``libnccl.so*`` files in the text of a ``/proc/<pid>/maps`` file."""
    out: List[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if os.path.basename(path).startswith("libnccl.so") and path not in out:
            out.append(path)
    return out


def _read_own_maps() -> str:
    try:
        with open("/proc/self/maps", "r") as f:
            return f.read()
    except OSError:
        return ""


def find_library(library: Optional[str] = None, *, env=None,
                 search_path: Optional[Sequence[str]] = None,
                 maps_text: Optional[str] = None) -> str:
    """Full path of the NCCL library to load (see the module docstring).

    ``env``, ``search_path`` and ``maps_text`` replace the process environment,
    ``sys.path`` and ``/proc/self/maps`` (for tests). Raises
    :class:`NcclNotFoundError` listing every place looked at.
    """
    explicit = library or config.load(env).nccl_library
    if explicit:
        source = "library argument" if library else "BAGUA_NCCL_LIBRARY"
        if os.path.isdir(explicit):
            found = _in_directory(explicit)
            if found:
                return found
            raise NcclNotFoundError(f"{source}={explicit!r} is a directory without {LIBRARY_NAME}")
        if not os.path.isfile(explicit):
            raise NcclNotFoundError(f"{source}={explicit!r} does not exist")
        return os.path.abspath(explicit)

    tried = ["BAGUA_NCCL_LIBRARY: not set"]
    for d in wheel_candidates(search_path):
        found = _in_directory(d)
        if found:
            return found
    tried.append("nvidia-nccl wheel: no nvidia/nccl/lib/libnccl.so.2 on sys.path")

    mapped = [p for p in mapped_libraries(_read_own_maps() if maps_text is None else maps_text)
              if os.path.isfile(p)]
    if mapped:
        return mapped[0]
    tried.append("this process: no libnccl.so* loaded (e.g. by torch)")

    raise NcclNotFoundError(
        "cannot find the NCCL library (libnccl.so.2). Tried: " + "; ".join(tried) + ". "
        "Fix: pip install 'bagua[gpu]' (the nvidia-nccl wheel), or set BAGUA_NCCL_LIBRARY "
        "to the full path of libnccl.so.2.")


def version(library: Optional[str] = None) -> int:
    """NCCL version code of the library :func:`find_library` resolves (e.g. 22907)."""
    return _C.nccl_version(find_library(library))


def version_string(code: int) -> str:
    """``22907`` -> ``"2.29.7"`` (NCCL's encoding changed at 2.9)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def create_communicator(store, prefix: str, rank: int, size: int, device: int,
                        timeout_s: Optional[float] = None, library: Optional[str] = None,
                        native_avg: bool = True):
    """An NCCL communicator (``_C.Communicator``), collective over ``size`` ranks.

    ``timeout_s`` defaults to ``BAGUA_TIMEOUT`` and ``library`` to
    :func:`find_library`. Operations enqueue on the caller's CUDA stream and
    return; the caller synchronizes (see csrc/comm/nccl/nccl_communicator.h).
    """
    if not _C.built_with_cuda:
        raise _C.BaguaError("bagua_core was built without CUDA: NCCL communicators are unavailable")
    if timeout_s is None:
        timeout_s = config.load().timeout_s
    return _C.create_nccl_communicator(store, prefix, rank, size, device, timeout_s,
                                       find_library(library), native_avg)
