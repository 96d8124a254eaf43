"""Core-owned memory: :class:`Buffer` and its constructors.

A Buffer is host memory (64-byte aligned, so JAX views it instead of copying)
or CUDA memory, owned by the engine and exported through DLPack::

    buf = bagua_core.zeros((2, 3), "float32")
    a = np.from_dlpack(buf)          # or buf.numpy()
    t = torch.from_dlpack(buf)       # same memory
    j = jax.numpy.from_dlpack(buf)   # same memory (j.unsafe_buffer_pointer() == buf.address)

The memory lives as long as the buffer or any view of it. Primitives called
with ``recv=None`` return a Buffer holding the result.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

from bagua_core._loader import _C
from bagua_core.dlpack import import_array
from bagua_core.dtypes import DTypeLike, as_dtype

Buffer = _C.Buffer

Shape = Union[int, Sequence[int]]


def _shape(shape: Shape) -> list:
    if isinstance(shape, int):
        return [shape]
    return [int(d) for d in shape]


def empty(shape: Shape, dtype: DTypeLike = "float32", device: str = "cpu", device_index: int = 0) -> Buffer:
    """An uninitialised buffer."""
    return Buffer(_shape(shape), as_dtype(dtype), device, device_index, False)


def zeros(shape: Shape, dtype: DTypeLike = "float32", device: str = "cpu", device_index: int = 0) -> Buffer:
    """A zero-filled buffer."""
    return Buffer(_shape(shape), as_dtype(dtype), device, device_index, True)


def from_array(array: Any) -> Buffer:
    """A core-owned copy of any DLPack array (e.g. a writable copy of a JAX array)."""
    view = import_array(array)
    out = Buffer(list(view.shape), view.dtype, view.device_type, view.device_index, False)
    _C.copy_memory(out.address, view.address, view.nbytes, view.device_type)
    return out
