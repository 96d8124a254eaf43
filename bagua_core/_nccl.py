"""Finds the NCCL library (``libnccl.so.2``) that NCCL communicators load.

Bagua opens NCCL at run time by full path (a soname alone fails unless its
directory is on the loader path). A process uses one NCCL library: two copies
in one process (torch's and another) would each keep their own state and
threads. The path is resolved in this order (:data:`ORDER`):

1. ``"process"``: a ``libnccl.so*`` already mapped into this process, i.e. the
   one torch loaded (found in ``/proc/self/maps``, without importing torch);
   a ``library`` argument or ``BAGUA_NCCL_LIBRARY`` naming another file is then
   ignored, with a warning;
2. ``"setting"``: an explicit path: the ``library`` argument, else
   ``BAGUA_NCCL_LIBRARY`` (read through :mod:`bagua_core.config`); a directory
   is searched for ``libnccl.so.2``;
3. ``"wheel"``: the ``nvidia-nccl-cu13`` / ``nvidia-nccl-cu12`` wheel
   (``nvidia/nccl/lib/libnccl.so.2`` on ``sys.path``).

When none is found, :class:`NcclNotFoundError` lists what was tried and the
three ways to supply NCCL (:data:`HOW_TO_SUPPLY`). Once a communicator loaded
a library (:func:`process_library`), every later communicator of the process
uses that one; asking for another raises.

The library's version is checked when it is loaded (``_C.nccl_check_library``,
csrc/comm/nccl/nccl_library.h): at least 2.14 (non-blocking communicators and
``ncclConfig_t``) and major version 2, whose ``ncclConfig_t`` layout (fields
up to 2.28's) csrc passes; anything else is refused with both versions named.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import List, Optional, Sequence

from bagua_core import config, log
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


ORDER = ("process", "setting", "wheel")

HOW_TO_SUPPLY = (
    "supply NCCL in one of three ways: import torch (a CUDA build) before Bagua creates the group, so the "
    "NCCL torch loaded in this process is used; pip install the nvidia-nccl wheel (nvidia-nccl-cu13, or "
    "'bagua[gpu]'); or set BAGUA_NCCL_LIBRARY to the full path of libnccl.so.2"
)


def _explicit(library: Optional[str], env) -> tuple:
    """(path or None, where it came from)."""
    if library:
        return library, "library argument"
    return config.load(env).nccl_library, "BAGUA_NCCL_LIBRARY"


def _resolve_explicit(explicit: str, source: str) -> str:
    if os.path.isdir(explicit):
        found = _in_directory(explicit)
        if found:
            return found
        raise NcclNotFoundError(f"{source}={explicit!r} is a directory without {LIBRARY_NAME}")
    if not os.path.isfile(explicit):
        raise NcclNotFoundError(f"{source}={explicit!r} does not exist")
    return os.path.abspath(explicit)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def find_library(
    library: Optional[str] = None,
    *,
    env=None,
    search_path: Optional[Sequence[str]] = None,
    maps_text: Optional[str] = None,
) -> str:
    """Full path of the NCCL library to load, in the order of :data:`ORDER`
    (see the module docstring).

    ``env``, ``search_path`` and ``maps_text`` replace the process environment,
    ``sys.path`` and ``/proc/self/maps`` (for tests). Raises
    :class:`NcclNotFoundError` listing every place looked at.
    """
    explicit, source = _explicit(library, env)
    tried = []
    mapped = [p for p in mapped_libraries(_read_own_maps() if maps_text is None else maps_text) if os.path.isfile(p)]
    if mapped:
        chosen = mapped[0]
        others = [p for p in mapped[1:] if not _same_file(p, chosen)]
        if others:
            log.logger.warning(
                "bagua: this process has several NCCL libraries mapped (%s); using %s",
                ", ".join([chosen] + others),
                chosen,
            )
        if explicit:
            try:
                wanted = _resolve_explicit(explicit, source)
            except NcclNotFoundError:
                wanted = None
            if wanted is None or not _same_file(wanted, chosen):
                log.logger.warning(
                    "bagua: %s=%r is ignored: this process already loaded NCCL from %s (e.g. "
                    "torch did), and one process uses one NCCL",
                    source,
                    explicit,
                    chosen,
                )
        return chosen
    tried.append("this process: no libnccl.so* loaded (e.g. by torch)")

    if explicit:
        return _resolve_explicit(explicit, source)
    tried.append("BAGUA_NCCL_LIBRARY: not set")

    for d in wheel_candidates(search_path):
        found = _in_directory(d)
        if found:
            return found
    tried.append("nvidia-nccl wheel: no nvidia/nccl/lib/libnccl.so.2 on sys.path")

    raise NcclNotFoundError(
        "cannot find the NCCL library (libnccl.so.2). Tried, in order: " + "; ".join(tried) + ". "
        "Fix: " + HOW_TO_SUPPLY + " (pip install 'bagua[gpu]' installs the wheel)."
    )


_process_library: Optional[str] = None


def process_library() -> Optional[str]:
    """The NCCL library this process's communicators use (None before the first one)."""
    return _process_library


def check_library(path: str) -> int:
    """Loads ``path`` as a communicator would and returns its version code;
    raises ``BaguaError`` for a library that is too old, of another major
    version than the ``ncclConfig_t`` layout csrc uses, or not NCCL."""
    return _C.nccl_check_library(path)


def library_for_communicators(library: Optional[str] = None) -> str:
    """The library a new communicator loads: the process's once one was
    loaded (asking for another raises ``BaguaError``), else
    :func:`find_library`, version-checked."""
    global _process_library
    if _process_library is not None:
        if library and not _same_file(_resolve_explicit(library, "library argument"), _process_library):
            raise _C.BaguaError(
                f"this process already uses the NCCL library {_process_library}; it cannot "
                f"load {library} as well (one NCCL library per process)"
            )
        return _process_library
    path = find_library(library)
    check_library(path)
    _process_library = path
    return path


def version(library: Optional[str] = None) -> int:
    """NCCL version code of the library :func:`find_library` resolves (e.g. 22907)."""
    return _C.nccl_version(find_library(library))


def version_string(code: int) -> str:
    """``22907`` -> ``"2.29.7"`` (NCCL's encoding changed at 2.9)."""
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def create_communicator(
    store,
    prefix: str,
    rank: int,
    size: int,
    device: int,
    timeout_s: Optional[float] = None,
    library: Optional[str] = None,
    native_avg: bool = True,
):
    """An NCCL communicator (``_C.Communicator``), collective over ``size`` ranks.

    ``timeout_s`` defaults to ``BAGUA_TIMEOUT`` and ``library`` to
    :func:`library_for_communicators`. Operations enqueue on the caller's CUDA stream and
    return; the caller synchronizes (see csrc/comm/nccl/nccl_communicator.h).
    """
    if not _C.built_with_cuda:
        raise _C.BaguaError("bagua_core was built without CUDA: NCCL communicators are unavailable")
    if timeout_s is None:
        timeout_s = config.load().timeout_s
    return _C.create_nccl_communicator(
        store, prefix, rank, size, device, timeout_s, library_for_communicators(library), native_avg
    )
