"""CPU throughput of MinMaxUInt8 compress / decompress / reduce_chunks (single thread).

    PYTHONPATH=$PWD python benchmarks/compression_throughput.py [--mib 64] [--repeat 5]

GB/s are counted on the uncompressed float bytes (input of compress, output of decompress), per
second of this process's CPU time (the calls are single-threaded), so that other load on a shared
machine distorts them less than wall time would.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    n = args.mib * 2**20 // 4
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    gb = x.nbytes / 1e9
    for n_chunks in (1, 8):
        c = compression.compress(x, n_chunks)
        y = np.empty_like(x)
        tc = best_seconds(lambda: compression.compress(x, n_chunks, out=c), args.repeat)
        td = best_seconds(lambda: compression.decompress(c, n, np.float32, n_chunks, out=y), args.repeat)
        print(
            f"float32 {args.mib} MiB, n_chunks={n_chunks}: compress {gb / tc:.2f} GB/s, "
            f"decompress {gb / td:.2f} GB/s, compress+decompress {gb / (tc + td):.2f} GB/s"
        )
    n_records = 8
    chunk_len = n // n_records
    c = compression.compress(x, n_records)
    r = np.empty(chunk_len, np.float32)
    tr = best_seconds(lambda: compression.reduce_chunks(c, chunk_len, n_records, np.float32, out=r), args.repeat)
    print(f"reduce_chunks of {n_records} records ({args.mib} MiB decoded): {gb / tr:.2f} GB/s")


if __name__ == "__main__":
    main()
