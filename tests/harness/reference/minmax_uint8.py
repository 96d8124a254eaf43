"""Plain numpy reference of MinMaxUInt8 compression, written from the specification (the original
Bagua's formula; our byte layout and special cases as documented in csrc/kernels/minmax_uint8.h),
not from the C++ code. All arithmetic is float32, rounding is np.rint (half to even).
"""

import numpy as np

F32 = np.float32
HEADER_NBYTES = 32
RECORD_ALIGN = 64
EPS = F32(1e-7)
NAN = F32(np.nan)


def record_nbytes(chunk_len):
    return -(-(HEADER_NBYTES + chunk_len) // RECORD_ALIGN) * RECORD_ALIGN


def compressed_nbytes(n, n_chunks):
    return n_chunks * record_nbytes(n // n_chunks)


def formula(mn, mx):
    """(scale, upper, lower) of the original formula, in float32."""
    with np.errstate(all="ignore"):
        scale = F32(255) / (F32(mx) - F32(mn) + EPS)
        upper = np.rint(F32(mx) * scale)
        lower = upper - F32(255)
    return scale, upper, lower


def chunk_min_max(x32):
    """Header values of one chunk (float32 input)."""
    if x32.size == 0:
        return F32(0), F32(0)
    if not np.all(np.isfinite(x32)):
        return NAN, NAN
    mn, mx = x32.min(), x32.max()
    with np.errstate(over="ignore"):
        spread = mx - mn
    if not np.isfinite(spread):
        return NAN, NAN
    return mn, mx


def encode(x32, mn, mx):
    scale, upper, lower = formula(mn, mx)
    with np.errstate(all="ignore"):
        q = np.minimum(np.rint(x32 * scale), upper) - lower
    q = np.where(np.isnan(q), F32(0), q)
    return np.clip(q, 0, 255).astype(np.uint8)


def decode(codes, mn, mx):
    """float32 decoded values of one record."""
    if mn == mx:
        return np.full(codes.shape, mn, dtype=F32)
    scale, _, lower = formula(mn, mx)
    with np.errstate(all="ignore"):
        return (codes.astype(F32) + lower) / scale


def compress(x, n_chunks):
    """Compressed bytes of the flat contents of x (any float dtype)."""
    x32 = np.asarray(x).reshape(-1).astype(F32)
    n = x32.size
    chunk_len = n // n_chunks
    rb = record_nbytes(chunk_len)
    out = np.zeros(n_chunks * rb, dtype=np.uint8)
    for k in range(n_chunks):
        chunk = x32[k * chunk_len : (k + 1) * chunk_len]
        mn, mx = chunk_min_max(chunk)
        record = out[k * rb : (k + 1) * rb]
        record[0:8] = np.array([mn, mx], dtype="<f4").view(np.uint8)
        record[HEADER_NBYTES : HEADER_NBYTES + chunk_len] = encode(chunk, mn, mx)
    return out


def parse(c, chunk_len, n_records):
    """[(min, max, codes)] of each record."""
    rb = record_nbytes(chunk_len)
    records = []
    for k in range(n_records):
        record = np.asarray(c[k * rb : (k + 1) * rb])
        mn, mx = record[0:8].copy().view("<f4")
        records.append((mn, mx, record[HEADER_NBYTES : HEADER_NBYTES + chunk_len]))
    return records


def decompress(c, n, n_chunks, dtype):
    chunk_len = n // n_chunks
    parts = [decode(codes, mn, mx) for mn, mx, codes in parse(c, chunk_len, n_chunks)]
    out = np.concatenate(parts) if parts else np.zeros(0, F32)
    return out.astype(dtype)


def reduce_chunks(c, chunk_len, n_records, dtype, average):
    acc = np.zeros(chunk_len, dtype=F32)
    with np.errstate(all="ignore"):
        for mn, mx, codes in parse(c, chunk_len, n_records):
            acc = acc + decode(codes, mn, mx)
        if average:
            acc = acc / F32(n_records)
    return acc.astype(dtype)
