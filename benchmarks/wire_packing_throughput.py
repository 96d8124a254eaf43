"""Speed of the top-byte packing kernel (kernels/top_byte_pack.h) on one core,
next to memcpy of the same float32 bytes: pack, unpack and unpack-add of
gradient-like data (normal, scale 1e-3), and the packed size. Each figure is
the best of --repeat runs in CPU time after a warm-up run.

    python benchmarks/wire_packing_throughput.py [--mib 64] [--repeat 5]
"""

from __future__ import annotations

import argparse

import numpy as np
from compression_throughput import best_seconds  # benchmarks/compression_throughput.py: CPU time, best of n


def main():
    from bagua_core import _C

    if not _C._test_bindings:
        raise SystemExit(
            f"{__file__}: needs bagua_core._C built with -DBAGUA_TEST_BINDINGS=ON "
            "(the default): it times a test-only entry point"
        )
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    n = a.mib * (1 << 20) // 4
    x = (np.random.default_rng(0).standard_normal(n) * 1e-3).astype(np.float32)
    packed = np.empty(4 * n, np.uint8)
    out = np.empty(n, np.float32)
    acc = np.zeros(n, np.float32)
    size = _C._top_byte_pack(x.ctypes.data, n, packed.ctypes.data, 4 * n)
    gb = 4 * n / 1e9
    rows = [
        ("memcpy", best_seconds(lambda: np.copyto(out, x), a.repeat)),
        ("pack", best_seconds(lambda: _C._top_byte_pack(x.ctypes.data, n, packed.ctypes.data, 4 * n), a.repeat)),
        (
            "unpack",
            best_seconds(lambda: _C._top_byte_unpack(packed.ctypes.data, size, n, out.ctypes.data, False), a.repeat),
        ),
        (
            "unpack_add",
            best_seconds(lambda: _C._top_byte_unpack(packed.ctypes.data, size, n, acc.ctypes.data, True), a.repeat),
        ),
    ]
    print(
        f"{a.mib} MiB of float32 gradients: packed to {size / (4 * n):.3f} of the raw bytes "
        f"({8 * size / n:.2f} bits/value)"
    )
    for name, s in rows:
        print(f"  {name:11s} {gb / s:6.2f} GB/s (of float32 bytes)  {gb / s / (gb / rows[0][1]):.2f}x memcpy")
    np.testing.assert_array_equal(out.view(np.uint32), x.view(np.uint32))


if __name__ == "__main__":
    main()
