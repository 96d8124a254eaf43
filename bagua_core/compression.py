"""MinMaxUInt8 compression, the format of ByteGrad, QAdam and low-precision decentralized SGD.

An array of n elements is split into ``n_chunks`` equal chunks; each chunk becomes one record of
``record_nbytes(n // n_chunks)`` bytes (float32 min and max, then one uint8 code per element,
padded to 64 bytes), so records can be exchanged with alltoall/allgather as equal byte blocks.
The byte layout, the formula and the outcome for NaN/Inf inputs are defined in one place,
``csrc/kernels/minmax_uint8.h``. In short: a chunk holding NaN or +-Inf decodes to all NaN, a
constant chunk decodes exactly, and every other element decodes within half a quantisation step
``(max - min) / 255`` of its value.

The functions here work on host (CPU) arrays: numpy arrays, or any CPU array exporting DLPack
(torch and jax CPU arrays). Outputs are allocated 64-byte aligned when ``out`` is not given.
bfloat16 arrays are numpy arrays of ``ml_dtypes.bfloat16`` (jax CPU arrays convert to those);
numpy cannot import a bfloat16 DLPack tensor, so pass a torch bfloat16 tensor as
``t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)``.
"""

import numpy as np

from bagua_core._loader import _C

__all__ = [
    "HEADER_NBYTES",
    "RECORD_ALIGN",
    "record_nbytes",
    "compressed_nbytes",
    "compress",
    "decompress",
    "reduce_chunks",
]

HEADER_NBYTES = _C.minmax_uint8_header_nbytes
RECORD_ALIGN = _C.minmax_uint8_record_align

# Engine dtype codes (csrc/common/dtype.h) of the element types compression accepts.
_DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_DLPACK_CPU_DEVICES = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory)


def record_nbytes(chunk_len):
    """Bytes of one compressed chunk of ``chunk_len`` elements (header, codes, padding)."""
    return _C.minmax_uint8_record_nbytes(int(chunk_len))


def compressed_nbytes(n, n_chunks):
    """Bytes of the compressed form of ``n`` elements in ``n_chunks`` chunks.

    Raises ValueError unless ``n_chunks >= 1`` divides ``n``.
    """
    return _C.minmax_uint8_compressed_nbytes(int(n), int(n_chunks))


def compress(x, n_chunks, out=None, target_chunk=-1):
    """Compresses the flat contents of ``x`` (float32/float64/float16/bfloat16) into ``n_chunks`` records.

    ``out``: a writable contiguous uint8 array of ``compressed_nbytes(x.size, n_chunks)`` bytes, or
    None to allocate one. ``target_chunk=k`` computes and writes record k only; the other records of
    ``out`` are left as they were (zero when allocated here). Returns ``out``.
    """
    arr = _host_array(x, "x")
    code = _dtype_code(arr.dtype, "x")
    _check_layout(arr, "x")
    n = arr.size
    nbytes = compressed_nbytes(n, n_chunks)
    _check_target_chunk(target_chunk, n_chunks)
    if out is None:
        result = dst = _aligned_empty(nbytes, np.uint8, zero=target_chunk != -1)
    else:
        result, dst = out, _output_array(out, "out", np.dtype(np.uint8).name, nbytes)
        _check_no_overlap(arr, dst)
    _C.minmax_uint8_compress(arr.ctypes.data, n, code, int(n_chunks), dst.ctypes.data, int(target_chunk))
    return result


def decompress(c, n, dtype, n_chunks, out=None, target_chunk=-1):
    """Decodes ``n_chunks`` records in ``c`` (uint8) into ``n`` elements of ``dtype``.

    ``out``: a writable contiguous array of ``n`` elements of ``dtype``, or None to allocate one.
    ``target_chunk=k`` decodes chunk k only, into its place in ``out`` (the rest of ``out`` is left
    as it was; zero when allocated here). Returns ``out``.
    """
    name = _dtype_name(dtype)
    code = _dtype_code(name, "dtype")
    n = int(n)
    src = _compressed_array(c, compressed_nbytes(n, n_chunks))
    _check_target_chunk(target_chunk, n_chunks)
    if out is None:
        result = dst = _aligned_empty(n, _numpy_dtype(name), zero=target_chunk != -1)
    else:
        result, dst = out, _output_array(out, "out", name, n)
        _check_no_overlap(src, dst)
    _C.minmax_uint8_decompress(src.ctypes.data, n, code, int(n_chunks), dst.ctypes.data, int(target_chunk))
    return result


