"""MinMaxUInt8 compression, the format of ByteGrad, QAdam and low-precision decentralized SGD.

An array of n elements is split into ``n_chunks`` equal chunks; each chunk becomes one record of
``record_nbytes(n // n_chunks)`` bytes (float32 min and max, then one uint8 code per element,
padded to 64 bytes), so records can be exchanged with alltoall/allgather as equal byte blocks.
The byte layout, the formula and the outcome for NaN/Inf inputs are defined in one place,
``csrc/kernels/minmax_uint8.h``. In short: a chunk holding NaN or +-Inf decodes to all NaN, a
constant chunk decodes exactly, and every other element decodes within half a quantisation step
``(max - min) / 255`` of its value.

The functions here work on host (CPU) arrays of any DLPack producer, borrowed without copying
(:func:`bagua_core.import_array`): numpy (bfloat16 as ``ml_dtypes.bfloat16``), torch (bfloat16
included), JAX CPU arrays and :class:`bagua_core.Buffer`. Outputs passed as ``out`` are written in
place and returned. Outputs allocated here are new :class:`bagua_core.Buffer` objects (64-byte
aligned, 1-D), which numpy, torch and JAX view without copying::

    c = compression.compress(x, 4)
    codes = np.from_dlpack(c)        # or c.numpy(); torch.from_dlpack(c); jax.numpy.from_dlpack(c)
"""

from typing import Any, Optional, Tuple

from bagua_core._loader import _C
from bagua_core.buffer import empty, zeros
from bagua_core.dlpack import DLPackView, import_array
from bagua_core.dtypes import DType, DTypeLike, as_dtype

__all__ = [
    "HEADER_NBYTES",
    "RECORD_ALIGN",
    "record_nbytes",
    "compressed_nbytes",
    "compress",
    "decompress",
    "reduce_chunks",
    "CPU_ISAS",
    "cpu_isa",
    "supported_cpu_isas",
    "set_cpu_isa",
]

HEADER_NBYTES = _C.minmax_uint8_header_nbytes
RECORD_ALIGN = _C.minmax_uint8_record_align

_FLOAT_DTYPES = (DType.float32, DType.float64, DType.float16, DType.bfloat16)
_HOST_DLPACK_DEVICES = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory)


def record_nbytes(chunk_len: int) -> int:
    """Bytes of one compressed chunk of ``chunk_len`` elements (header, codes, padding)."""
    return _C.minmax_uint8_record_nbytes(int(chunk_len))


def compressed_nbytes(n: int, n_chunks: int) -> int:
    """Bytes of the compressed form of ``n`` elements in ``n_chunks`` chunks.

    Raises ValueError unless ``n_chunks >= 1`` divides ``n``.
    """
    return _C.minmax_uint8_compressed_nbytes(int(n), int(n_chunks))


def compress(x: Any, n_chunks: int, out: Optional[Any] = None, target_chunk: int = -1) -> Any:
    """Compresses the flat contents of ``x`` (float32/float64/float16/bfloat16) into ``n_chunks`` records.

    ``out``: a writable contiguous uint8 array of ``compressed_nbytes(x.size, n_chunks)`` bytes, or
    None to allocate a uint8 :class:`~bagua_core.Buffer`. ``target_chunk=k`` computes and writes
    record k only; the other records of ``out`` are left as they were (zero when allocated here).
    Returns ``out``.
    """
    src = _host_view(x, "x")
    _check_float(src.dtype, "x")
    _check_aligned(src, "x")
    n = src.numel
    nbytes = compressed_nbytes(n, n_chunks)
    _check_target_chunk(target_chunk, n_chunks)
    result, dst = _output(out, DType.uint8, nbytes, zero=target_chunk != -1)
    _check_no_overlap(src, dst)
    _C.minmax_uint8_compress(src.address, n, int(src.dtype), int(n_chunks), dst.address, int(target_chunk))
    return result


def decompress(
    c: Any, n: int, dtype: DTypeLike, n_chunks: int, out: Optional[Any] = None, target_chunk: int = -1
) -> Any:
    """Decodes ``n_chunks`` records in ``c`` (uint8) into ``n`` elements of ``dtype``.

    ``dtype``: anything :func:`bagua_core.as_dtype` accepts ("float16", np.float32, torch.bfloat16...).
    ``out``: a writable contiguous array of ``n`` elements of ``dtype``, or None to allocate a
    :class:`~bagua_core.Buffer`. ``target_chunk=k`` decodes chunk k only, into its place in ``out``
    (the rest of ``out`` is left as it was; zero when allocated here). Returns ``out``.
    """
    dtype = _check_float(_as_dtype(dtype), "dtype")
    n = int(n)
    src = _compressed_view(c, compressed_nbytes(n, n_chunks))
    _check_target_chunk(target_chunk, n_chunks)
    result, dst = _output(out, dtype, n, zero=target_chunk != -1)
    _check_no_overlap(src, dst)
    _C.minmax_uint8_decompress(src.address, n, int(dtype), int(n_chunks), dst.address, int(target_chunk))
    return result


