"""The step kernels (csrc/ops/kernels.h) through ``_C.kernels``, on the host and on CUDA.

Host: every operation and dtype against an independent numpy reference (16-bit dtypes computed in
float32 and rounded once; MinMaxUInt8 against tests/harness/reference/minmax_uint8.py), and the binding's
argument checks. GPU (marked ``gpu``, skipped without a CUDA device): the CUDA kernels against the
host loops, bit for bit for every result that is not NaN (where the host has NaN the GPU must have
NaN too, but its sign and payload may differ: kernels/cuda_kernels.h), on sizes around the block
size and the grid-stride limit, and on empty arrays.
"""

import numpy as np
import pytest

from bagua_core import _C
from tests.gpu.available import gpu_skip_reason
from tests.harness.built_with import needs_test_bindings
from tests.harness.reference import minmax_uint8 as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

K = getattr(_C, "kernels", None)  # absent without BAGUA_TEST_BINDINGS
pytestmark = needs_test_bindings
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = {
    "float32": (0, np.dtype(np.float32)),
    "float64": (1, np.dtype(np.float64)),
    "float16": (2, np.dtype(np.float16)),
    "bfloat16": (3, BF16),
}
BETA = 0.9

# op -> (number of arrays, the first written, numpy reference in the compute type A)
REFERENCES = {
    "average_into": (2, lambda A, acc, other: (acc + other) / A(2)),
    "replica_diff": (4, lambda A, t, w, left, right: t + left / A(3) + right / A(3) - w * (A(5) / A(3))),
    "add_into": (2, lambda A, acc, other: acc + other),
    "momentum_update": (2, lambda A, m, g: A(BETA) * m + A(1.0 - BETA) * g),
    "apply_average": (3, lambda A, w, snapshot, avg: avg + (w - snapshot)),
}
OPS = list(REFERENCES)


def dtypes_of(op):
    return ["float32", "float64"] if op == "momentum_update" else list(DTYPES)


CASES = [(op, d) for op in OPS for d in dtypes_of(op)]
CASE_IDS = [f"{op}-{d}" for op, d in CASES]


def finfo(dtype):
    return ml_dtypes.finfo(dtype) if dtype == BF16 else np.finfo(dtype)


