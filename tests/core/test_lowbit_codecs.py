"""The low-bit block codecs (csrc/kernels/lowbit.h) through ``_C.kernels``' codec functions.

Host: every codec and dtype against the numpy reference (tests/harness/reference/lowbit.py),
byte for byte and value for value, on sizes around the block lengths and odd chunk counts; the
accuracy each format promises; error feedback's identity over many rounds; all-zero and constant
blocks; NaN and Inf (a bad block decodes to NaN, the others stay exact; count_nonfinite counts
them); the codec registry and its refusals. GPU (marked ``gpu``, skipped without a CUDA device):
the CUDA kernels against the host, bit for bit.
"""

import numpy as np
import pytest

from bagua_core import _C
from tests.gpu.available import gpu_skip_reason
from tests.harness.built_with import needs_test_bindings
from tests.harness.reference import lowbit as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

K = getattr(_C, "kernels", None)
pytestmark = needs_test_bindings
DTYPES = {
    "float32": (0, np.dtype(np.float32)),
    "float64": (1, np.dtype(np.float64)),
    "float16": (2, np.dtype(np.float16)),
    "bfloat16": (3, np.dtype(ml_dtypes.bfloat16)),
}
DENSITY = 0.05  # k = 13 of 256
KEEP = ref.codec_k(DENSITY)
SIZES = [1, 31, 33, 127, 129, 255, 257, 1000]