def reduce_chunks(
    c: Any, chunk_len: int, n_records: int, dtype: DTypeLike, average: bool = True, out: Optional[Any] = None
) -> Any:
    """Decodes ``n_records`` records of ``chunk_len`` elements each (one per peer) and reduces them.

    Sums in float32 (record 0 first), divides by ``n_records`` when ``average``, and writes
    ``chunk_len`` elements of ``dtype`` to ``out`` (a new :class:`~bagua_core.Buffer` when None).
    Returns ``out``.
    """
    dtype = _check_float(_as_dtype(dtype), "dtype")
    chunk_len, n_records = int(chunk_len), int(n_records)
    if chunk_len < 0 or n_records < 1:
        raise ValueError(f"reduce_chunks needs chunk_len >= 0 and n_records >= 1, got {chunk_len} and {n_records}")
    src = _compressed_view(c, n_records * record_nbytes(chunk_len))
    result, dst = _output(out, dtype, chunk_len, zero=False)
    _check_no_overlap(src, dst)
    _C.minmax_uint8_reduce_chunks(src.address, chunk_len, n_records, int(dtype), bool(average), dst.address)
    return result


# ---- array checks ------------------------------------------------------------------------------


CPU_ISAS = ("baseline", "avx2", "avx512")


def cpu_isa() -> str:
    """The instruction set the host kernels (compression, low-rank products) use now: "baseline", "avx2" or
    "avx512".

    By default the best this CPU supports; every choice gives bitwise the same results."""
    return _C.cpu_isa()


def supported_cpu_isas() -> Tuple[str, ...]:
    """The instruction sets of CPU_ISAS that this CPU and OS run."""
    return tuple(name for name in CPU_ISAS if _C.cpu_isa_supported(name))


def set_cpu_isa(name: str) -> None:
    """Makes the host kernels use ``name`` (one of :func:`supported_cpu_isas`), for every thread,
    from now on: for tests and benchmarks that compare them. Raises ValueError otherwise."""
    _C.set_cpu_isa(str(name))


def _host_view(x, what, expected=""):
    """A DLPackView of a host array; TypeError for device arrays, non-arrays and unsupported dtypes."""
    device = getattr(x, "__dlpack_device__", None)
    if device is not None and int(device()[0]) not in _HOST_DLPACK_DEVICES:
        raise TypeError(_device_message(what, f"DLPack device type {int(device()[0])}"))
    try:
        view = import_array(x)
    except TypeError as e:
        raise TypeError(f"{what} must be {expected or 'a CPU array supporting DLPack'}: {e}") from e
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from e  # e.g. not contiguous
    if view.device_type != "cpu":
        raise TypeError(_device_message(what, f"{view.device_type} memory"))
    return view


def _device_message(what, where):
    return (
        f"{what} is not in host memory ({where}); these functions take CPU arrays. CUDA compression "
        "takes device addresses: _C.minmax_uint8_compress_cuda / _decompress_cuda / _reduce_chunks_cuda"
    )


def _as_dtype(dtype):
    try:
        return as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"MinMaxUInt8 compression needs float32, float64, float16 or bfloat16 dtype: {e}") from e


def _check_float(dtype, what):
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"MinMaxUInt8 compression needs float32, float64, float16 or bfloat16 {what}, got {dtype.name}")
    return dtype


def _check_aligned(view, what):
    if view.address % view.dtype.itemsize:
        raise ValueError(f"{what} must be aligned to its element size ({view.dtype.itemsize} bytes)")


def _check_target_chunk(target_chunk, n_chunks):
    if not (target_chunk == -1 or 0 <= target_chunk < n_chunks):
        raise ValueError(f"target_chunk must be -1 (all chunks) or in [0, {n_chunks}), got {target_chunk}")


def _output(out, dtype, count, zero):
    """(the object to return, its view): ``out`` checked, or a new Buffer of ``count`` elements."""
    if out is None:
        buf = (zeros if zero else empty)(count, dtype)
        return buf, import_array(buf)
    view = _host_view(out, "out", f"a {dtype.name} array")
    if view.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype.name}, got {view.dtype.name}")
    if view.numel != count:
        raise ValueError(f"out must have {count} elements, got {view.numel}")
    if view.read_only:
        raise ValueError(f"out must be writable ({type(out).__name__} is read-only; JAX arrays are immutable)")
    _check_aligned(view, "out")
    return out, view


def _compressed_view(c, nbytes):
    view = _host_view(c, "compressed data", "a uint8 array")
    if view.dtype != DType.uint8:
        raise TypeError(f"compressed data must be a uint8 array, got {view.dtype.name}")
    if view.numel != nbytes:
        raise ValueError(f"compressed data must have {nbytes} bytes, got {view.numel}")
    return view


def _check_no_overlap(src: DLPackView, dst: DLPackView):
    if src.nbytes and dst.nbytes and src.address < dst.address + dst.nbytes and dst.address < src.address + src.nbytes:
        raise ValueError("out must not overlap the input")
