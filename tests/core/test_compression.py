"""MinMaxUInt8 compression on the CPU against the numpy reference (tests/harness/reference/minmax_uint8.py)."""

import numpy as np
import pytest

from bagua_core import _C, Buffer, DType, as_dtype, compression, from_array
from tests.harness.reference import minmax_uint8 as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
DTYPE_IDS = ["float32", "float64", "float16", "bfloat16"]
HEADER = ref.HEADER_NBYTES


def random_data(n, dtype, seed, kind="normal"):
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n) * 3.0 + 0.5
    elif kind == "uniform":
        x = rng.uniform(-1e-3, 2e-3, n)
    else:  # outliers
        x = rng.standard_normal(n)
        x[:: max(1, n // 5)] *= 1000.0
    return x.astype(dtype)


def host(a):
    """A numpy view of an allocated output (bagua_core.Buffer) or a numpy copy of a torch tensor."""
    if isinstance(a, Buffer):
        return a.numpy()
    if type(a).__module__.startswith("torch"):
        return from_array(a.cpu()).numpy()  # torch bfloat16 too (numpy has none)
    return np.asarray(a)


def allocated(buf, dtype, size):
    """Checks that buf is a new 1-D core Buffer of `size` elements of `dtype`; returns its numpy view."""
    assert isinstance(buf, Buffer)
    assert buf.dtype == as_dtype(dtype) and buf.shape == (size,) and buf.device_type == "cpu"
    a = buf.numpy()
    assert a.dtype == np.dtype(dtype) and a.shape == (size,) and a.ctypes.data == buf.address  # zero-copy
    return a


def f32(a):
    return host(a).astype(np.float32)


def assert_same_bytes(got, want, chunk_len, n_chunks):
    """Headers equal as floats (NaN == NaN, -0 == +0), every other byte identical."""
    got, want = host(got), host(want)
    assert got.shape == want.shape
    rb = ref.record_nbytes(chunk_len)
    for k in range(n_chunks):
        g, w = got[k * rb : (k + 1) * rb], want[k * rb : (k + 1) * rb]
        np.testing.assert_array_equal(g[:8].copy().view("<f4"), w[:8].copy().view("<f4"), err_msg=f"header {k}")
        np.testing.assert_array_equal(g[8:], w[8:], err_msg=f"record {k}")


# ---- layout ------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_len", [0, 1, 31, 32, 33, 64, 1000])
def test_record_size_is_64_byte_multiple(chunk_len):
    rb = compression.record_nbytes(chunk_len)
    assert rb == ref.record_nbytes(chunk_len)
    assert rb % 64 == 0 and rb >= HEADER + chunk_len
    assert compression.compressed_nbytes(3 * chunk_len, 3) == 3 * rb


def test_allocated_outputs_are_64_byte_aligned():
    c = compression.compress(np.ones(100, np.float32), 4)
    assert isinstance(c, Buffer) and c.address % 64 == 0
    assert np.from_dlpack(c).ctypes.data == c.address
    d = compression.decompress(c, 100, np.float32, 4)
    assert isinstance(d, Buffer) and d.address % 64 == 0
    r = compression.reduce_chunks(c, 25, 4, np.float32)
    assert isinstance(r, Buffer) and r.address % 64 == 0


# ---- codes and decoded values against the reference --------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n_chunks", [1, 2, 3, 4])
@pytest.mark.parametrize("chunk_len", [1, 7, 33, 65, 1000, 4099])
def test_compress_matches_reference(dtype, n_chunks, chunk_len):
    x = random_data(n_chunks * chunk_len, dtype, seed=chunk_len * 10 + n_chunks)
    c = compression.compress(x, n_chunks)
    allocated(c, np.uint8, ref.compressed_nbytes(x.size, n_chunks))
    assert_same_bytes(c, ref.compress(x, n_chunks), chunk_len, n_chunks)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n_chunks", [1, 3, 4])
@pytest.mark.parametrize("kind", ["normal", "uniform", "outliers"])
def test_decompress_matches_reference_and_input(dtype, n_chunks, kind):
    chunk_len = 517
    x = random_data(n_chunks * chunk_len, dtype, seed=n_chunks, kind=kind)
    c = compression.compress(x, n_chunks)
    y = allocated(compression.decompress(c, x.size, dtype, n_chunks), dtype, x.size)
    np.testing.assert_array_equal(y, ref.decompress(host(c), x.size, n_chunks, dtype))
    # Within one quantisation step of the input (half a step plus the output dtype's rounding).
    for k in range(n_chunks):
        xs, ys = f32(x[k * chunk_len : (k + 1) * chunk_len]), f32(y[k * chunk_len : (k + 1) * chunk_len])
        step = (xs.max() - xs.min()) / 255
        assert np.max(np.abs(ys - xs)) <= step


def test_decoded_error_is_at_most_half_a_step_in_float32():
    x = random_data(10000, np.float32, seed=7)
    y = host(compression.decompress(compression.compress(x, 1), x.size, np.float32, 1))
    step = (x.max() - x.min() + 1e-7) / 255
    assert np.max(np.abs(y - x)) <= 0.5 * step * (1 + 1e-4)


def test_multidimensional_input_is_flattened():
    x = random_data(24, np.float32, seed=1).reshape(2, 3, 4)
    np.testing.assert_array_equal(host(compression.compress(x, 2)), host(compression.compress(x.reshape(-1), 2)))


def test_accepts_torch_and_jax_cpu_arrays():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    x = random_data(96, np.float32, seed=3)
    want = host(compression.compress(x, 3))
    np.testing.assert_array_equal(host(compression.compress(torch.from_numpy(x.copy()), 3)), want)
    np.testing.assert_array_equal(host(compression.compress(jnp.asarray(x), 3)), want)
    # torch tensors as outputs are written in place and returned.
    out = torch.zeros(want.size, dtype=torch.uint8)
    assert compression.compress(x, 3, out=out) is out
    np.testing.assert_array_equal(out.numpy(), want)
    y = torch.zeros(96, dtype=torch.float16)
    assert compression.decompress(want, 96, torch.float16, 3, out=y) is y
    np.testing.assert_array_equal(y.numpy(), ref.decompress(want, 96, 3, np.float16))
    # bfloat16 from numpy (ml_dtypes), torch and jax alike, as inputs and outputs.
    xb = x.astype(ml_dtypes.bfloat16)
    want_b = host(compression.compress(xb, 3))
    tb = torch.from_numpy(x).to(torch.bfloat16)  # rounds like ml_dtypes: the same values as xb
    np.testing.assert_array_equal(host(compression.compress(tb, 3)), want_b)
    np.testing.assert_array_equal(host(compression.compress(jnp.asarray(xb), 3)), want_b)
    yb = torch.zeros(96, dtype=torch.bfloat16)
    assert compression.decompress(want_b, 96, torch.bfloat16, 3, out=yb) is yb
    np.testing.assert_array_equal(host(yb), ref.decompress(want_b, 96, 3, ml_dtypes.bfloat16))
    rb = torch.zeros(32, dtype=torch.bfloat16)
    compression.reduce_chunks(want_b, 32, 3, torch.bfloat16, out=rb)
    np.testing.assert_array_equal(host(rb), ref.reduce_chunks(want_b, 32, 3, ml_dtypes.bfloat16, True))


def test_allocated_outputs_view_zero_copy_in_torch_and_jax():
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    x = random_data(64, ml_dtypes.bfloat16, seed=4)
    c = compression.compress(x, 2)
    y = compression.decompress(c, 64, "bfloat16", 2)
    t = torch.from_dlpack(y)
    assert t.dtype == torch.bfloat16 and t.data_ptr() == y.address
    np.testing.assert_array_equal(host(t), host(y))
    j = jnp.from_dlpack(c)
    assert j.dtype == jnp.uint8 and j.unsafe_buffer_pointer() == c.address
    np.testing.assert_array_equal(np.asarray(j), host(c))


def test_buffers_as_inputs_and_outputs():
    x = from_array(random_data(90, np.float16, seed=6))
    want = ref.compress(host(x), 3)
    out = Buffer([want.size], DType.uint8)
    assert compression.compress(x, 3, out=out) is out
    assert_same_bytes(out, want, 30, 3)
    y = Buffer([90], DType.float16)
    assert compression.decompress(out, 90, DType.float16, 3, out=y) is y
    np.testing.assert_array_equal(host(y), ref.decompress(want, 90, 3, np.float16))


# ---- target_chunk ------------------------------------------------------------------------------


@pytest.mark.parametrize("n_chunks", [2, 3, 4])
def test_target_chunk_rewrites_only_that_record(n_chunks):
    chunk_len = 45
    x = random_data(n_chunks * chunk_len, np.float32, seed=n_chunks)
    full = host(compression.compress(x, n_chunks))
    rb = ref.record_nbytes(chunk_len)
    for k in range(n_chunks):
        out = np.full(full.size, 0xAB, dtype=np.uint8)
        compression.compress(x, n_chunks, out=out, target_chunk=k)
        np.testing.assert_array_equal(out[k * rb : (k + 1) * rb], full[k * rb : (k + 1) * rb])
        others = np.delete(out, np.s_[k * rb : (k + 1) * rb])
        assert np.all(others == 0xAB)
        # Allocated here: the other records are zero.
        alloc = host(compression.compress(x, n_chunks, target_chunk=k))
        np.testing.assert_array_equal(alloc[k * rb : (k + 1) * rb], full[k * rb : (k + 1) * rb])
        assert not np.any(np.delete(alloc, np.s_[k * rb : (k + 1) * rb]))


def test_target_chunk_decompress_writes_only_that_chunk():
    n_chunks, chunk_len = 4, 37
    x = random_data(n_chunks * chunk_len, np.float16, seed=5)
    c = compression.compress(x, n_chunks)
    full = host(compression.decompress(c, x.size, np.float16, n_chunks))
    for k in range(n_chunks):
        out = np.full(x.size, 42.0, dtype=np.float16)
        compression.decompress(c, x.size, np.float16, n_chunks, out=out, target_chunk=k)
        sl = slice(k * chunk_len, (k + 1) * chunk_len)
        np.testing.assert_array_equal(out[sl], full[sl])
        assert np.all(np.delete(out, np.s_[sl]) == 42.0)
        # Allocated here: the other chunks are zero.
        alloc = host(compression.decompress(c, x.size, np.float16, n_chunks, target_chunk=k))
        np.testing.assert_array_equal(alloc[sl], full[sl])
        assert not np.any(np.delete(alloc, np.s_[sl]))


# ---- reduce_chunks -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("n_records", [1, 2, 3, 5])
@pytest.mark.parametrize("average", [True, False], ids=["avg", "sum"])
def test_reduce_chunks_matches_reference(dtype, n_records, average):
    chunk_len = 2500  # more than one tile of the CPU loop
    peers = [random_data(chunk_len, dtype, seed=r) for r in range(n_records)]
    c = np.concatenate([host(compression.compress(p, 1)) for p in peers])
    y = allocated(compression.reduce_chunks(c, chunk_len, n_records, dtype, average=average), dtype, chunk_len)
    np.testing.assert_array_equal(y, ref.reduce_chunks(c, chunk_len, n_records, dtype, average))
    # And close to the reduction of the uncompressed inputs.
    exact = np.sum([f32(p) for p in peers], axis=0) / (n_records if average else 1)
    steps = sum((f32(p).max() - f32(p).min()) / 255 for p in peers) / (n_records if average else 1)
    rel = {np.float16: 2**-10, ml_dtypes.bfloat16: 2**-7}.get(dtype, 0)
    assert np.all(np.abs(f32(y) - exact) <= steps + rel * np.abs(exact))


def test_reduce_chunks_of_bytegrad_alltoall_slots():
    # ByteGrad: each peer compresses its bucket into n chunks; after alltoall, rank r holds
    # record r of every peer, and reduces them into its chunk of the average.
    n, chunk_len = 3, 70
    buckets = [random_data(n * chunk_len, np.float32, seed=10 + p) for p in range(n)]
    compressed = [host(compression.compress(b, n)) for b in buckets]
    rb = compression.record_nbytes(chunk_len)
    mean = np.mean(buckets, axis=0)
    for r in range(n):
        received = np.concatenate([c[r * rb : (r + 1) * rb] for c in compressed])
        y = host(compression.reduce_chunks(received, chunk_len, n, np.float32, average=True))
        want = mean[r * chunk_len : (r + 1) * chunk_len]
        step = max(np.ptp(b[r * chunk_len : (r + 1) * chunk_len]) for b in buckets) / 255
        assert np.max(np.abs(y - want)) <= step


# ---- special chunks ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, -0.0, 0.1, -3.7, 1e-30, 65504.0, 1e30, -3e38])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_constant_chunk_decodes_exactly(value, dtype):
    x = np.concatenate([np.full(50, value), np.linspace(-1, 1, 50)]).astype(dtype)
    c = host(compression.compress(x, 2))
    assert_same_bytes(c, ref.compress(x, 2), 50, 2)
    want = x[:50].astype(np.float32).astype(dtype)  # float64 elements are float32 inside the format
    y = host(compression.decompress(c, 100, dtype, 2))
    np.testing.assert_array_equal(y[:50], want)
    y1 = host(compression.reduce_chunks(c[: compression.record_nbytes(50)], 50, 1, dtype, average=True))
    np.testing.assert_array_equal(y1, want)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_constant_low_precision_chunk_decodes_exactly(dtype):
    x = np.full(33, 0.3, dtype=dtype)
    y = host(compression.decompress(compression.compress(x, 1), 33, dtype, 1))
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_non_finite_chunk_decodes_to_nan(bad, dtype):
    n_chunks, chunk_len = 3, 40
    x = random_data(n_chunks * chunk_len, dtype, seed=2)
    x[chunk_len + 17] = bad  # in chunk 1 only
    c = host(compression.compress(x, n_chunks))
    assert_same_bytes(c, ref.compress(x, n_chunks), chunk_len, n_chunks)
    rb = ref.record_nbytes(chunk_len)
    record = c[rb : 2 * rb]
    assert np.all(np.isnan(record[:8].copy().view("<f4")))
    assert not np.any(record[8:])  # codes 0, reserved and padding 0
    y = host(compression.decompress(c, x.size, dtype, n_chunks))
    assert np.all(np.isnan(f32(y[chunk_len : 2 * chunk_len])))
    assert np.all(np.isfinite(f32(y[:chunk_len]))) and np.all(np.isfinite(f32(y[2 * chunk_len :])))
    # A reduce over such a record gives NaN.
    records = c[: 2 * rb]
    s = compression.reduce_chunks(records, chunk_len, 2, dtype, average=False)
    assert np.all(np.isnan(f32(s)))


def test_all_nan_chunk():
    x = np.full(10, np.nan, np.float32)
    y = host(compression.decompress(compression.compress(x, 1), 10, np.float32, 1))
    assert np.all(np.isnan(y))


def test_overflowing_spread_gives_nan_chunk():
    x = np.array([-3e38, 3e38] * 8, dtype=np.float32)
    c = compression.compress(x, 1)
    assert_same_bytes(c, ref.compress(x, 1), 16, 1)
    assert np.all(np.isnan(host(compression.decompress(c, 16, np.float32, 1))))


def test_float64_beyond_float32_range_is_non_finite():
    x = np.array([1.0, 2.0, 1e300, 3.0])
    assert np.all(np.isnan(host(compression.decompress(compression.compress(x, 1), 4, np.float64, 1))))


def test_codes_stay_in_range_for_huge_magnitudes():
    # Precision of the original formula degrades here, but codes stay defined and match the reference.
    x = np.array([1e7, 1e7 + 1, 1e7 + 2, 1e7 + 3] * 4, dtype=np.float32)
    c = compression.compress(x, 2)
    assert_same_bytes(c, ref.compress(x, 2), 8, 2)


def test_empty_input():
    x = np.zeros(0, np.float32)
    c = compression.compress(x, 2)
    assert allocated(c, np.uint8, 128).size == 128 and not np.any(host(c))
    assert allocated(compression.decompress(c, 0, np.float32, 2), np.float32, 0).size == 0
    assert allocated(compression.reduce_chunks(c, 0, 2, np.float32), np.float32, 0).size == 0


# ---- bad input ---------------------------------------------------------------------------------


def test_n_not_divisible_by_n_chunks():
    with pytest.raises(ValueError, match="not divisible"):
        compression.compress(np.zeros(10, np.float32), 3)
    with pytest.raises(ValueError, match="not divisible"):
        compression.compressed_nbytes(10, 4)
    with pytest.raises(ValueError, match="n_chunks"):
        compression.compress(np.zeros(10, np.float32), 0)


def test_wrong_sizes():
    x = np.zeros(12, np.float32)
    c = host(compression.compress(x, 3))
    with pytest.raises(ValueError, match="elements"):
        compression.compress(x, 3, out=np.zeros(c.size - 1, np.uint8))
    with pytest.raises(ValueError, match="bytes"):
        compression.decompress(c[:-1], 12, np.float32, 3)
    with pytest.raises(ValueError, match="elements"):
        compression.decompress(c, 12, np.float32, 3, out=np.zeros(11, np.float32))
    with pytest.raises(ValueError, match="bytes"):
        compression.reduce_chunks(c, 4, 2, np.float32)
    with pytest.raises(ValueError, match="target_chunk"):
        compression.compress(x, 3, target_chunk=3)
    with pytest.raises(ValueError, match="target_chunk"):
        compression.decompress(c, 12, np.float32, 3, target_chunk=-2)


def test_read_only_and_overlapping_outputs():
    x = np.zeros(12, np.float32)
    out = np.zeros(compression.compressed_nbytes(12, 3), np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        compression.compress(x, 3, out=out)
    buf = np.zeros(12 * 4 + 256, np.uint8)
    with pytest.raises(ValueError, match="overlap"):
        compression.compress(buf[:48].view(np.float32), 1, out=buf[16:80])
    # Address ranges that only touch do not overlap.
    compression.compress(buf[:48].view(np.float32), 1, out=buf[48:112])
    mem = np.zeros(256, np.uint8)
    c = mem[:64]  # one record of 32 elements
    compression.compress(np.zeros(32, np.float32), 1, out=c)
    with pytest.raises(ValueError, match="overlap"):
        compression.decompress(c, 32, np.float32, 1, out=mem[32:160].view(np.float32))
    with pytest.raises(ValueError, match="overlap"):
        compression.reduce_chunks(c, 32, 1, np.float32, out=mem[60:188].view(np.float32))
    compression.reduce_chunks(c, 32, 1, np.float32, out=mem[64:192].view(np.float32))


def test_immutable_jax_output_is_refused():
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(ValueError, match="writable"):
        compression.compress(
            np.zeros(12, np.float32), 3, out=jnp.zeros(compression.compressed_nbytes(12, 3), jnp.uint8)
        )


def test_unaligned_arrays_are_refused():
    raw = np.zeros(4 * 12 + 4, np.uint8)
    with pytest.raises(ValueError, match="aligned"):
        compression.compress(raw[1:49].view(np.float32), 3)
    c = host(compression.compress(np.zeros(12, np.float32), 3))
    with pytest.raises(ValueError, match="aligned"):
        compression.decompress(c, 12, np.float32, 3, out=raw[2:50].view(np.float32))


def test_wrong_dtypes():
    with pytest.raises(TypeError, match="int32"):
        compression.compress(np.zeros(12, np.int32), 3)
    c = host(compression.compress(np.zeros(12, np.float32), 3))
    with pytest.raises(TypeError, match="uint8"):
        compression.compress(np.zeros(12, np.float32), 3, out=np.zeros(c.size, np.int8))
    with pytest.raises(TypeError, match="float16"):
        compression.decompress(c, 12, np.float32, 3, out=np.zeros(12, np.float16))
    with pytest.raises(TypeError, match="int64"):
        compression.decompress(c, 12, np.int64, 3)
    with pytest.raises(TypeError, match="uint8"):
        compression.decompress(c.view(np.int8), 12, np.float32, 3)
    with pytest.raises(TypeError):
        compression.compress([1.0, 2.0], 1)  # a list is not an array
    with pytest.raises(TypeError, match="complex64"):
        compression.compress(np.zeros(4, np.complex64), 1)
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        compression.decompress(c, 12, "complex64", 3)


def test_non_contiguous_input():
    with pytest.raises(ValueError, match="contiguous"):
        compression.compress(np.zeros(24, np.float32)[::2], 3)


def test_device_arrays_are_refused():
    class FakeCudaArray:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be imported")

    with pytest.raises(TypeError, match="CUDA compression"):
        compression.compress(FakeCudaArray(), 1)


def test_raw_binding_validates_dtype_code():
    with pytest.raises(ValueError, match="dtype"):
        _C.minmax_uint8_compress(0, 0, 99, 1, 0, -1)
    with pytest.raises(ValueError, match="int32"):
        _C.minmax_uint8_compress(0, 0, 4, 1, 0, -1)


# ---- CUDA (runs only where a GPU and a CUDA build are present) ----------------------------------


def _cuda_torch():
    torch = pytest.importorskip("torch")
    if not getattr(_C, "built_with_cuda", False) or not torch.cuda.is_available():
        pytest.skip("needs a CUDA build and a GPU")
    return torch


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n_chunks,chunk_len", [(1, 1), (3, 1001), (4, 70000)])
def test_cuda_matches_cpu(dtype, n_chunks, chunk_len):
    torch = _cuda_torch()
    tdtype = getattr(torch, dtype)
    x = torch.randn(n_chunks * chunk_len, dtype=torch.float32).to(tdtype)
    x[5 % x.numel()] = float("nan") if n_chunks == 4 else x[0]
    code = {"float32": 0, "float16": 2, "bfloat16": 3}[dtype]
    nbytes = compression.compressed_nbytes(x.numel(), n_chunks)
    cpu_c = host(compression.compress(x, n_chunks))
    xd = x.cuda()
    cd = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    _C.minmax_uint8_compress_cuda(xd.data_ptr(), x.numel(), code, n_chunks, cd.data_ptr(), -1, 0)
    yd = torch.empty_like(xd)
    _C.minmax_uint8_decompress_cuda(cd.data_ptr(), x.numel(), code, n_chunks, yd.data_ptr(), -1, 0)
    rd = torch.empty(chunk_len, dtype=tdtype, device="cuda")
    _C.minmax_uint8_reduce_chunks_cuda(cd.data_ptr(), chunk_len, n_chunks, code, True, rd.data_ptr(), 0)
    torch.cuda.synchronize()
    assert_same_bytes(cd, cpu_c, chunk_len, n_chunks)
    want_y = compression.decompress(cpu_c, x.numel(), tdtype, n_chunks)
    want_r = compression.reduce_chunks(cpu_c, chunk_len, n_chunks, tdtype)
    np.testing.assert_array_equal(host(yd), host(want_y))
    np.testing.assert_array_equal(host(rd), host(want_r))