def data(n, dtype, seed, kind="normal"):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 3.0 + 0.5
    if kind == "outliers":
        x[:: max(1, n // 7)] *= 1000.0
    if kind == "ties":  # many equal magnitudes: top-k's tie rule decides
        x = np.rint(x).clip(-2, 2)
    return x.astype(dtype)


def raw(a):
    """What the binding takes: bfloat16 as its uint16 bits (numpy's buffer protocol has no bfloat16)."""
    return a.view(np.uint16) if a.dtype == DTYPES["bfloat16"][1] else a


def code_of(dtype):
    return next(code for code, d in DTYPES.values() if d == dtype)


def compress(name, x, n_chunks, device="cpu"):
    out = np.zeros(K.codec_compressed_nbytes(name, DENSITY, x.size, n_chunks), np.uint8)
    K.codec_compress(name, DENSITY, raw(x), code_of(x.dtype), n_chunks, out, device=device)
    return out


def decompress(name, c, n, dname, n_chunks, device="cpu"):
    code, dtype = DTYPES[dname]
    out = np.zeros(n, dtype)
    K.codec_decompress(name, DENSITY, c, code, n_chunks, raw(out), device=device)
    return out


def test_registry_names_every_codec():
    assert _C.codec_names() == ["minmax_uint8", *ref.ALL]


@pytest.mark.parametrize("name", ref.ALL)
@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("n,n_chunks", [(n, 1) for n in SIZES] + [(3 * 129, 3), (4 * 257, 4), (3 * 7, 3)])
def test_host_matches_reference(name, dname, n, n_chunks):
    code, dtype = DTYPES[dname]
    x = data(n, dtype, n)
    c = compress(name, x, n_chunks)
    want = ref.compress(name, x, n_chunks, KEEP)
    assert c.size == ref.compressed_nbytes(name, n, n_chunks, KEEP)
    np.testing.assert_array_equal(c, want)
    got = decompress(name, c, n, dname, n_chunks)
    np.testing.assert_array_equal(got, ref.decompress(name, c, n, n_chunks, dtype, KEEP))
    e = np.zeros(n, dtype)
    K.codec_residual(name, DENSITY, c, raw(x), code, n_chunks, raw(e))
    np.testing.assert_array_equal(e, ref.residual(name, c, x, n_chunks, KEEP))


@pytest.mark.parametrize("name", ref.ALL)
@pytest.mark.parametrize("dname", ["float32", "bfloat16"])
@pytest.mark.parametrize("average", [False, True])
def test_host_reduce_matches_reference(name, dname, average):
    code, dtype = DTYPES[dname]
    chunk, records = 300, 3
    c = np.concatenate([compress(name, data(chunk, dtype, 7 + r, "outliers"), 1) for r in range(records)])
    got = np.zeros(chunk, dtype)
    K.codec_reduce_chunks(name, DENSITY, c, records, code, average, raw(got))
    np.testing.assert_array_equal(got, ref.reduce_chunks(name, c, chunk, records, dtype, average, KEEP))


@pytest.mark.parametrize("name", ["minmax_uint4", "minmax_uint2"])
@pytest.mark.parametrize("kind", ["normal", "outliers"])
def test_minmax_error_is_half_a_step(name, kind):
    x = data(1000, np.float32, 3, kind)
    y = decompress(name, compress(name, x, 1), x.size, "float32", 1)
    for o in range(0, 1000, 128):
        blk, got = x[o : o + 128], y[o : o + 128]
        step = (blk.max() - blk.min()) / (2 ** ref.bits(name) - 1)
        assert np.abs(got - blk).max() <= step / 2 * (1 + 1e-5) + 1e-6 * np.abs(blk).max()


def test_fp4_error_is_within_the_grid_gap():
    x = data(1000, np.float32, 4, "outliers")
    y = decompress("fp4_e2m1", compress("fp4_e2m1", x, 1), x.size, "float32", 1)
    for o in range(0, 1000, 32):
        blk, got = x[o : o + 32], y[o : o + 32]
        scale = np.abs(blk).max() / 6
        # the grid's gap is at most 2 (between 4 and 6): the error at most half of it, times scale
        assert np.all(np.abs(got - blk) <= scale * (1 + 1e-5))
        # small magnitudes are kept to a quarter of the scale
        small = np.abs(blk) <= 2 * scale
        assert np.all(np.abs(got - blk)[small] <= 0.25 * scale * (1 + 1e-5))


@pytest.mark.parametrize("name", ["topk_uint4", "topk_uint2"])
@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_topk_keeps_the_largest(name, kind):
    x = data(2 * 256 + 40, np.float32, 5, kind)
    y = decompress(name, compress(name, x, 1), x.size, "float32", 1)
    for o in range(0, x.size, 256):
        blk, got = x[o : o + 256], y[o : o + 256]
        kept = np.flatnonzero(ref.decompress(name, compress(name, blk, 1), blk.size, 1, np.float32, KEEP) != 0)
        order = np.lexsort((np.arange(blk.size), -np.abs(blk)))[: min(KEEP, blk.size)]
        assert set(kept) <= set(order)
        assert np.all(got[np.setdiff1d(np.arange(blk.size), order)] == 0)
        sel = blk[np.sort(order)]
        step = (sel.max() - sel.min()) / (2 ** ref.bits(name) - 1)
        assert np.abs(got[np.sort(order)] - sel).max() <= step / 2 * (1 + 1e-5) + 1e-6


@pytest.mark.parametrize("name", ref.ALL)
def test_error_feedback_transmits_everything_in_the_long_run(name):
    """With e <- (g + e) - decode(encode(g + e)), the values sent over T rounds sum to the inputs'
    sum minus the last residual (float32 rounding aside)."""
    rng = np.random.default_rng(9)
    n, rounds = 700, 40
    e = np.zeros(n, np.float32)
    sent = np.zeros(n, np.float64)
    total = np.zeros(n, np.float64)
    for _ in range(rounds):
        g = rng.standard_normal(n).astype(np.float32)
        total += g
        x = g + e
        c = compress(name, x, 1)
        sent += decompress(name, c, n, "float32", 1)
        K.codec_residual(name, DENSITY, c, x, 0, 1, e)
    np.testing.assert_allclose(sent + e, total, atol=1e-3)
    assert np.abs(e).max() < 20  # bounded, not growing with the rounds


@pytest.mark.parametrize("name", ref.ALL)
def test_zero_and_constant_blocks_decode_exactly(name):
    bl = ref.block_len(name)
    x = np.concatenate([np.zeros(bl), np.full(bl, -2.5), np.full(bl, 3.0)]).astype(np.float32)
    y = decompress(name, compress(name, x, 1), x.size, "float32", 1)
    if name.startswith("topk"):  # the kept ones are exact, the others zero
        for o in range(0, x.size, bl):
            assert np.count_nonzero(y[o : o + bl] == x[o : o + bl]) >= min(KEEP, bl)
    else:
        np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("name", ref.ALL)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_block_decodes_to_nan_and_is_counted(name, bad):
    bl = ref.block_len(name)
    x = data(3 * bl, np.float32, 11)
    x[bl + 5] = bad
    c = compress(name, x, 1)
    np.testing.assert_array_equal(c, ref.compress(name, x, 1, KEEP))
    y = decompress(name, c, x.size, "float32", 1)
    assert np.all(np.isnan(y[bl : 2 * bl]))
    assert np.all(np.isfinite(y[:bl])) and np.all(np.isfinite(y[2 * bl :]))
    assert K.count_nonfinite(x, 0) == 1
    assert K.count_nonfinite(x.astype(np.float64), 1) == 1
    assert K.count_nonfinite(np.zeros(5, np.float16), 2) == 0


def test_refusals():
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="unknown compression 'minmax_uint3'.*known: 'minmax_uint8', 'minmax_uint4'"):
        K.codec_compressed_nbytes("minmax_uint3", DENSITY, 10, 1)
    for density in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"topk_density must be in \(0, 1\]"):
            K.codec_compressed_nbytes("topk_uint2", density, 10, 1)
    K.codec_compressed_nbytes("topk_uint2", 1.0, 10, 1)  # every element kept
    with pytest.raises(ValueError, match="not divisible"):
        K.codec_compress("fp4_e2m1", DENSITY, x, 0, 3, np.zeros(64 * 3, np.uint8))
    with pytest.raises(ValueError, match="float32, float64, float16 or bfloat16"):
        K.codec_compress("fp4_e2m1", DENSITY, np.ones(10, np.int32), 4, 1, np.zeros(64, np.uint8))
    with pytest.raises(ValueError, match="must have 64 bytes"):
        K.codec_compress("fp4_e2m1", DENSITY, x, 0, 1, np.zeros(63, np.uint8))