def data(n, dtype, seed):
    """Values over many magnitudes, with zeros, infinities, NaN, subnormals and near-overflow values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5, n)
    fi = finfo(dtype)
    specials = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        float(fi.smallest_subnormal) * 3,
        -float(fi.smallest_normal),
        float(fi.max) / 2,
    ]
    k = min(n, 24)
    x[rng.choice(n, k, replace=False)] = rng.choice(specials, k)
    return x.astype(dtype)


def raw(a):
    """What the binding takes: bfloat16 as its uint16 bits (numpy's buffer protocol has no bfloat16)."""
    return a.view(np.uint16) if a.dtype == BF16 else a


def bits(a):
    return a.view(f"u{a.dtype.itemsize}")


def assert_same(got, want, what=""):
    """NaN exactly where `want` has NaN; every other element bit for bit."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan, err_msg=f"{what}: NaN positions")
    bad = np.flatnonzero(bits(got)[~nan] != bits(want)[~nan])
    if bad.size:
        i = np.flatnonzero(~nan)[bad[:6]]
        pytest.fail(f"{what}: {bad.size} of {got.size} differ, e.g. at {list(i)}: got {got[i]}, want {want[i]}")


def run(op, arrays, dname, device):
    """Runs `op` on copies of `arrays`; returns the written one."""
    code, _ = DTYPES[dname]
    out = [a.copy() for a in arrays]
    extra = (BETA,) if op == "momentum_update" else ()
    getattr(K, op)(*[raw(a) for a in out], code, *extra, device=device)
    for a, b in zip(out[1:], arrays[1:]):
        np.testing.assert_array_equal(bits(a), bits(b))  # inputs untouched
    return out[0]


def inputs(op, dname, n, seed=0):
    count, _ = REFERENCES[op]
    return [data(n, DTYPES[dname][1], seed * 10 + i) for i in range(count)]


def reference(op, arrays, dname):
    _, fn = REFERENCES[op]
    dtype = DTYPES[dname][1]
    A = np.float64 if dtype == np.float64 else np.float32
    with np.errstate(all="ignore"):
        return fn(A, *[a.astype(A) for a in arrays]).astype(dtype)


# ---- host: the step kernels against numpy ---------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 1000])
@pytest.mark.parametrize("op,dname", CASES, ids=CASE_IDS)
def test_host_matches_numpy(op, dname, n):
    arrays = inputs(op, dname, n, seed=n)
    assert_same(run(op, arrays, dname, "cpu"), reference(op, arrays, dname), f"{op} {dname}")


def test_host_momentum_rejects_16_bit_dtypes():
    for dname in ("float16", "bfloat16"):
        m, g = inputs("momentum_update", dname, 4)
        with pytest.raises(ValueError, match="float32 or float64"):
            K.momentum_update(raw(m), raw(g), DTYPES[dname][0], BETA)


def test_host_multidimensional_arrays_are_flat():
    a, b = data(12, np.float32, 1).reshape(3, 4), data(12, np.float32, 2).reshape(3, 4)
    want = reference("add_into", [a, b], "float32")
    K.add_into(a, b, 0)
    assert_same(a, want)


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("n_chunks,chunk_len", [(1, 1), (3, 257), (4, 1000)])
def test_host_minmax_uint8_matches_reference(dname, n_chunks, chunk_len):
    code, dtype = DTYPES[dname]
    x = (np.random.default_rng(chunk_len).standard_normal(n_chunks * chunk_len) * 3).astype(dtype)
    c = np.zeros(ref.compressed_nbytes(x.size, n_chunks), np.uint8)
    K.compress(raw(x), code, n_chunks, c)
    want_c = ref.compress(x, n_chunks)
    np.testing.assert_array_equal(c[:8].view("<f4"), np.asarray(want_c)[:8].view("<f4"))
    np.testing.assert_array_equal(c, want_c)
    y = np.zeros(x.size, dtype)
    K.decompress(c, code, n_chunks, raw(y))
    assert_same(y, ref.decompress(c, x.size, n_chunks, dtype))
    for average in (False, True):
        r = np.zeros(chunk_len, dtype)
        K.reduce_chunks(c, n_chunks, code, average, raw(r))
        assert_same(r, ref.reduce_chunks(c, chunk_len, n_chunks, dtype, average))


WIRES = ["float16", "bfloat16"]


def wire_inputs(dname, wname, n, n_records=1, seed=0):
    """Data of dtype dname and n_records wire records of n elements each (encoded by numpy)."""
    x = data(n, DTYPES[dname][1], seed)
    w = DTYPES[wname][1]
    with np.errstate(over="ignore"):  # values beyond float16's range become infinities
        records = np.concatenate([data(n, np.float32, seed + 1 + r).astype(w) for r in range(n_records)])
    return x, records


def wire_ops(x, records, dname, wname, n_records, average, device):
    """encode(x), decode(the first record) and reduce(records) with the step kernels on `device`."""
    code, dtype = DTYPES[dname]
    wcode, w = DTYPES[wname]
    n = x.size
    enc = np.zeros(n, w)
    K.wire_encode(raw(x), code, wcode, raw(enc), device=device)
    dec = np.zeros(n, dtype)
    K.wire_decode(raw(records[:n]), wcode, code, raw(dec), device=device)
    red = np.zeros(n, dtype)
    K.wire_reduce(raw(records), n_records, wcode, code, average, raw(red), device=device)
    return enc, dec, red


@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("wname", WIRES)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_host_wire_kernels_match_numpy(dname, wname, average):
    """Through float32, rounded to nearest even; the records summed in float32, record 0 first."""
    dtype, w = DTYPES[dname][1], DTYPES[wname][1]
    n, n_records = 1000, 3
    x, records = wire_inputs(dname, wname, n, n_records)
    enc, dec, red = wire_ops(x, records, dname, wname, n_records, average, "cpu")
    with np.errstate(all="ignore"):  # the data holds infinities, NaN and values beyond float16
        assert_same(enc, x.astype(np.float32).astype(w), "encode")
        assert_same(dec, records[:n].astype(np.float32).astype(dtype), "decode")
        acc = records[:n].astype(np.float32)
        for r in range(1, n_records):
            acc = acc + records[r * n : (r + 1) * n].astype(np.float32)
        if average:
            acc = acc / np.float32(n_records)
        assert_same(red, acc.astype(dtype), "reduce")


def test_wire_kernels_reject_bad_dtypes():
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        K.wire_encode(x, 0, 0, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="float32, float64, float16 or bfloat16"):
        K.wire_encode(x.view(np.int32), 4, 2, np.zeros(4, np.float16))
    with pytest.raises(ValueError, match="dst"):
        K.wire_encode(x, 0, 2, np.zeros(3, np.float16))
    with pytest.raises(ValueError, match="n_records"):
        K.wire_reduce(np.zeros(4, np.float16), 0, 2, 0, True, x)


# ---- host: the binding's checks -----------------------------------------------------------------


def test_bad_arguments_raise():
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match="device"):
        K.add_into(a, b, 0, device="gpu")
    with pytest.raises(ValueError, match="elements"):
        K.add_into(a, b[:3], 0)
    with pytest.raises(ValueError, match="bytes"):
        K.add_into(a, b.astype(np.float64), 0)
    with pytest.raises(ValueError, match="floating"):
        K.add_into(a.view(np.int32), b.view(np.int32), 4)
    with pytest.raises(ValueError, match="dtype"):
        K.add_into(a, b, 42)
    with pytest.raises(ValueError, match="contiguous"):
        K.add_into(np.ones(8, np.float32)[::2], b, 0)
    ro = np.ones(4, np.float32)
    ro.setflags(write=False)
    with pytest.raises((ValueError, BufferError)):
        K.add_into(ro, b, 0)
    with pytest.raises(ValueError, match="dst"):
        K.compress(a, 0, 1, np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="src"):
        K.decompress(np.zeros(8, np.uint8), 0, 1, a)
    with pytest.raises(ValueError, match="src"):
        K.reduce_chunks(np.zeros(8, np.uint8), 1, 0, False, a)
    with pytest.raises(ValueError):
        K.compress(a, 0, 3, np.zeros(ref.compressed_nbytes(4, 3), np.uint8))  # 4 % 3 != 0
    assert np.all(a == 1) and np.all(b == 1)


def test_cuda_without_a_device_raises_clearly():
    if _C.built_with_cuda and _C.cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA device")
    a, b = np.ones(4, np.float32), np.ones(4, np.float32)
    with pytest.raises(_C.BaguaError, match="CUDA"):
        K.average_into(a, b, 0, device="cuda")
    assert np.all(a == 1)


# ---- GPU: the CUDA kernels against the host loops -------------------------------------------------


NO_CUDA = gpu_skip_reason(torch_needed=False)


def gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(NO_CUDA is not None, reason=NO_CUDA or "")(test))


# 256 threads a block, at most 4096 blocks: sizes off the block size and past one grid's reach.
GPU_SIZES = [0, 1, 255, 256, 257, 4099, 256 * 4096 + 3]


@gpu
@pytest.mark.parametrize("n", GPU_SIZES)
@pytest.mark.parametrize("op,dname", CASES, ids=CASE_IDS)
def test_cuda_matches_host_bitwise(op, dname, n):
    arrays = inputs(op, dname, n, seed=n + 1)
    assert_same(run(op, arrays, dname, "cuda"), run(op, arrays, dname, "cpu"), f"{op} {dname} n={n}")


@gpu
def test_cuda_momentum_rejects_16_bit_dtypes():
    m, g = inputs("momentum_update", "float16", 4)
    with pytest.raises(ValueError, match="float32 or float64"):
        K.momentum_update(m, g, DTYPES["float16"][0], BETA, device="cuda")


@gpu
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize(
    "n_chunks,chunk_len,target", [(1, 0, -1), (1, 1, -1), (3, 257, -1), (3, 257, 1), (4, 70001, -1)]
)
def test_cuda_minmax_uint8_matches_host(dname, n_chunks, chunk_len, target):
    code, dtype = DTYPES[dname]
    x = data(n_chunks * chunk_len, dtype, chunk_len)
    if chunk_len > 1000:
        x[:chunk_len] = np.abs(x[:chunk_len])  # NaN / Inf in some chunks only
        x[:chunk_len][~np.isfinite(x[:chunk_len].astype(np.float64))] = 1
    c0 = np.full(ref.compressed_nbytes(x.size, n_chunks), 7, np.uint8)
    compressed = {}
    for device in ("cpu", "cuda"):
        c = c0.copy()
        K.compress(raw(x), code, n_chunks, c, target, device=device)
        compressed[device] = c
    np.testing.assert_array_equal(compressed["cuda"], compressed["cpu"])
    c = compressed["cpu"]
    if target >= 0:
        return
    y = {d: np.zeros(x.size, dtype) for d in ("cpu", "cuda")}
    r = {d: np.zeros(chunk_len, dtype) for d in ("cpu", "cuda")}
    for device in ("cpu", "cuda"):
        K.decompress(c, code, n_chunks, raw(y[device]), device=device)
        K.reduce_chunks(c, n_chunks, code, True, raw(r[device]), device=device)
    assert_same(y["cuda"], y["cpu"], "decompress")
    assert_same(r["cuda"], r["cpu"], "reduce_chunks")


@gpu
@pytest.mark.parametrize("n", [1, 257, 256 * 4096 + 3])
@pytest.mark.parametrize("wname", WIRES)
@pytest.mark.parametrize("dname", list(DTYPES))
def test_cuda_wire_kernels_match_host(dname, wname, n):
    x, records = wire_inputs(dname, wname, n, 3, seed=n)
    for average in (False, True):
        host = wire_ops(x, records, dname, wname, 3, average, "cpu")
        cuda = wire_ops(x, records, dname, wname, 3, average, "cuda")
        for what, got, want in zip(("encode", "decode", "reduce"), cuda, host):
            assert_same(got, want, f"{what} {dname}->{wname} n={n} average={average}")
