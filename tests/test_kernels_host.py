"""Host build of the kernels' __host__ __device__ arithmetic (rns_arith.cuh) against the numpy reference, bit for bit."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from rnstensor import arith
from rnstensor.basis import Basis, int8_pool
from rnstensor.kernels import build, tables

POOL = int8_pool()
SMALL = (2, 3, 4, 5, 7, 11, 13)

i8p = np.ctypeslib.ndpointer(np.int8, flags="C")
i32p = np.ctypeslib.ndpointer(np.int32, flags="C")
i64p = np.ctypeslib.ndpointer(np.int64, flags="C")
u64p = np.ctypeslib.ndpointer(np.uint64, flags="C")
f32p = np.ctypeslib.ndpointer(np.float32, flags="C")
f64p = np.ctypeslib.ndpointer(np.float64, flags="C")
I64, F32, F64, INT = ctypes.c_int64, ctypes.c_float, ctypes.c_double, ctypes.c_int


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    try:
        path = build.host_library(cache=tmp_path_factory.mktemp("host-lib"))
    except build.KernelBuildError as exc:  # pragma: no cover - CI images have g++
        pytest.skip(f"no host C++ compiler for the kernel arithmetic: {exc}")
    L = ctypes.CDLL(str(path))
    L.h_reduce_f32.argtypes = [f32p, I64, F32, F32, F32, f32p]
    L.h_reduce_i32.argtypes = [i32p, I64, F32, F32, F32, F32, i8p]
    L.h_reduce_small_i8.argtypes = [i32p, I64, F32, F32, F32, i8p]
    L.h_reduce_acc.argtypes = [i32p, I64, INT, F32, F32, F32, F32, i8p]
    L.h_encode.argtypes = [u64p, I64, i64p, I64, INT, f32p, f32p, f32p, f32p, f32p, INT, i32p, i32p, i8p]
    L.h_drop_extend.argtypes = [i8p, I64, i32p, f32p, i8p]
    L.h_drop_extend.restype = INT
    L.h_decode_fp64.argtypes = [i8p, I64, i32p, f32p, f64p, F64, F64, i64p, I64, I64, f64p]
    L.h_decode_fp64.restype = INT
    L.h_decode_exact.argtypes = [i8p, I64, i32p, f32p, f64p, np.ctypeslib.ndpointer(np.uint32, flags="C"), INT, INT,
                                 i64p, I64, I64, f64p]
    L.h_decode_exact.restype = INT
    L.h_ldexp.argtypes = [F64, I64]
    L.h_ldexp.restype = F64
    return L


def _consts(p):
    P, IP, H, C16 = tables.reduce_consts((p,))
    return float(P[0]), float(IP[0]), float(H[0]), float(C16[0])


def _ref(x, p):
    return arith.centered_mod(x, p).astype(np.int8)


# ----- modular reduction: exhaustive over the documented ranges -----------------------------------


def _check_f32(lib, p, t):
    P, IP, H, _ = _consts(p)
    out = np.empty(t.size, np.float32)
    lib.h_reduce_f32(t.astype(np.float32), t.size, P, IP, H, out)
    ref = arith.centered_mod(t, p)
    bad = np.flatnonzero(out != ref)
    assert bad.size == 0, f"p={p}: t={t[bad[0]]} gives {out[bad[0]]}, want {ref[bad[0]]}"
    assert not np.signbit(out[t == 0]).any()


def test_reduce_f32_whole_range(lib):
    # every integer t with |t| + p < 2**22 (the whole exactness range) for the moduli at both ends of the pool
    for p in (256, 255, 253, 3, 2) + POOL[-2:]:
        lim = (1 << 22) - p
        _check_f32(lib, p, np.arange(-lim + 1, lim, dtype=np.int64))


def test_reduce_f32_every_modulus(lib):
    # every pool modulus: |t| < 2**19 (beyond any residue sum of the per-entry kernels) and both range ends
    for p in POOL + SMALL:
        lim = (1 << 22) - p
        t = np.concatenate([np.arange(-(1 << 19), 1 << 19), np.arange(-lim + 1, -lim + (1 << 15)), np.arange(lim - (1 << 15), lim)])
        _check_f32(lib, p, t.astype(np.int64))


def test_reduce_small_i8_whole_range(lib):
    # the chain kernel's epilogue from an int32's bits: every |a| < 2**22 - 1, both ends of the pool, even moduli
    a = np.arange(-(1 << 22) + 2, (1 << 22) - 1, dtype=np.int64)
    out = np.empty(a.size, np.int8)
    for p in (256, 255, 253, 254, 6, 3, 2) + POOL[-2:]:
        P, IP, H, _ = _consts(p)
        lib.h_reduce_small_i8(np.ascontiguousarray(a, np.int32), a.size, P, IP, H, out)
        ref = _ref(a, p)
        bad = np.flatnonzero(out != ref)
        assert bad.size == 0, f"p={p}: a={a[bad[0]]} gives {out[bad[0]]}, want {ref[bad[0]]}"


def test_reduce_i32_every_modulus(lib):
    # exhaustive on |a| < 2**19 and on both ends of the int32 range, a strided sweep in between
    lo = np.arange(-(1 << 19), 1 << 19, dtype=np.int64)
    ends = np.concatenate([np.arange(-(1 << 31), -(1 << 31) + (1 << 16)), np.arange((1 << 31) - (1 << 16), 1 << 31)])
    sweep = np.arange(-(1 << 31), 1 << 31, 8191, dtype=np.int64)
    a = np.concatenate([lo, ends, sweep]).astype(np.int32)
    a64 = a.astype(np.int64)
    out = np.empty(a.size, np.int8)
    for p in POOL + SMALL:
        P, IP, H, C16 = _consts(p)
        lib.h_reduce_i32(a, a.size, P, IP, H, C16, out)
        ref = _ref(a64, p)
        bad = np.flatnonzero(out != ref)
        assert bad.size == 0, f"p={p}: a={a[bad[0]]} gives {out[bad[0]]}, want {ref[bad[0]]}"


def test_reduce_acc_small_path_covers_255_terms(lib):
    # the epilogue's one-reduction path (n_in <= 255): every |a| <= 255 * 2**14
    lim = 255 * (1 << 14)
    a = np.arange(-lim, lim + 1, dtype=np.int32)
    out = np.empty(a.size, np.int8)
    for p in (256, 255, 253, 251, 199, 3, 2):
        P, IP, H, C16 = _consts(p)
        lib.h_reduce_acc(a, a.size, 1, P, IP, H, C16, out)
        assert np.array_equal(out, _ref(a, p)), p


# ----- encode ---------------------------------------------------------------------------------


def _encode_inputs(rng, n):
    x = rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))
    x[: n // 8] = np.round(x[: n // 8] * 4) / 4 + 0.5  # ties at many scales
    specials = np.array([0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
                         1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 3.5, 2.0**53, 2.0**53 + 2, -(2.0**60), 2.0**-1074 * 3])
    x[: specials.size] = specials
    return x


@pytest.mark.parametrize("moduli", [POOL[:24], POOL[24:], SMALL, (256,), (255, 256, 7)])
def test_encode_entry(lib, moduli):
    rng = np.random.default_rng(len(moduli) * 7 + moduli[0])
    n = 6000
    x = _encode_inputs(rng, n)
    # per-entry exponents from deep negative to huge (k > 0 paths, the periodic [2^k]_p beyond the table)
    e = rng.integers(-1200, 1200, n).astype(np.int64)
    e[:200] = rng.integers(-70, 70, 200)
    e[200:260] = 5000
    e[260:300] = -5000
    P, IP, H, CP, pw, pa, per = tables.encode_tables(tuple(moduli))
    out = np.empty((len(moduli), n), np.int8)
    lib.h_encode(x.view(np.uint64), n, e, 1, len(moduli), P, IP, H, CP, np.ascontiguousarray(pw),
                 pw.shape[1], pa, per, out)
    ref = arith.encode_ref(x, e, moduli, 53)
    assert np.array_equal(out, ref)


def test_encode_exponent_runs(lib):
    # an exponent per row of a (rows, 5) tensor: entry i uses ev[i // 5]
    moduli = POOL[:15]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 5))
    ev = rng.integers(-10, 60, 40).astype(np.int64)
    P, IP, H, CP, pw, pa, per = tables.encode_tables(moduli)
    out = np.empty((15, x.size), np.int8)
    lib.h_encode(x.reshape(-1).view(np.uint64), x.size, ev, 5, 15, P, IP, H, CP, np.ascontiguousarray(pw),
                 pw.shape[1], pa, per, out)
    assert np.array_equal(out.reshape(15, 40, 5), arith.encode_ref(x, ev[:, None], moduli, 53))


# ----- drop and base extension -----------------------------------------------------------------


def _random_planes(rng, active, n, edges=True):
    X = np.stack([rng.integers(-(p // 2), (p + 1) // 2, n) for p in active]).astype(np.int8)
    if edges:
        for i, p in enumerate(active):
            X[i, 0] = -(p // 2)
            X[i, 1] = (p + 1) // 2 - 1
            X[i, 2] = 0
        # the integers +-1 and the range ends +-(P-1)/2 (all planes consistent)
        for j, v in enumerate((1, -1, (math.prod(active) - 1) // 2, -(math.prod(active) // 2))):
            for i, p in enumerate(active):
                X[i, 3 + j] = arith.centered_mod(np.array(v % p), p)
    return X


CASES = [
    (POOL[:15], 1, True),
    (POOL[:15], 3, True),
    (POOL[:15], 3, False),
    (POOL[:15], (256, 253), True),  # the even modulus dropped first
    (POOL[:15], (229, 241, 256), True),  # an explicit drop order
    (POOL[:15], 0, True),
    (POOL[:49], 5, True),
    (POOL[:49], 0, False),
    ((7, 5, 3, 2), 1, True),
    ((255, 256, 7, 11), 2, False),
]


@pytest.mark.parametrize("basis, drops, extend", CASES)
def test_drop_extend_entry(lib, basis, drops, extend):
    basis = Basis(basis)
    rng = np.random.default_rng(len(basis) * 31 + (drops if isinstance(drops, int) else len(drops)))
    # a shuffled active order exercises the permutations
    active = tuple(rng.permutation(basis.moduli).tolist())
    n = 3000
    X = _random_planes(rng, active, n)
    ib, fb, out_active, nd, nr = tables.drop_tables(active, basis.moduli, drops, extend)
    assert ib.size <= tables.DROP_IB_MAX and fb.size <= tables.DROP_FB_MAX
    out = np.empty((len(out_active), n), np.int8)
    assert lib.h_drop_extend(X, n, ib, fb, out) == 0
    ref, ref_active = arith.drop_extend_ref(X, active, basis, drops, extend)
    assert tuple(out_active) == tuple(ref_active)
    assert np.array_equal(out, ref)


def test_drop_tables_fit_the_constant_bank():
    pool = POOL
    for drops in (1, 24, len(pool) - 1):  # few, half, all but one: the largest coefficient tables
        ib, fb, *_ = tables.drop_tables(pool, pool, drops, True)
        assert ib.size <= tables.DROP_IB_MAX and fb.size <= tables.DROP_FB_MAX, drops
    with pytest.raises(ValueError, match="cannot drop modulus 3"):
        tables.drop_tables(pool[:5], pool[:5], (3,), True)


# ----- decode (fp64) -----------------------------------------------------------------------------


def _same_bits(a, b):
    ua, ub = a.view(np.uint64), b.view(np.uint64)
    bad = np.flatnonzero(ua != ub)
    assert bad.size == 0, f"entry {bad[0]}: {a[bad[0]]!r} != {b[bad[0]]!r}"


@pytest.mark.parametrize("active", [POOL[:15], POOL[3:10], POOL[:49], (7, 5, 3, 2), (255, 256, 7)])
@pytest.mark.parametrize("factor", [1, -1, 253 * 251, (1 << 80) + 12345])
def test_decode_fp64_entry(lib, active, factor):
    rng = np.random.default_rng(len(active) + factor % 1000)
    n = 2000
    X = _random_planes(rng, active, n)
    ev = rng.integers(-200, 200, n).astype(np.int64)
    ev[:50] = rng.integers(-1500, -900, 50)  # subnormal and vanishing results
    ev[50:100] = rng.integers(900, 1300, 50)  # overflow
    ev[100:110] = -(1 << 40)
    ib, fb, qd = tables.decode_tables(tuple(active))
    f, g, k = arith.float_factor(factor)
    out = np.empty(n, np.float64)
    assert lib.h_decode_fp64(X, n, ib, fb, qd, f, g, ev, 1, k, out) == 0
    with np.errstate(over="ignore"):
        ref = arith.decode_fp64_ref(X, active, ev, factor)
    _same_bits(out, ref)


@pytest.mark.parametrize("active", [POOL[:15], POOL[3:10], POOL[:49], (7, 5, 3, 2), (255, 256, 7), (3,)])
@pytest.mark.parametrize("factor", [1, -1, 2, 253 * 251 * 4, -((1 << 80) + 12345), 3**200])
def test_decode_exact_entry(lib, active, factor):
    rng = np.random.default_rng(len(active) * 7 + factor % 997)
    n = 600
    X = _random_planes(rng, active, n)
    ev = rng.integers(-200, 200, n).astype(np.int64)
    ev[:60] = rng.integers(-1500, -900, 60) - math.prod(active).bit_length()  # subnormal, ties at the bottom, zeros
    ev[60:100] = rng.integers(900, 1300, 40)  # overflow
    ev[100:105] = -(1 << 41)
    ev[105:110] = 1 << 41
    ib, fb, qd = tables.decode_tables(tuple(active))
    F, t2, neg = tables.factor_limbs(factor)
    assert tables.exact_decode_fits(active, factor)
    out = np.empty(n, np.float64)
    assert lib.h_decode_exact(X, n, ib, fb, qd, F, F.size, int(neg), ev, 1, t2, out) == 0
    _same_bits(out, arith.decode_exact_ref(X, active, ev, factor))


def test_decode_exact_rounding_cases(lib):
    # integers just around half-way points of the float64 grid, normal and subnormal
    active = POOL[:15]
    vals = []
    for top in (54, 60, 80, 110):
        base = 1 << (top - 1)
        ulp = 1 << (top - 53)
        for k in (0, 1, 2, 3):
            for delta in (-1, 0, 1):
                vals += [base + k * ulp + ulp // 2 + delta, -(base + k * ulp + ulp // 2 + delta)]
    P = math.prod(active)
    X = np.stack([np.array([arith.centered_mod(np.array(v % p), p) for v in vals]) for p in active]).astype(np.int8)
    for e in (0, -1074 - 60, -1100, 900):
        ev = np.full(len(vals), e, np.int64)
        ib, fb, qd = tables.decode_tables(active)
        F, t2, neg = tables.factor_limbs(1)
        out = np.empty(len(vals), np.float64)
        assert lib.h_decode_exact(X, len(vals), ib, fb, qd, F, F.size, 0, ev, 1, t2, out) == 0
        _same_bits(out, arith.decode_exact_ref(X, active, ev, 1))
    assert all(abs(v) < P // 2 for v in vals)


def test_ldexp_rounds_once(lib):
    rng = np.random.default_rng(11)
    y = rng.standard_normal(20000) * np.exp2(rng.integers(-1074, 1023, 20000))
    y[:4] = [5e-324, -5e-324, 1.7976931348623157e308, 0.75]
    e = rng.integers(-2300, 2300, y.size)
    got = np.array([lib.h_ldexp(float(a), int(b)) for a, b in zip(y, e)])
    with np.errstate(over="ignore"):
        ref = np.ldexp(y, e.astype(np.int32))
    _same_bits(got, ref)


def test_byte_words_packs_int8_rows_little_endian():
    rows = [[-128, 127, 1, -1, 5], [], [3]]
    w = tables.byte_words(rows, 2)
    assert w.dtype == np.int32 and w.shape == (3, 2)
    for row, words in zip(rows, w):
        got = [(int(words[k // 4]) >> (8 * (k % 4)) & 0xFF) for k in range(8)]
        want = [v & 0xFF for v in row] + [0] * (8 - len(row))
        assert got == want


def test_probe_compiles_a_cubin_for_every_arch():
    from rnstensor.kernels import build

    for arch in build.ARCHS:
        assert build.probe(arch) > 0
    with pytest.raises(ValueError):
        build.probe("sm80")
