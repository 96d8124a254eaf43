"""Plain numpy reference of the low-bit block codecs (minmax_uint4, minmax_uint2, fp4_e2m1,
topk_uint4, topk_uint2), written from the layout documented in csrc/kernels/lowbit.h, not from the
C++ code: float32 arithmetic, np.rint (half to even), the FP4 grid's nearest value found by
distances, top-k by a stable sort. ``k`` is the top-k codecs' elements kept per block of 256.

Every function takes the codec's name first; ``ALL`` lists them. ``codec_k(density)`` is the k a
``topk_density`` gives.
"""

import math

import numpy as np

F32 = np.float32
NAN = F32(np.nan)
ALL = ("minmax_uint4", "minmax_uint2", "fp4_e2m1", "topk_uint4", "topk_uint2")
FP4_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def codec_k(density):
    return max(1, math.ceil(density * 256))


def bits(name):
    return 2 if name.endswith("2") else 4


def block_len(name):
    return 32 if name == "fp4_e2m1" else 256 if name.startswith("topk") else 128


def block_nbytes(name, k):
    b = bits(name)
    if name == "fp4_e2m1":
        return 4 + 16
    if name.startswith("topk"):
        return -(-(8 + k + -(-k * b // 8)) // 4) * 4
    return 8 + 128 * b // 8


def record_nbytes(name, chunk_len, k=0):
    blocks = -(-chunk_len // block_len(name))
    return -(-blocks * block_nbytes(name, k) // 64) * 64


def compressed_nbytes(name, n, n_chunks, k=0):
    return n_chunks * record_nbytes(name, n // n_chunks, k)


def _pack(q, b):
    """Codes (ints < 2**b) packed from each byte's low bits."""
    per = 8 // b
    q = np.concatenate([q.astype(np.uint8), np.zeros(-len(q) % per, np.uint8)]).reshape(-1, per)
    return np.bitwise_or.reduce(q << (b * np.arange(per, dtype=np.uint8)), axis=1).astype(np.uint8)


def _unpack(raw, count, b):
    per = 8 // b
    return ((raw[:, None] >> (b * np.arange(per, dtype=np.uint8))) & ((1 << b) - 1)).reshape(-1)[:count]


def _f32_bytes(*values):
    return np.array(values, dtype="<f4").view(np.uint8)


def _header(rec, count):
    return rec[: 4 * count].view("<f4")


def _minmax_header(x):
    if x.size == 0:
        return F32(0), F32(0)
    if not np.all(np.isfinite(x)):
        return NAN, NAN
    mn, mx = x.min(), x.max()
    with np.errstate(over="ignore"):
        if not np.isfinite(mx - mn):
            return NAN, NAN
    return mn, mx


def _minmax_codes(x, mn, mx, b):
    with np.errstate(all="ignore"):
        step = (mx - mn) / F32(2**b - 1)
        if not step > 0:
            return np.zeros(x.size, np.uint8)
        return np.clip(np.rint((x - mn) / step), 0, 2**b - 1).astype(np.uint8)


def _minmax_values(q, mn, mx, b):
    with np.errstate(all="ignore"):
        step = (mx - mn) / F32(2**b - 1)
        return (mn + q.astype(F32) * step).astype(F32)


def encode_block(name, x, k=0):
    """One block record of float32 values x."""
    b, out = bits(name), np.zeros(block_nbytes(name, k), np.uint8)
    if name == "fp4_e2m1":
        if not np.all(np.isfinite(x)):
            out[:4] = _f32_bytes(np.nan)
            return out
        scale = F32(np.abs(x).max() / F32(6)) if x.size else F32(0)
        out[:4] = _f32_bytes(scale)
        sign = np.signbit(x).astype(np.uint8)
        if scale > 0:
            v = (np.abs(x) / scale).astype(np.float64)
            d = np.abs(v[:, None] - FP4_GRID[None, :])
            nearest = d == d.min(axis=1, keepdims=True)
            # a tie has two neighbouring candidates: take the even index
            idx = np.where(nearest.sum(axis=1) > 1, np.argmax(nearest & (np.arange(8) % 2 == 0), axis=1), d.argmin(1))
        else:
            idx = np.zeros(x.size, np.int64)
        codes = _pack((sign << 3) | idx.astype(np.uint8), 4)
        out[4 : 4 + codes.size] = codes
        return out
    if name.startswith("topk"):
        kept = min(k, x.size)
        if not np.all(np.isfinite(x)):
            out[:8] = _f32_bytes(np.nan, np.nan)
            out[8 : 8 + kept] = np.arange(kept)
            return out
        order = np.lexsort((np.arange(x.size), -np.abs(x).astype(np.float64)))
        idx = np.sort(order[:kept])
        mn, mx = _minmax_header(x[idx])
        out[:8] = _f32_bytes(mn, mx)
        out[8 : 8 + kept] = idx
        codes = _pack(_minmax_codes(x[idx], mn, mx, b), b)
        out[8 + k : 8 + k + codes.size] = codes
        return out
    mn, mx = _minmax_header(x)
    out[:8] = _f32_bytes(mn, mx)
    codes = _pack(_minmax_codes(x, mn, mx, b), b)
    out[8 : 8 + codes.size] = codes
    return out


def decode_block(name, rec, length, k=0):
    b = bits(name)
    if name == "fp4_e2m1":
        scale = _header(rec, 1)[0]
        c = _unpack(rec[4:20], length, 4)
        v = (FP4_GRID[c & 7].astype(F32) * scale).astype(F32)
        return np.where(c & 8, -v, v).astype(F32)
    mn, mx = _header(rec, 2)
    if name.startswith("topk"):
        if np.isnan(mn):
            return np.full(length, NAN)
        out = np.zeros(length, F32)
        kept = min(k, length)
        idx = rec[8 : 8 + kept].astype(np.int64)
        out[idx] = _minmax_values(_unpack(rec[8 + k :], kept, b), mn, mx, b)
        return out
    return _minmax_values(_unpack(rec[8:], length, b), mn, mx, b)


def _blocks(name, length):
    bl = block_len(name)
    return [(j, o, min(bl, length - o)) for j, o in enumerate(range(0, length, bl))]


def compress(name, x, n_chunks, k=0):
    x = np.asarray(x).astype(F32).reshape(-1)
    chunk = x.size // n_chunks
    rb, bb = record_nbytes(name, chunk, k), block_nbytes(name, k)
    out = np.zeros(n_chunks * rb, np.uint8)
    for c in range(n_chunks):
        for j, o, length in _blocks(name, chunk):
            at = c * rb + j * bb
            out[at : at + bb] = encode_block(name, x[c * chunk + o : c * chunk + o + length], k)
    return out


def decompress32(name, c, n, n_chunks, k=0):
    chunk, rb, bb = n // n_chunks, record_nbytes(name, n // n_chunks, k), block_nbytes(name, k)
    out = np.zeros(n, F32)
    for r in range(n_chunks):
        for j, o, length in _blocks(name, chunk):
            at = r * rb + j * bb
            out[r * chunk + o : r * chunk + o + length] = decode_block(name, c[at : at + bb], length, k)
    return out


def decompress(name, c, n, n_chunks, dtype, k=0):
    return decompress32(name, c, n, n_chunks, k).astype(dtype)


def residual(name, c, x, n_chunks, k=0):
    """x - decompress(c), x_hat rounded to x's dtype, the difference in float32 (float64 for float64)."""
    x_hat = decompress(name, c, x.size, n_chunks, x.dtype, k)
    wide = np.float64 if x.dtype == np.float64 else F32
    return (x.astype(wide) - x_hat.astype(wide)).astype(x.dtype)


def reduce_chunks(name, c, chunk_len, n_records, dtype, average, k=0):
    acc = np.zeros(chunk_len, F32)
    rb = record_nbytes(name, chunk_len, k)
    for r in range(n_records):
        acc = acc + decompress32(name, c[r * rb : (r + 1) * rb], chunk_len, 1, k)
    if average:
        acc = acc / F32(n_records)
    return acc.astype(dtype)
