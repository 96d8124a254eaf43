"""Times an allreduce inside jax.jit through the XLA FFI, with and without
aliasing the output to the input, against the engine's allreduce called directly.

    python -m bagua_core.run --nproc-per-node 2 benchmarks/jax_ffi_allreduce.py [--mib 64] [--iters 10]

Variants (all float32 SUM, one jitted call per iteration, timed to completion):
  alias+donate  output aliases the donated input: the collective runs in place
  alias         output aliases the input, not donated: XLA copies the input first
  no-alias      fresh output buffer
Rank 0 prints the median time and the algorithm bandwidth (bytes / time).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import bagua_core
import bagua_jax
from bagua_jax._src import groups, validation
from bagua_jax._src.collective_ops.allreduce import allreduce_p


def timed(fn, x, iters: int, feed_back: bool):
    for _ in range(2):  # compile and warm the buffers
        y = fn(x)
        y.block_until_ready()
        x = y if feed_back else x
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        y = fn(x)
        y.block_until_ready()
        times.append(time.perf_counter() - start)
        x = y if feed_back else x
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()

    group = bagua_jax.init_process_group()
    g = groups.resolve(None)
    n = args.mib * (1 << 20) // 4
    # Zeros keep the values fixed when outputs are fed back as inputs.
    x = jnp.zeros(n, jnp.float32)

    def variant(alias: bool, donate: bool):
        f = lambda v: allreduce_p.bind(v, group=g, op=validation.SUM, alias=alias)  # noqa: E731
        return jax.jit(f, donate_argnums=0 if donate else ())

    results = {
        "alias+donate": timed(variant(True, True), jnp.array(x), args.iters, feed_back=True),
        "alias": timed(variant(True, False), x, args.iters, feed_back=False),
        "no-alias": timed(variant(False, False), x, args.iters, feed_back=False),
    }
    # The engine without JAX: a numpy buffer reduced in place.
    buf = np.zeros(n, np.float32)
    for _ in range(2):
        bagua_core.allreduce_inplace(buf, group=group)
    ts = []
    for _ in range(args.iters):
        start = time.perf_counter()
        bagua_core.allreduce_inplace(buf, group=group)
        ts.append(time.perf_counter() - start)
    results["engine (numpy, in place)"] = statistics.median(ts)
    if g.rank == 0:
        nbytes = n * 4
        print(f"allreduce float32 {args.mib} MiB, {g.size} processes, median of {args.iters}")
        for name, t in results.items():
            print(f"  {name:26s} {t * 1e3:8.1f} ms  {nbytes / t / 1e9:6.2f} GB/s")


if __name__ == "__main__":
    main()
