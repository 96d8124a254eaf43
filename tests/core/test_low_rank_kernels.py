"""The low-rank step's kernels (csrc/ops/low_rank_kernels.h) through ``_C.kernels``.

Host: P = M Q, Q = M^T P, M = P Q^T (alone and with error feedback fused in), the orthogonalisation
and error feedback, for every dtype, against the numpy reference of their documented summation
orders (tests/harness/reference/low_rank.py), bit for bit, with every instruction set this CPU runs (the
vectorised copies must give the baseline's bits), on shapes around the lane counts and the host
loops' blocks. GPU (marked ``gpu``, skipped
without a CUDA device): the CUDA kernels against the host loops, bit for bit.
"""

import numpy as np
import pytest

from bagua_core import _C, compression
from tests.gpu.available import gpu_skip_reason
from tests.harness.built_with import needs_test_bindings
from tests.harness.reference import low_rank as ref

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
# (n, m): below, at and past the 32 and 256 lanes, a row past the 2048-column block of M = P Q^T,
# and Q = M^T P's column blocks (16 KiB of sums: 4096 float32 columns at rank 1)
SHAPES = [(1, 1), (3, 31), (33, 32), (65, 257), (300, 33), (5, 2100), (7, 4100)]
RANKS = [1, 2, 3, 5]


def raw(a):
    """What the binding takes: bfloat16 as its uint16 bits (numpy's buffer protocol has no bfloat16)."""
    return a.view(np.uint16) if a.dtype == BF16 else a


def bits(a):
    return a.view(f"u{a.dtype.itemsize}")


def assert_same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, what
    bad = np.flatnonzero(bits(got).ravel() != bits(want).ravel())
    if bad.size:
        i = bad[:6]
        pytest.fail(
            f"{what}: {bad.size} of {got.size} differ, e.g. at {list(i)}: got {got.ravel()[i]}, want {want.ravel()[i]}"
        )


def matrices(n, m, r, dname, seed):
    """M (n x m, dtype) of gradient-like values, Q (m x r) and P (n x r) in the compute type."""
    dtype = DTYPES[dname][1]
    A = ref.compute_type(dtype)
    rng = np.random.default_rng(seed)
    M = (rng.standard_normal((n, m)) * 10.0 ** rng.integers(-3, 2, (n, 1))).astype(dtype)
    Q = rng.standard_normal((m, r)).astype(A)
    P = rng.standard_normal((n, r)).astype(A)
    return M, Q, P


def kernel_outputs(M, Q, P, dname, device="cpu"):
    """The three products and the two orthogonalisations, each from the same inputs."""
    code, dtype = DTYPES[dname]
    (n, m), r = M.shape, Q.shape[1]
    A = ref.compute_type(dtype)
    out = {}
    p = np.full((n, r), np.nan, A)
    K.low_rank_mq(raw(M), Q, p, n, m, r, code, device=device)
    out["mq"] = p
    q = np.full((m, r), np.nan, A)
    K.low_rank_mtp(raw(M), P, q, n, m, r, code, device=device)
    out["mtp"] = q
    mm = np.full((n, m), 7, dtype)
    K.low_rank_pqt(P, Q, raw(mm), n, m, r, code, device=device)
    out["pqt"] = mm
    a_code = DTYPES["float64" if A == np.float64 else "float32"][0]
    for name, mat in (("orth_q", Q), ("orth_p", P)):
        o = mat.copy()
        K.low_rank_orthogonalize(o, o.shape[0], o.shape[1], a_code, 1e-8 if name == "orth_p" else 0.0, device=device)
        out[name] = o
    return out


def fused_outputs(M, Q, P, E, dname, device="cpu"):
    """P = M Q with error feedback's fold, M = P Q^T with its finish: (M, error, P) after each."""
    code, _ = DTYPES[dname]
    (n, m), r = M.shape, Q.shape[1]
    mm, e, p = M.copy(), E.copy(), np.zeros_like(P)
    K.low_rank_mq(raw(mm), Q, p, n, m, r, code, device=device, error=e)
    out = {"mq_m": mm, "mq_error": e, "mq": p}
    mm, e = M.copy(), E.copy()
    K.low_rank_pqt(P, Q, raw(mm), n, m, r, code, device=device, error=e)
    out.update({"pqt": mm, "pqt_error": e})
    return out


def references(M, Q, P, dname):
    dtype = DTYPES[dname][1]
    return {
        "mq": ref.mq(M, Q),
        "mtp": ref.mtp(M, P),
        "pqt": ref.pqt(P, Q, dtype),
        "orth_q": ref.orthogonalize(Q, 0.0),
        "orth_p": ref.orthogonalize(P, 1e-8),
    }