# -- CUDA against the host --


@pytest.mark.gpu
@pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))
@pytest.mark.parametrize("name", ref.ALL)
@pytest.mark.parametrize("dname", DTYPES)
@pytest.mark.parametrize("n,n_chunks", [(1, 1), (257, 1), (3 * 1000, 3), (100_003, 1)])
def test_cuda_matches_host_bitwise(name, dname, n, n_chunks):
    code, dtype = DTYPES[dname]
    x = data(n, dtype, n, "outliers")
    if n > 300:
        x[n // 2] = np.nan
    c = compress(name, x, n_chunks)
    np.testing.assert_array_equal(compress(name, x, n_chunks, "cuda"), c)
    np.testing.assert_array_equal(
        decompress(name, c, n, dname, n_chunks, "cuda"), decompress(name, c, n, dname, n_chunks)
    )
    e_host, e_cuda = np.zeros(n, dtype), np.zeros(n, dtype)
    K.codec_residual(name, DENSITY, c, raw(x), code, n_chunks, raw(e_host))
    K.codec_residual(name, DENSITY, c, raw(x), code, n_chunks, raw(e_cuda), device="cuda")
    np.testing.assert_array_equal(e_cuda, e_host)
    chunk = n // n_chunks
    r_host, r_cuda = np.zeros(chunk, dtype), np.zeros(chunk, dtype)
    records = c[: n_chunks * K.codec_compressed_nbytes(name, DENSITY, chunk, 1)]
    K.codec_reduce_chunks(name, DENSITY, records, n_chunks, code, True, raw(r_host))
    K.codec_reduce_chunks(name, DENSITY, records, n_chunks, code, True, raw(r_cuda), device="cuda")
    np.testing.assert_array_equal(r_cuda, r_host)
    assert K.count_nonfinite(raw(x), code, device="cuda") == K.count_nonfinite(raw(x), code)
