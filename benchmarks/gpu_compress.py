"""MinMaxUInt8 compression on one GPU against the device's own copy bandwidth.

    PYTHONPATH=$PWD python benchmarks/gpu_compress.py [--mib 64] [--json results.json] [--smoke]

On float32 arrays of ``--mib`` MiB, each timed with CUDA events over
``--reps`` launches after a warm-up, in the same run:

    copy                 a device-to-device copy of the array (torch's copy_):
                         reads and writes its bytes once, the reference bandwidth
    compress             array -> MinMaxUInt8 records (kernels/compress_cuda.cu)
    decompress           records -> array
    compress+decompress  both, back to back (ByteGrad's work per byte on each side)

Bandwidth counts the float32 bytes the kernel reads or writes (the
compressed side is a quarter of that and not counted), so the ratio to the
copy says how close to memory-bound the kernels are. Target: compress +
decompress at >= 70% of the copy's bandwidth. ``--chunks``: records per array
(ByteGrad uses one per rank).
"""

from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.mib, a.reps = 1, 3
    return a


def timed(torch, fn, reps):
    """Seconds per call of ``fn`` on the current stream (CUDA events)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from bagua_core import compression
    from bagua_core._loader import _C
    from bagua_core.dtypes import DType

    if not torch.cuda.is_available() or not _C.built_with_cuda:
        print("needs a CUDA device, torch with CUDA and a CUDA build of bagua_core")
        return 2
    n = args.mib * 2**20 // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    c = torch.empty(compression.compressed_nbytes(n, args.chunks), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    f32 = int(DType.float32)

    def compress():
        _C.minmax_uint8_compress_cuda(x.data_ptr(), n, f32, args.chunks, c.data_ptr(), -1, stream)

    def decompress():
        _C.minmax_uint8_decompress_cuda(c.data_ptr(), n, f32, args.chunks, y.data_ptr(), -1, stream)

    def both():
        compress()
        decompress()

    nbytes = n * 4
    seconds = {
        "copy": timed(torch, lambda: y.copy_(x), args.reps),
        "compress": timed(torch, compress, args.reps),
        "decompress": timed(torch, decompress, args.reps),
        "compress+decompress": timed(torch, both, args.reps),
    }
    # bytes of float32 each one reads or writes: the copy moves them twice (read + write)
    moved = {"copy": 2 * nbytes, "compress": nbytes, "decompress": nbytes, "compress+decompress": 2 * nbytes}
    gbps = {k: moved[k] / s / 1e9 for k, s in seconds.items()}
    err = (y - x).abs().max().item()
    device = torch.cuda.get_device_name(0)
    print(f"{device}: float32, {args.mib} MiB, {args.chunks} chunks, {args.reps} reps; decode error {err:.3g}")
    for k in seconds:
        print(f"  {k:20s} {seconds[k] * 1e6:9.1f} us  {gbps[k]:8.1f} GB/s  {gbps[k] / gbps['copy']:6.1%} of copy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "seconds": seconds, "GBps": gbps, "args": vars(args)}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