@pytest.fixture(params=compression.CPU_ISAS)
def isa(request):
    if request.param not in compression.supported_cpu_isas():
        pytest.skip(f"this CPU does not run {request.param} (supports {compression.supported_cpu_isas()})")
    before = compression.cpu_isa()
    compression.set_cpu_isa(request.param)
    yield request.param
    compression.set_cpu_isa(before)


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("n,m", SHAPES)
def test_host_products_and_orthogonalisation_match_reference_bitwise(isa, dname, n, m):
    for r in RANKS:
        M, Q, P = matrices(n, m, r, dname, seed=n * 1000 + m + r)
        got = kernel_outputs(M, Q, P, dname)
        for name, want in references(M, Q, P, dname).items():
            assert_same(got[name], want, f"{name} {dname} n={n} m={m} r={r} isa={isa}")


def error_memory(M, seed):
    A = ref.compute_type(M.dtype)
    return (np.random.default_rng(seed).standard_normal(M.shape) * 0.01).astype(A)


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("n,m", [(3, 31), (65, 257), (5, 2100)])
def test_host_products_with_error_feedback_match_reference_bitwise(isa, dname, n, m):
    dtype = DTYPES[dname][1]
    for r in (1, 3):
        M, Q, P = matrices(n, m, r, dname, seed=n + m + r)
        E = error_memory(M, r)
        got = fused_outputs(M, Q, P, E, dname)
        folded, error = ref.fold_error(M, E)
        product = ref.pqt(P, Q, dtype)
        want = {
            "mq_m": folded,
            "mq_error": error,
            "mq": ref.mq(folded, Q),
            "pqt": product,
            "pqt_error": ref.finish_error(product, E),
        }
        for name, w in want.items():
            assert_same(got[name], w, f"{name} {dname} n={n} m={m} r={r} isa={isa}")


def test_orthogonalisation_gives_orthonormal_columns_and_keeps_zero_columns():
    rng = np.random.default_rng(3)
    mat = rng.standard_normal((500, 4)).astype(np.float32)
    mat[:, 2] = 0
    K.low_rank_orthogonalize(mat, 500, 4, DTYPES["float32"][0], 0.0)
    gram = mat.T.astype(np.float64) @ mat
    np.testing.assert_allclose(gram, np.diag([1.0, 1.0, 0.0, 1.0]), atol=1e-5)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_host_error_feedback_matches_reference_bitwise(isa, dname):
    code, dtype = DTYPES[dname]
    A = ref.compute_type(dtype)
    rng = np.random.default_rng(5)
    for n in (1, 31, 1000):
        data = rng.standard_normal(n).astype(dtype)
        error = (rng.standard_normal(n) * 0.01).astype(A)
        d, e = data.copy(), error.copy()
        K.low_rank_fold_error(raw(d), e, code)
        want_d, want_e = ref.fold_error(data, error)
        assert_same(d, want_d, f"fold data {dname} n={n}")
        assert_same(e, want_e, f"fold error {dname} n={n}")
        K.low_rank_finish_error(raw(d), e, code)
        assert_same(e, ref.finish_error(d, want_e), f"finish {dname} n={n}")


def test_bad_arguments_raise():
    M, Q, P = matrices(4, 6, 2, "float32", 0)
    with pytest.raises(ValueError, match="P must have"):
        K.low_rank_mq(M, Q, np.zeros(7, np.float32), 4, 6, 2, 0)
    with pytest.raises(ValueError, match="Q must have"):
        K.low_rank_mq(M, Q.astype(np.float64), P, 4, 6, 2, 0)  # Q of float32 data is float32
    with pytest.raises(ValueError, match="M must have"):
        K.low_rank_pqt(P, Q, np.zeros((4, 5), np.float32), 4, 6, 2, 0)
    with pytest.raises(ValueError, match="float32 or float64"):
        K.low_rank_orthogonalize(np.zeros(4, np.float16), 2, 2, DTYPES["float16"][0], 0.0)
    with pytest.raises(ValueError, match="r must be >= 1"):
        K.low_rank_mtp(M, P, Q, 4, 6, 0, 0)
    with pytest.raises(ValueError, match="error must have"):
        K.low_rank_mq(M, Q, P, 4, 6, 2, 0, error=np.zeros(5, np.float32))


# ---- GPU: the CUDA kernels against the host loops -------------------------------------------------

NO_CUDA = gpu_skip_reason(torch_needed=False)


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA is not None, reason=NO_CUDA or "")
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("n,m", SHAPES + [(1024, 1024), (4099, 129)])
def test_cuda_matches_host_bitwise(dname, n, m):
    for r in RANKS:
        M, Q, P = matrices(n, m, r, dname, seed=n + m + r)
        E = error_memory(M, r)
        host = kernel_outputs(M, Q, P, dname, "cpu")
        host.update(fused_outputs(M, Q, P, E, dname, "cpu"))
        got = kernel_outputs(M, Q, P, dname, "cuda")
        got.update(fused_outputs(M, Q, P, E, dname, "cuda"))
        for name, g in got.items():
            assert_same(g, host[name], f"{name} {dname} n={n} m={m} r={r}")
