"""The AVX2 / AVX-512 copies of the CPU MinMaxUInt8 kernels give bitwise the baseline's results:
compress, decompress and reduce_chunks on odd sizes, every float dtype, and edge values (NaN, +-Inf,
-0, subnormals, huge magnitudes, overflowing spreads, constant chunks, rounding ties, arbitrary
records). Instruction sets this CPU lacks are skipped, named in the reason."""

import numpy as np
import pytest

from bagua_core import compression

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["float32", "float64", "float16", "bfloat16"]
CHUNK_LENS = [1, 2, 3, 7, 15, 17, 31, 33, 63, 65, 127, 129, 1001, 4099]
VECTOR_ISAS = [name for name in compression.CPU_ISAS if name != "baseline"]


@pytest.fixture(params=VECTOR_ISAS)
def isa(request):
    if request.param not in compression.supported_cpu_isas():
        pytest.skip(f"this CPU does not run {request.param} (supports {compression.supported_cpu_isas()})")
    before = compression.cpu_isa()
    yield request.param
    compression.set_cpu_isa(before)


def edge_values(n, seed):
    """float64 values mixing normal numbers with the edge cases, n of them."""
    rng = np.random.default_rng(seed)
    special = np.array(
        [
            0.0,
            -0.0,
            1e-45,
            -1e-45,
            1e-40,
            5e-324,
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            254.5,
            127.5,
            1e30,
            -1e30,
            3.4e38,
            -3.4e38,
            65504.0,
            65520.0,
            1e-8,
            7.0,
            7.0,
        ]
    )
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6)
    k = min(n, len(special))
    x[rng.choice(n, k, replace=False)] = special[:k]
    return x


def make_chunks(chunk_len, n_chunks, dtype, seed):
    """n_chunks chunks of chunk_len elements, each of a different kind."""
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(n_chunks):
        kind = (seed + k) % 7
        if kind == 0:
            c = edge_values(chunk_len, seed + k)
        elif kind == 1:
            c = np.full(chunk_len, rng.standard_normal())  # constant
        elif kind == 2:
            c = rng.standard_normal(chunk_len)
            c[rng.integers(chunk_len)] = np.nan
        elif kind == 3:
            c = rng.standard_normal(chunk_len)
            c[rng.integers(chunk_len)] = -np.inf
        elif kind == 4:
            c = rng.integers(-128, 128, chunk_len) + 0.5  # ties of x * scale, nearly
        elif kind == 5:
            c = rng.standard_normal(chunk_len)
            c[0], c[-1] = -3e38, 3e38  # the spread overflows float32 (when chunk_len > 1)
        else:
            c = rng.standard_normal(chunk_len) * 1e-3 + 1e4  # far from zero: precision-limited
        parts.append(c)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.concatenate(parts).astype(dtype)


def both(isa, fn):
    """(fn() with the baseline kernels, fn() with isa's) as raw bytes."""
    compression.set_cpu_isa("baseline")
    want = np.array(fn(), copy=True).view(np.uint8)
    compression.set_cpu_isa(isa)
    got = np.array(fn(), copy=True).view(np.uint8)
    return got, want


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n_chunks", [1, 3])
def test_compress_and_decompress_match_baseline_bitwise(isa, dtype, n_chunks):
    for i, chunk_len in enumerate(CHUNK_LENS):
        x = make_chunks(chunk_len, n_chunks, dtype, seed=i)
        n = x.size
        got, want = both(isa, lambda: compression.compress(x, n_chunks).numpy())
        np.testing.assert_array_equal(got, want, err_msg=f"compress, chunk_len {chunk_len}")
        c = want.copy()
        got, want = both(isa, lambda: compression.decompress(c, n, dtype, n_chunks).numpy())
        np.testing.assert_array_equal(got, want, err_msg=f"decompress, chunk_len {chunk_len}")
        for k in range(n_chunks):  # one chunk at a time (ByteGrad's target_chunk)
            got, want = both(isa, lambda: compression.compress(x, n_chunks, target_chunk=k).numpy())
            np.testing.assert_array_equal(got, want, err_msg=f"compress chunk {k}, chunk_len {chunk_len}")


