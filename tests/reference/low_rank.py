"""The low-rank step's initial Q in numpy, written from its specification in
csrc/ops/low_rank_math.h (splitmix64 keys, an Irwin-Hall sum of twelve 24-bit
uniforms), not from the C++ code; tests inject it into torch's PowerSGD hook
so both start from the same Q."""

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
    return ((total.astype(np.float64) - 6 * 2.0 ** 24) / 2.0 ** 24).astype(dtype).reshape(m, r)
