"""Single-thread throughput of the communicators' CPU reduce loop (out = a op b, kernels/reduce.h).

    PYTHONPATH=$PWD python benchmarks/cpu_reduce_throughput.py [--mib 16] [--repeat 5]

This is the arithmetic every Gloo reducing collective runs per received segment. GB/s are counted
on the bytes of one operand, per second of process CPU time. Uses the test-only binding
``_C._cpu_reduce``.
"""

import argparse
import time

import numpy as np

from bagua_core import _C

DTYPES = {"float32": 0, "float16": 2, "bfloat16": 3}
OPS = {"SUM": 0, "MAX": 3}


def main():
    if not _C._test_bindings:
        raise SystemExit(
            f"{__file__}: needs bagua_core._C built with -DBAGUA_TEST_BINDINGS=ON "
            "(the default): it times a test-only entry point"
        )
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    nbytes = args.mib * 2**20
    rng = np.random.default_rng(0)
    for name, code in DTYPES.items():
        size = 4 if name == "float32" else 2
        n = nbytes // size
        x = rng.standard_normal(n).astype(np.float32)  # finite, normal values
        if name == "float16":
            x = x.astype(np.float16)
        elif name == "bfloat16":
            x = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated: fine for timing
        a = x.view(np.uint8)
        b, out = a.copy(), np.empty_like(a)
        for op, op_code in OPS.items():
            fn = lambda: _C._cpu_reduce(out.ctypes.data, a.ctypes.data, b.ctypes.data, n, code, op_code)  # noqa: E731
            fn()
            best = min(_timed(fn) for _ in range(args.repeat))
            print(f"{name} {op} {args.mib} MiB: {nbytes / best / 1e9:.2f} GB/s ({n / best / 1e9:.3f} G el/s)")


def _timed(fn):
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


if __name__ == "__main__":
    main()