def reduce_chunks(c, chunk_len, n_records, dtype, average=True, out=None):
    """Decodes ``n_records`` records of ``chunk_len`` elements each (one per peer) and reduces them.

    Sums in float32 (record 0 first), divides by ``n_records`` when ``average``, and writes
    ``chunk_len`` elements of ``dtype`` to ``out`` (allocated when None). Returns ``out``.
    """
    name = _dtype_name(dtype)
    code = _dtype_code(name, "dtype")
    chunk_len, n_records = int(chunk_len), int(n_records)
    if chunk_len < 0 or n_records < 1:
        raise ValueError(f"reduce_chunks needs chunk_len >= 0 and n_records >= 1, got {chunk_len} and {n_records}")
    src = _compressed_array(c, n_records * record_nbytes(chunk_len))
    if out is None:
        result = dst = _aligned_empty(chunk_len, _numpy_dtype(name))
    else:
        result, dst = out, _output_array(out, "out", name, chunk_len)
        _check_no_overlap(src, dst)
    _C.minmax_uint8_reduce_chunks(src.ctypes.data, chunk_len, n_records, code, bool(average), dst.ctypes.data)
    return result


# ---- array checks ------------------------------------------------------------------------------


def _host_array(x, what):
    """A numpy view of a host array (numpy, or a CPU DLPack producer such as torch or jax)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "__dlpack_device__"):
        device_type = int(x.__dlpack_device__()[0])
        if device_type not in _DLPACK_CPU_DEVICES:
            raise TypeError(
                f"{what} is not in host memory (DLPack device type {device_type}); "
                "CUDA compression is exposed with the engine's CUDA buffers later"
            )
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, ValueError, RuntimeError) as e:
            dlpack_error = e
        try:
            return np.asarray(x)  # e.g. jax bfloat16, which numpy's DLPack import refuses
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"{what} cannot be imported as a host array: {dlpack_error}") from dlpack_error
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        return np.asarray(x)
    raise TypeError(f"{what} must be a numpy array or a CPU array supporting DLPack, got {type(x).__name__}")


def _dtype_name(dtype):
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = str(dtype)  # e.g. torch.float16
    return name.removeprefix("torch.")


def _dtype_code(dtype, what):
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in _DTYPE_CODES:
        raise TypeError(f"MinMaxUInt8 compression needs float32, float64, float16 or bfloat16 {what}, got {name}")
    return _DTYPE_CODES[name]


def _numpy_dtype(name):
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError("allocating a bfloat16 output needs the ml_dtypes package; pass out= instead") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _check_layout(arr, what):
    if not arr.flags.c_contiguous:
        raise ValueError(f"{what} must be contiguous")
    if not arr.flags.aligned:
        raise ValueError(f"{what} must be aligned to its element size")


def _check_target_chunk(target_chunk, n_chunks):
    if not (target_chunk == -1 or 0 <= target_chunk < n_chunks):
        raise ValueError(f"target_chunk must be -1 (all chunks) or in [0, {n_chunks}), got {target_chunk}")


def _output_array(out, what, dtype_name, size):
    arr = _host_array(out, what)
    if arr.dtype.name != dtype_name:
        raise TypeError(f"{what} must have dtype {dtype_name}, got {arr.dtype.name}")
    if arr.size != size:
        raise ValueError(f"{what} must have {size} elements, got {arr.size}")
    _check_layout(arr, what)
    if not arr.flags.writeable:
        raise ValueError(f"{what} must be writable")
    return arr


def _compressed_array(c, nbytes):
    arr = _host_array(c, "c")
    if arr.dtype != np.uint8:
        raise TypeError(f"compressed data must be a uint8 array, got {arr.dtype.name}")
    if arr.size != nbytes:
        raise ValueError(f"compressed data must have {nbytes} bytes, got {arr.size}")
    _check_layout(arr, "c")
    return arr


def _check_no_overlap(src, dst):
    if np.may_share_memory(src, dst):
        raise ValueError("out must not overlap the input")


def _aligned_empty(count, dtype, zero=False):
    """A new array of ``count`` elements whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    raw = (np.zeros if zero else np.empty)(nbytes + RECORD_ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % RECORD_ALIGN
    return raw[offset : offset + nbytes].view(dtype)
