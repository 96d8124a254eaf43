"""CPU throughput of MinMaxUInt8 compress / decompress / reduce_chunks (single thread), per
instruction set of the kernels (baseline x86-64, AVX2, AVX-512: those this CPU runs), against a
single-core memcpy of the same bytes.

    PYTHONPATH=$PWD python benchmarks/compression_throughput.py [--mib 64] [--repeat 5] [--dtype float16]
        [--isa baseline,avx2]

GB/s are counted on the uncompressed bytes (input of compress, output of decompress), G el/s in
elements, per second of this process's CPU time (the calls are single-threaded), so that other load
on a shared machine distorts them less than wall time would. bfloat16 needs ml_dtypes.
"""

import argparse
import time

import numpy as np

from bagua_core import compression


def best_seconds(fn, repeat):
    fn()  # warm-up (page faults of fresh outputs)
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times)


def numpy_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def rates(nbytes, n, seconds):
    return f"{nbytes / seconds / 1e9:.2f} GB/s ({n / seconds / 1e9:.3f} G el/s)"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument(
        "--isa",
        default=",".join(compression.supported_cpu_isas()),
        help="comma-separated kernel instruction sets to measure (default: every one this CPU runs)",
    )
    args = p.parse_args()
    dtype = numpy_dtype(args.dtype)
    n = args.mib * 2**20 // dtype.itemsize
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32).astype(dtype)
    copy = np.empty_like(x)
    tm = best_seconds(lambda: np.copyto(copy, x), args.repeat)
    print(f"memcpy of {args.mib} MiB (numpy copyto, one core): {x.nbytes / tm / 1e9:.2f} GB/s")
    print(f"kernels by default: {compression.cpu_isa()} (this CPU runs {', '.join(compression.supported_cpu_isas())})")
    default = compression.cpu_isa()
    try:
        for isa in args.isa.split(","):
            compression.set_cpu_isa(isa.strip())
            print(f"--- {isa.strip()}")
            measure(x, n, dtype, args, memcpy_s=tm)
    finally:
        compression.set_cpu_isa(default)


def measure(x, n, dtype, args, memcpy_s):
    for n_chunks in (1, 8):
        c = compression.compress(x, n_chunks)
        y = np.empty_like(x)
        tc = best_seconds(lambda: compression.compress(x, n_chunks, out=c), args.repeat)
        td = best_seconds(lambda: compression.decompress(c, n, dtype, n_chunks, out=y), args.repeat)
        print(
            f"{args.dtype} {args.mib} MiB, n_chunks={n_chunks}: compress {rates(x.nbytes, n, tc)}, "
            f"decompress {rates(x.nbytes, n, td)}, compress+decompress {rates(x.nbytes, n, tc + td)} "
            f"= {memcpy_s / (tc + td):.0%} of memcpy"
        )
    n_records = 8
    chunk_len = n // n_records
    c = compression.compress(x, n_records)
    r = np.empty(chunk_len, dtype)
    tr = best_seconds(lambda: compression.reduce_chunks(c, chunk_len, n_records, dtype, out=r), args.repeat)
    print(f"reduce_chunks of {n_records} records ({args.mib} MiB decoded): {rates(x.nbytes, n, tr)}")


if __name__ == "__main__":
    main()
