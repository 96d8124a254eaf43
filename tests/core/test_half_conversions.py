"""float16 / bfloat16 <-> float32 conversions of csrc/kernels/half.h, bit for bit.

Every 16-bit pattern is widened and compared with numpy (float16) and ml_dtypes (bfloat16);
narrowing is checked on every representable value, every midpoint between neighbours and the
float32 values one ulp either side of both, float32 subnormals, overflow, every class of NaN
payload and a million random float32 bit patterns. NaN payloads must match too. The conversions
run through the test-only binding ``_C._half_convert`` (the same inline functions the CPU loops and
CUDA kernels use).
"""

import numpy as np
import pytest

from bagua_core import _C
from tests.harness.built_with import needs_test_bindings

pytestmark = needs_test_bindings

FLOAT16, BFLOAT16 = 2, 3  # engine dtype codes (csrc/common/dtype.h)


def widen(bits16, code):
    bits16 = np.ascontiguousarray(bits16, dtype=np.uint16)
    out = np.full(bits16.size, 0xDEADBEEF, np.uint32)
    _C._half_convert(bits16.ctypes.data, out.ctypes.data, bits16.size, code, True)
    return out


def narrow(values32, code):
    values32 = np.ascontiguousarray(values32, dtype=np.float32)
    out = np.full(values32.size, 0xBEEF, np.uint16)
    _C._half_convert(values32.ctypes.data, out.ctypes.data, values32.size, code, False)
    return out


def assert_same_bits(got, want, inputs, what):
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = bad[:8]
        width = 8 if inputs.dtype.itemsize == 4 else 4
        shown = [f"{int(b):#0{width + 2}x}" for b in inputs.view(f"u{inputs.dtype.itemsize}")[i]]
        pytest.fail(
            f"{what}: {bad.size} of {got.size} differ, e.g. inputs {shown}: "
            f"got {[hex(int(g)) for g in got[i]]}, want {[hex(int(w)) for w in want[i]]}"
        )


def all_patterns():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def plus_minus_ulp(values32):
    """The values, their neighbours one float32 ulp either side, and the negatives of all of them."""
    v = np.asarray(values32, np.float32)
    with np.errstate(all="ignore"):
        near = np.concatenate([v, np.nextafter(v, np.float32(np.inf)), np.nextafter(v, np.float32(-np.inf))])
    return np.concatenate([near, -near])


def special_float32():
    """float32 subnormals, tiny and huge values, infinities and NaNs of every payload class."""
    rng = np.random.default_rng(1)
    sub = rng.integers(1, 1 << 23, 4096, dtype=np.uint32)  # exponent 0
    nan_payloads = np.concatenate(
        [
            np.array([1, 2, 0x1000, 0x1FFF, 0x2000, 0x2001, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF], np.uint32),
            rng.integers(1, 1 << 23, 4096, dtype=np.uint32),
        ]
    )
    bits = np.concatenate(
        [
            sub,
            0x7F800000 | nan_payloads,  # quiet and signalling NaNs
            np.array(
                [0, 0x7F800000, 0x7F7FFFFF, 0x00800000, 0x00000001], np.uint32
            ),  # 0, inf, max, min normal, min subnormal
        ]
    )
    values = [
        2.0**-25,
        2.0**-26,
        3 * 2.0**-26,
        2.0**-24,
        1.5 * 2.0**-24,
        2.0**-14,
        65504.0,
        65519.0,
        65520.0,
        65536.0,
        1e5,
        1e30,
        3e38,
        1.0,
        1 / 3,
        0.1,
    ]
    return plus_minus_ulp(np.concatenate([bits.view(np.float32), np.array(values, np.float32)]))


def random_float32(count=1 << 20):
    return np.random.default_rng(2).integers(0, 1 << 32, count, dtype=np.uint64).astype(np.uint32).view(np.float32)


# ---- float16 -----------------------------------------------------------------------------------