def test_long_float32_chunks_match_baseline_bitwise(isa):
    """Long chunks run the 32-element loops of the float32 AVX2 encoder and statistics (and their
    tails): edge values anywhere, the extremes in the last element, and halves that tie."""
    rng = np.random.default_rng(7)
    for chunk_len in (32, 64, 96, 4096 + 31, 65536 + 5):
        for kind in range(3):
            x = edge_values(chunk_len, kind)
            if kind == 1:
                x = rng.integers(-128, 128, chunk_len) + 0.5
                x[-1] = 300.0  # the max only in the scalar tail (or the last vector)
            elif kind == 2:
                x = rng.standard_normal(chunk_len)
                x[-1] = np.nan if chunk_len % 2 else -np.inf
            x = x.astype(np.float32)
            for n_chunks in (1, 2) if chunk_len % 2 == 0 else (1,):
                got, want = both(isa, lambda: compression.compress(x, n_chunks).numpy())
                np.testing.assert_array_equal(got, want, err_msg=f"chunk_len {chunk_len}, kind {kind}")


def arbitrary_records(chunk_len, n_records, seed):
    """Records with random codes and headers, edge values included (NaN, Inf, min > max, min == max)."""
    rng = np.random.default_rng(seed)
    rb = compression.record_nbytes(chunk_len)
    c = rng.integers(0, 256, n_records * rb, dtype=np.uint8)
    headers = [
        (-1.0, 2.0),
        (3.0, 3.0),
        (np.nan, np.nan),
        (0.0, np.inf),
        (5.0, -5.0),
        (-1e38, 1e38),
        (-0.0, 0.0),
        (1e-40, 2e-40),
    ]
    for r in range(n_records):
        lo, hi = headers[(seed + r) % len(headers)] if r % 2 == 0 else sorted(rng.standard_normal(2) * 100)
        c[r * rb : r * rb + 8] = np.array([lo, hi], np.float32).view(np.uint8)
    return c


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decompress_of_arbitrary_records_matches_baseline_bitwise(isa, dtype):
    for i, chunk_len in enumerate(CHUNK_LENS):
        c = arbitrary_records(chunk_len, 4, seed=i)
        got, want = both(isa, lambda: compression.decompress(c, 4 * chunk_len, dtype, 4).numpy())
        np.testing.assert_array_equal(got, want, err_msg=f"chunk_len {chunk_len}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("average", [False, True])
def test_reduce_chunks_matches_baseline_bitwise(isa, dtype, average):
    for i, chunk_len in enumerate(CHUNK_LENS + [2048, 2049, 5000]):  # tiles of 2048 elements
        for n_records in (1, 3, 4):
            c = arbitrary_records(chunk_len, n_records, seed=i + n_records)
            got, want = both(isa, lambda: compression.reduce_chunks(c, chunk_len, n_records, dtype, average).numpy())
            np.testing.assert_array_equal(got, want, err_msg=f"chunk_len {chunk_len}, {n_records} records")


def test_default_is_the_best_supported_and_choices_are_checked():
    supported = compression.supported_cpu_isas()
    assert supported[0] == "baseline" and compression.cpu_isa() == supported[-1]
    for name in compression.CPU_ISAS:
        if name not in supported:
            with pytest.raises(ValueError, match=f"{name} cannot run here"):
                compression.set_cpu_isa(name)
    with pytest.raises(ValueError, match="unknown CPU instruction set 'sse9'"):
        compression.set_cpu_isa("sse9")
    assert compression.cpu_isa() == supported[-1]


def test_throughput_benchmark_reports_each_isa_against_memcpy():
    import os
    import subprocess
    import sys

    from tests.harness.mp import repo_env
    from tests.harness.paths import BENCHMARKS

    p = subprocess.run(
        [sys.executable, os.path.join(BENCHMARKS, "compression_throughput.py"), "--mib", "1", "--repeat", "1"],
        capture_output=True,
        text=True,
        env=repo_env(),
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "memcpy of 1 MiB" in p.stdout
    for name in compression.supported_cpu_isas():
        assert f"--- {name}" in p.stdout
    assert p.stdout.count("of memcpy") == 2 * len(compression.supported_cpu_isas())
    assert compression.cpu_isa() == compression.supported_cpu_isas()[-1]
