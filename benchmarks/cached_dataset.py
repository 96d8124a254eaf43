"""Epoch time with CachedDataset against loading every sample, per backend.

    PYTHONPATH=$PWD python benchmarks/cached_dataset.py [--samples 512] [--work-ms 2]
        [--backends none lmdb redis] [--batch-size 32] [--workers 0]

The dataset does ``--work-ms`` of real CPU work per sample (repeated FFT
filtering of a 3x64x64 image, the stand-in for decoding and augmenting) and
returns ``{"image": float32 array, "label": int}``. Each backend runs two
epochs through a DataLoader: the first loads and writes every sample, the
second reads them back. ``none`` is the plain dataset. The table shows each
epoch's time, the ratio to ``none`` (above 1: faster) and the cache's hit rate
in epoch 2. Redis is started by the library (redis-server must be installed).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np
import torch

from bagua_torch.contrib import CachedDataset


class Decoded(torch.utils.data.Dataset):
    def __init__(self, n, work_ms):
        self.n = n
        rng = np.random.default_rng(0)
        self.kernel = np.fft.rfft2(rng.standard_normal((64, 64)))
        self.rounds = self._calibrate(work_ms)

    def _calibrate(self, work_ms):
        t = time.perf_counter()
        self._work(0, 20)
        per_round = (time.perf_counter() - t) / 20
        return max(1, int(work_ms / 1e3 / per_round))

    def _work(self, i, rounds):
        img = np.random.default_rng(i).standard_normal((3, 64, 64))
        for _ in range(rounds):
            img = np.fft.irfft2(np.fft.rfft2(img) * self.kernel, s=(64, 64))
            img /= np.abs(img).max()
        return img.astype(np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": self._work(i, self.rounds), "label": i % 10}


def epoch(ds, batch_size, workers):
    loader = torch.utils.data.DataLoader(ds, batch_size=batch_size, num_workers=workers)
    t = time.perf_counter()
    n = sum(len(b["label"]) for b in loader)
    assert n == len(ds)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--work-ms", type=float, default=2.0)
    ap.add_argument("--backends", nargs="+", default=["none", "lmdb", "redis"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    base = Decoded(a.samples, a.work_ms)
    print(
        f"{a.samples} samples of 3x64x64 float32, ~{a.work_ms:g} ms of work each, batch {a.batch_size}, "
        f"{a.workers} DataLoader worker(s)"
    )
    print(f"{'backend':<8} {'epoch 1 s':>10} {'epoch 2 s':>10} {'e2 vs none':>11} {'e2 hit rate':>12}")
    tmp = tempfile.mkdtemp(prefix="bagua-bench-cache-")
    none_time = None
    try:
        for backend in a.backends:
            if backend == "none":
                ds, kw = base, None
            else:
                kw = {"path": f"{tmp}/db"} if backend == "lmdb" else {}
                ds = CachedDataset(base, backend=backend, dataset_name="bench", writer_buffer_size=32, **kw)
            t1 = epoch(ds, a.batch_size, a.workers)
            if kw is not None:
                ds.cache_loader.flush()
                before = dict(ds.cache_loader.stats())
            t2 = epoch(ds, a.batch_size, a.workers)
            if none_time is None and backend == "none":
                none_time = t2
            ratio = f"{none_time / t2:.2f}x" if none_time else "-"
            rate = "-"
            if kw is not None and a.workers == 0:
                s = ds.cache_loader.stats()
                hits, misses = s["hits"] - before["hits"], s["misses"] - before["misses"]
                rate = f"{hits / max(1, hits + misses):.2f}"
            print(f"{backend:<8} {t1:>10.3f} {t2:>10.3f} {ratio:>11} {rate:>12}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