def test_float16_to_float32_every_bit_pattern():
    h = all_patterns()
    want = h.view(np.float16).astype(np.float32).view(np.uint32)
    assert_same_bits(widen(h, FLOAT16), want, h, "float16 -> float32")


def float16_boundaries():
    """Every finite float16 value, and every midpoint between neighbours (ties), as float32."""
    v = np.arange(0x7C00, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)  # 0 .. 65504
    v = np.append(v, 65536.0)  # where the next binade would start: 65520 is the tie that rounds to inf
    mids = (v[:-1] + v[1:]) / 2
    both = np.concatenate([v, mids])
    assert np.all(both.astype(np.float32).astype(np.float64) == both)  # exact in float32
    return both.astype(np.float32)


@pytest.mark.parametrize("kind", ["boundaries", "special", "random"])
def test_float32_to_float16(kind):
    x = {
        "boundaries": lambda: plus_minus_ulp(float16_boundaries()),
        "special": special_float32,
        "random": random_float32,
    }[kind]()
    with np.errstate(all="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert_same_bits(narrow(x, FLOAT16), want, x, f"float32 -> float16 ({kind})")


def test_float16_round_trip_is_identity():
    h = all_patterns()
    assert_same_bits(narrow(widen(h, FLOAT16).view(np.float32), FLOAT16), h, h, "float16 round trip")


def test_odd_lengths_and_offsets():
    # Vectorised loops have a scalar tail: every length up to two vectors, at odd element offsets.
    x = random_float32(4099)
    with np.errstate(all="ignore"):
        want16 = x.astype(np.float16).view(np.uint16)
    for start in (0, 1, 3):
        for n in list(range(0, 40)) + [4096]:
            xs = x[start : start + n]
            assert_same_bits(narrow(xs, FLOAT16), want16[start : start + n], xs, f"narrow n={n}")
            w = widen(want16[start : start + n], FLOAT16)
            assert_same_bits(
                w,
                want16[start : start + n].view(np.float16).astype(np.float32).view(np.uint32),
                want16[start : start + n],
                f"widen n={n}",
            )


# ---- bfloat16 ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16():
    return pytest.importorskip("ml_dtypes").bfloat16


def test_bfloat16_to_float32_every_bit_pattern(bf16):
    h = all_patterns()
    want = h.view(bf16).astype(np.float32).view(np.uint32)
    assert_same_bits(widen(h, BFLOAT16), want, h, "bfloat16 -> float32")


def bfloat16_boundaries():
    """Every finite bfloat16 value and every midpoint between neighbours, in float32 bits."""
    h = np.arange(0x7F80, dtype=np.uint32)  # 0 .. largest finite
    return np.concatenate([h << 16, (h << 16) + 0x8000]).view(np.float32)


@pytest.mark.parametrize("kind", ["boundaries", "special", "random"])
def test_float32_to_bfloat16(bf16, kind):
    x = {
        "boundaries": lambda: plus_minus_ulp(bfloat16_boundaries()),
        "special": special_float32,
        "random": random_float32,
    }[kind]()
    with np.errstate(all="ignore"):
        want = x.astype(bf16).view(np.uint16)
    assert_same_bits(narrow(x, BFLOAT16), want, x, f"float32 -> bfloat16 ({kind})")


def test_bfloat16_matches_torch_except_nan_payloads():
    # A second, independent reference. torch's NaN bits differ from ml_dtypes' (both are NaN).
    torch = pytest.importorskip("torch")
    x = np.concatenate([plus_minus_ulp(bfloat16_boundaries()), special_float32(), random_float32()])
    x = x[~np.isnan(x)]
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert_same_bits(narrow(x, BFLOAT16), want, x, "float32 -> bfloat16 vs torch")
    h = all_patterns()
    got = widen(h, BFLOAT16).view(np.float32)  # NaN patterns compare as NaN here
    want32 = torch.from_numpy(h.view(np.int16)).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(got, want32)


def test_rejects_other_dtypes():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="float16"):
        _C._half_convert(x.ctypes.data, x.ctypes.data, 4, 0, True)
