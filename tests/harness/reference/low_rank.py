"""The low-rank step's arithmetic in numpy, written from its specification in
csrc/ops/low_rank_math.h, not from the C++ code: the initial Q (splitmix64
keys, an Irwin-Hall sum of twelve 24-bit uniforms; tests inject it into torch's
PowerSGD hook so both start from the same Q), and the products,
orthogonalisation and error feedback in their documented summation orders, so
that the host and CUDA kernels can be checked bit for bit.

Arrays of the products are in the compute type A (float32, float64 for
float64 data); M is given in its own dtype (float16 and bfloat16 through
ml_dtypes) and read into A exactly. numpy's multiply and add round each
operation, as the kernels do (no FMA).
"""

import numpy as np

_U = np.uint64


def mix(x):
    """splitmix64's finaliser of x + the golden gamma (uint64 arrays, modulo 2^64)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, _U) + _U(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    return x ^ (x >> _U(31))


def initial_q(seed: int, step: int, tensor: int, m: int, r: int, dtype=np.float32) -> np.ndarray:
    """The m x r initial Q of the bucket's tensor number ``tensor``, made at step ``step``."""
    key = mix(mix(mix(_U(seed)) ^ _U(step)) ^ _U(tensor))
    e = np.arange(m * r, dtype=_U)
    total = np.zeros(m * r, _U)
    for j in range(12):
        with np.errstate(over="ignore"):
            total += mix(key ^ (_U(12) * e + _U(j))) >> _U(40)
    return ((total.astype(np.float64) - 6 * 2.0**24) / 2.0**24).astype(dtype).reshape(m, r)


LANES = 256  # the orthogonalisation's lane sums
DOT_LANES = 32  # P = M Q's lane sums


def compute_type(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def lane_sum(terms, lanes):
    """The lane sum of ``lanes`` lanes over the last axis of ``terms`` (already rounded products):
    lane l adds terms l, l + lanes, ... in ascending order from zero, then the pairwise tree."""
    acc = np.zeros(terms.shape[:-1] + (lanes,), terms.dtype)
    for start in range(0, terms.shape[-1], lanes):
        chunk = terms[..., start : start + lanes]
        acc[..., : chunk.shape[-1]] = acc[..., : chunk.shape[-1]] + chunk
    s = lanes // 2
    while s >= 1:
        acc[..., :s] = acc[..., :s] + acc[..., s : 2 * s]
        s //= 2
    return acc[..., 0]


def mq(M, Q):
    """P = M Q: each element a lane sum of DOT_LANES over the row of M."""
    A = Q.dtype
    terms = M.astype(A)[:, None, :] * Q.T[None, :, :]  # (n, r, m)
    return lane_sum(terms, DOT_LANES)


def mtp(M, P):
    """Q = M^T P: each element summed over M's rows in ascending order, from zero."""
    A = P.dtype
    Ma = M.astype(A)
    acc = np.zeros((M.shape[1], P.shape[1]), A)
    for a in range(M.shape[0]):
        acc = acc + Ma[a, :, None] * P[a, None, :]
    return acc


def pqt(P, Q, dtype):
    """M = P Q^T: each element summed over the rank in ascending order, from zero, then rounded to dtype."""
    acc = np.zeros((P.shape[0], Q.shape[0]), P.dtype)
    for k in range(P.shape[1]):
        acc = acc + P[:, k, None] * Q[None, :, k]
    return acc.astype(dtype)


def orthogonalize(mat, epsilon=0.0):
    """Modified Gram-Schmidt of the columns (lane sums of LANES over a column's rows); a column whose
    divisor (norm + epsilon) is zero becomes zero."""
    A = mat.dtype.type
    cols = [mat[:, i].copy() for i in range(mat.shape[1])]
    eps = A(epsilon)
    for i in range(len(cols)):
        divisor = np.sqrt(lane_sum(cols[i] * cols[i], LANES)) + eps
        cols[i] = np.zeros_like(cols[i]) if divisor == 0 else cols[i] / divisor
        for c in range(i + 1, len(cols)):
            dot = lane_sum(cols[i] * cols[c], LANES)
            cols[c] = cols[c] - dot * cols[i]
    return np.stack(cols, axis=1) if cols else mat.copy()


def fold_error(data, error):
    """(data, error) after error feedback's first half: data + error rounded to data's dtype; error holds it."""
    new = (data.astype(error.dtype) + error).astype(data.dtype)
    return new, new.astype(error.dtype)


def finish_error(data, error):
    """error - data: what compression lost."""
    return error - data.astype(error.dtype)
