"""Checkpoint files a crash never leaves half written, and the manifests
that verify them; shared by ``bagua_torch.checkpoint`` and
``bagua_jax.checkpoint``.

A file is written to ``NAME.tmp``, flushed to disk (fsync), renamed and its
directory synced, so a file under its real name is whole. A manifest lists
files with their sizes and CRC-32s; a loader compares what it reads against
it, so a truncated, zeroed or altered file is found rather than loaded.
"""

from __future__ import annotations

import os
import zlib
from typing import Dict, Optional


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: str, data: bytes) -> int:
    """``data`` to ``path``, whole or not at all (tmp, fsync, rename); returns its CRC-32."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)
    return zlib.crc32(data)


def problem_of_bytes(name: str, data: bytes, entry: Optional[Dict[str, int]]) -> Optional[str]:
    """Why ``data`` (file ``name``) is not what its manifest entry describes (None: it is)."""
    if entry is None:
        return f"{name} is not in the manifest"
    if len(data) != entry["size"]:
        return f"{name} has {len(data)} bytes, the manifest says {entry['size']}"
    if zlib.crc32(data) != entry["crc32"]:
        return f"{name} fails its checksum (CRC-32 {zlib.crc32(data):08x}, expected {entry['crc32']:08x})"
    return None


def tree_entries(directory: str) -> Dict[str, Dict[str, int]]:
    """Every file under ``directory`` (names relative to it) with its size and CRC-32."""
    entries: Dict[str, Dict[str, int]] = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                data = f.read()
            entries[os.path.relpath(path, directory)] = {"size": len(data), "crc32": zlib.crc32(data)}
    return entries


def problem_of_tree(directory: str, entries: Dict[str, Dict[str, int]]) -> Optional[str]:
    """Why the files under ``directory`` are not those ``entries`` list (None: they are)."""
    found = set()
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory)
            found.add(rel)
            with open(path, "rb") as f:
                problem = problem_of_bytes(rel, f.read(), entries.get(rel))
            if problem:
                return problem
    missing = sorted(set(entries) - found)
    return f"{missing[0]} is missing" if missing else None
