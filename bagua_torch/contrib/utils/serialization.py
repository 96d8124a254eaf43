"""The byte format of cached samples: safe to read back from a shared server.

Contract: ``dumps(value)`` encodes nested None / bool / int / float / str /
bytes / list / tuple / dict / numpy arrays / torch tensors; ``loads(data)``
rebuilds them without running any code from ``data`` (no pickle). Any other
type raises ``TypeError`` unless the caller opts into pickle
(``allow_pickle=True`` on both sides): only then are such values pickled, and
only then are pickled parts of stored data unpickled.

Layout: ``b"BGC1"``, a little-endian uint32 header length, a JSON header
(the structure, arrays described as [kind, buffer index, dtype, shape]), then
the raw buffers back to back; the header lists each buffer's length.
"""

from __future__ import annotations

import json
import pickle
import struct
from typing import Any, List

import numpy as np
import torch

__all__ = ["dumps", "loads", "UnsafeDataError"]

MAGIC = b"BGC1"


class UnsafeDataError(ValueError):
    """Stored data holds pickled parts and the reader did not allow pickle."""


def dumps(value: Any, allow_pickle: bool = False) -> bytes:
    buffers: List[bytes] = []
    tree = _encode(value, buffers, allow_pickle)
    header = json.dumps({"v": tree, "b": [len(b) for b in buffers]}, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(header)), header, *buffers])


def loads(data: bytes, allow_pickle: bool = False) -> Any:
    view = memoryview(data)
    if bytes(view[:4]) != MAGIC:
        raise ValueError("not a Bagua cache record (bad magic)")
    (n,) = struct.unpack("<I", view[4:8])
    header = json.loads(bytes(view[8 : 8 + n]))
    buffers, offset = [], 8 + n
    for length in header["b"]:
        buffers.append(view[offset : offset + length])
        offset += length
    if offset != len(view):
        raise ValueError("corrupt Bagua cache record (length mismatch)")
    return _decode(header["v"], buffers, allow_pickle)


def _encode(v, buffers: List[bytes], allow_pickle: bool):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if type(v) is int else {"I": int(v)}
    if isinstance(v, float):
        return {"F": float.hex(float(v))}  # exact, and NaN / inf survive
    if isinstance(v, (bytes, bytearray)):
        buffers.append(bytes(v))
        return {"B": len(buffers) - 1}
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        if t.layout != torch.strided or t.is_quantized:
            return _pickled(v, buffers, allow_pickle)
        buffers.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"P": [len(buffers) - 1, str(t.dtype).replace("torch.", ""), list(t.shape)]}
    if isinstance(v, np.ndarray) and not v.dtype.hasobject:
        a = np.ascontiguousarray(v)
        buffers.append(a.tobytes())
        return {"A": [len(buffers) - 1, a.dtype.str, list(a.shape)]}
    if isinstance(v, np.generic) and not isinstance(v, np.object_):
        buffers.append(v.tobytes())
        return {"S": [len(buffers) - 1, v.dtype.str]}
    if type(v) is list:
        return {"L": [_encode(x, buffers, allow_pickle) for x in v]}
    if type(v) is tuple:
        return {"T": [_encode(x, buffers, allow_pickle) for x in v]}
    if type(v) is dict:
        return {"D": [[_encode(k, buffers, allow_pickle), _encode(x, buffers, allow_pickle)] for k, x in v.items()]}
    return _pickled(v, buffers, allow_pickle)


def _pickled(v, buffers, allow_pickle):
    if not allow_pickle:
        raise TypeError(
            f"cannot cache a value of type {type(v).__module__}.{type(v).__qualname__} safely: "
            "arrays, tensors, numbers, strings, bytes and lists/tuples/dicts of them are supported; "
            "pass allow_pickle=True to pickle other types (only for a cache you trust)"
        )
    buffers.append(pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL))
    return {"K": len(buffers) - 1}


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"corrupt Bagua cache record (unknown dtype {name!r})")
    return dt


def _decode(v, buffers, allow_pickle: bool):
    if not isinstance(v, dict):
        return v
    ((tag, x),) = v.items()
    if tag == "I":
        return x
    if tag == "F":
        return float.fromhex(x)
    if tag == "B":
        return bytes(buffers[x])
    if tag == "P":
        idx, dtype, shape = x
        raw = bytearray(buffers[idx])
        dt = _torch_dtype(dtype)
        if not raw:
            return torch.empty(shape, dtype=dt)
        return torch.frombuffer(raw, dtype=dt).reshape(shape)
    if tag == "A":
        idx, dtype, shape = x
        dt = np.dtype(dtype)
        if dt.hasobject:
            raise ValueError("corrupt Bagua cache record (object array)")
        return np.frombuffer(buffers[idx], dtype=dt).reshape(shape).copy()
    if tag == "S":
        idx, dtype = x
        return np.frombuffer(buffers[idx], dtype=np.dtype(dtype))[0]
    if tag == "L":
        return [_decode(e, buffers, allow_pickle) for e in x]
    if tag == "T":
        return tuple(_decode(e, buffers, allow_pickle) for e in x)
    if tag == "D":
        return {_decode(k, buffers, allow_pickle): _decode(e, buffers, allow_pickle) for k, e in x}
    if tag == "K":
        if not allow_pickle:
            raise UnsafeDataError(
                "this cache record holds pickled data; refusing to unpickle it "
                "(pass allow_pickle=True only for a cache you trust)"
            )
        return pickle.loads(bytes(buffers[x]))
    raise ValueError(f"corrupt Bagua cache record (unknown tag {tag!r})")
