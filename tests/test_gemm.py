"""dgemm / zgemm / matmul against an exact oracle (Python ints, one correct rounding), BLAS semantics, invariances."""

from __future__ import annotations

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rnstensor as rt
from rnstensor import gemm as G
from rnstensor import gemm_accuracy as GA
from rnstensor.errors import RNSRangeError
from rnstensor.run.policy import default_target

# ----- the exact oracle: every float is m * 2**e, so a GEMM is integer arithmetic and one rounding ------

_SHIFT = 1074  # every float64 is an integer multiple of 2**-1074


def _xint(x: float) -> int:
    """``x * 2**1074`` as an exact Python int."""
    if x == 0:
        return 0
    m, e = math.frexp(x)
    n = int(m * (1 << 53))  # exact: 53-bit significand
    sh = e - 53 + _SHIFT
    return n << sh if sh >= 0 else n >> -sh  # exact: x is a multiple of 2**-1074


def _round(n: int, e: int) -> float:
    """``n * 2**e`` rounded once to the nearest float64 (ties to even), subnormals and overflow included."""
    if n == 0:
        return 0.0
    sign = -1.0 if n < 0 else 1.0
    n = abs(n)
    lead = n.bit_length() - 1 + e  # 2**lead <= value < 2**(lead + 1)
    q = max(lead - 52, -1074)  # the quantum of the result's binade
    sh = q - e
    if sh <= 0:
        mant = n << -sh
    else:
        mant = n >> sh
        rem = n - (mant << sh)
        half = 1 << (sh - 1)
        if rem > half or (rem == half and mant & 1):
            mant += 1
    if mant.bit_length() + q > 1024:
        return sign * math.inf
    return sign * math.ldexp(float(mant), q)


def _ints(M: np.ndarray) -> list[list[int]]:
    return [[_xint(float(v)) for v in row] for row in np.asarray(M)]


def ref_dgemm(A: np.ndarray, B: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """The correctly rounded ``alpha * A @ B`` (exact integer sums, one rounding)."""
    Ai, Bt, al = _ints(A), _ints(np.asarray(B).T), _xint(alpha)
    out = np.empty((len(Ai), len(Bt)))
    for i, ra in enumerate(Ai):
        for j, cb in enumerate(Bt):
            out[i, j] = _round(al * sum(x * y for x, y in zip(ra, cb)), -3 * _SHIFT)
    return out


def ref_zgemm_scaled(A: np.ndarray, B: np.ndarray, alpha: complex) -> np.ndarray:
    """``alpha * A @ B`` for a real or purely imaginary ``alpha``: each part of the exact product scaled, rounded once."""
    Ar, Ai = _ints(A.real), _ints(A.imag)
    Br, Bi = _ints(B.real.T), _ints(B.imag.T)
    ar, ai = _xint(complex(alpha).real), _xint(complex(alpha).imag)
    assert ar == 0 or ai == 0
    out = np.empty((A.shape[0], B.shape[1]), np.complex128)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            re = sum(x * y for x, y in zip(Ar[i], Br[j])) - sum(x * y for x, y in zip(Ai[i], Bi[j]))
            im = sum(x * y for x, y in zip(Ar[i], Bi[j])) + sum(x * y for x, y in zip(Ai[i], Br[j]))
            out[i, j] = complex(_round(ar * re - ai * im, -3 * _SHIFT), _round(ar * im + ai * re, -3 * _SHIFT))
    return out


def ref_zgemm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Real and imaginary parts of ``A @ B``, each correctly rounded."""
    Ar, Ai = _ints(A.real), _ints(A.imag)
    Br, Bi = _ints(B.real.T), _ints(B.imag.T)
    out = np.empty((A.shape[0], B.shape[1]), np.complex128)
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            re = sum(x * y for x, y in zip(Ar[i], Br[j])) - sum(x * y for x, y in zip(Ai[i], Bi[j]))
            im = sum(x * y for x, y in zip(Ar[i], Bi[j])) + sum(x * y for x, y in zip(Ai[i], Br[j]))
            out[i, j] = complex(_round(re, -2 * _SHIFT), _round(im, -2 * _SHIFT))
    return out


def test_oracle_rounding():
    assert _round(1, -1075) == 0.0 and _round(3, -1075) == 2.0**-1073  # ties to even at the bottom
    assert _round(3, -1076) == 2.0**-1074
    assert _round((1 << 53) + 1, 0) == 2.0**53 and _round((1 << 53) + 3, 0) == 2.0**53 + 4
    assert _round(-5, -2) == -1.25 and _round(1, 1024) == math.inf
    for x in (0.1, -3e300, 5e-324, 2.5e-310, 1.0):
        assert _round(_xint(x), -_SHIFT) == x


# ----- data ---------------------------------------------------------------------------------------


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def unif(shape, seed=0) -> np.ndarray:
    """U[-1, 1): multiples of 2**-52, encoded exactly at t >= 52 (the default width for k <= 2**16)."""
    return rng(seed).uniform(-1.0, 1.0, shape)


def phi(shape, p=2.0, seed=0) -> np.ndarray:
    """``(U(0,1) - 1/2) exp(p N(0,1))``: wide exponent ranges ([2610.26945] Sec. 7)."""
    r = rng(seed)
    return (r.uniform(0, 1, shape) - 0.5) * np.exp(p * r.standard_normal(shape))


def ints_scaled(shape, seed=0, bits=20, spread=30) -> np.ndarray:
    """Small integers times per-entry powers of two within ``spread`` binades: exact at the default width."""
    r = rng(seed)
    v = r.integers(-(1 << bits), 1 << bits, shape).astype(np.float64)
    return np.ldexp(v, r.integers(-spread // 2, spread // 2, shape))


FLAGS = ["N", "T", "C"]


def _op(x, f):
    return x if f == "N" else (x.T.conj() if f == "C" else x.T)


def _bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


def assert_bitwise(x, y):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype
    if x.dtype.kind == "c":
        assert_bitwise(x.real.copy(), y.real.copy())
        assert_bitwise(x.imag.copy(), y.imag.copy())
        return
    nan = np.isnan(x)
    assert np.array_equal(nan, np.isnan(y))
    assert np.array_equal(_bits(np.where(nan, 0.0, x)), _bits(np.where(nan, 0.0, y)))


# ----- width rule ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,c", [("real", 2), ("complex", 12)])
@pytest.mark.parametrize("k", [1, 7, 1024, 4096, 65536, 10**6])
def test_width_rule_is_tight(kind, c, k):
    for s in (4, 8, 15, 16, 24, 49):
        t = G.gemm_width(s, k, kind)
        P = rt.Basis.int8(s).product
        if t >= 1:
            assert c * k * 4**t < P <= c * k * 4 ** (t + 1)


def test_moduli_for_bits():
    assert rt.moduli_for_bits(4096) == 16 and rt.moduli_for_bits(256) == 15
    for k in (1, 100, 4096, 1 << 16):
        for bits in (20, 53, 80):
            s = rt.moduli_for_bits(k, bits)
            assert G.gemm_width(s, k) >= bits and (s == 2 or G.gemm_width(s - 1, k) < bits)
    assert rt.moduli_for_bits(4096, 53, kind="complex") == 16
    with pytest.raises(RNSRangeError):
        rt.moduli_for_bits(4096, 200)


def test_exact_bits_needed():
    assert G.exact_bits_needed(np.array([[1.0, 0.5], [3.0, 2.0**-30]]), (1,)) == 32
    assert G.exact_bits_needed(np.zeros((2, 2)), (1,)) == 1
    assert G.exact_bits_needed(unif((5, 50)), (1,)) <= 53


# ----- correctness against the exact oracle -----------------------------------------------------------


@pytest.mark.parametrize("ta", FLAGS)
@pytest.mark.parametrize("tb", FLAGS)
def test_dgemm_trans_correctly_rounded(ta, tb):
    m, k, n = 5, 33, 4
    A = ints_scaled((m, k), 1)
    B = ints_scaled((k, n), 2)
    a = A if ta == "N" else np.ascontiguousarray(A.T)
    b = B if tb == "N" else np.ascontiguousarray(B.T)
    got = rt.dgemm(a, b, trans_a=ta, trans_b=tb)
    assert_bitwise(got, ref_dgemm(A, B))


@pytest.mark.parametrize("k", [1100, 2600])
def test_dgemm_k_above_chunk_limit(k):
    # the CPU backend splits k into exact float32 BLAS chunks of 1024, summed exactly
    A, B = unif((4, k), 3), unif((k, 3), 4)
    assert_bitwise(rt.dgemm(A, B), ref_dgemm(A, B))
    assert_bitwise(rt.dgemm(A, B, moduli="auto"), ref_dgemm(A, B))


def test_uniform_k4096_correctly_rounded_float64_level():
    # [2610.26945] Table 6: U[-1,1), k = 4096, s = 16 (the default) -> 100% correctly rounded
    A, B = unif((6, 4096), 5), unif((4096, 5), 6)
    got, ref = rt.dgemm(A, B), ref_dgemm(A, B)
    assert_bitwise(got, ref)
    assert np.linalg.norm(got - ref) <= 1e-16 * np.linalg.norm(ref)
    assert np.linalg.norm(A @ B - ref) > 0  # numpy float64 is not


def test_huge_and_tiny_exponents():
    m, k, n = 4, 40, 3
    A, B = ints_scaled((m, k), 7), ints_scaled((k, n), 8)
    A[0] *= 2.0**900
    A[1] *= 2.0**-900
    B[:, 0] *= 2.0**-900
    B[:, 2] *= 2.0**-100
    got = rt.dgemm(A, B)
    assert_bitwise(got, ref_dgemm(A, B))
    assert got[0, 0] != 0 and np.isfinite(got).all()


def test_subnormal_and_overflowing_results():
    A, B = unif((3, 50), 9), unif((50, 4), 10)
    As = A * 2.0**-540
    Bs = B * 2.0**-540  # products near 2**-1080: subnormal results, rounded once
    got = rt.dgemm(As, Bs)
    assert_bitwise(got, ref_dgemm(As, Bs))
    assert (np.abs(got[got != 0]) < 2.0**-1022).all()
    Ab = A * 2.0**600
    Bb = B * 2.0**430  # results near 2**1030: +-inf where the correctly rounded value overflows
    got = rt.dgemm(Ab, Bb)
    assert_bitwise(got, ref_dgemm(Ab, Bb))
    assert np.isinf(got).any()


@pytest.mark.parametrize("s", [8, 16, 20])
def test_crt_boundary_exact(s):
    # [2610.26945] Sec. 8.3: all entries 1 - 2**-53 push |c| to the top of the range; operators above
    # 2**16 entries take mode_product's a-priori n_in * bound path, which the width rule must satisfy
    m, k, n = 70, 1000, 2
    x = 1.0 - 2.0**-53
    A, B = np.full((m, k), x), np.full((k, n), -x)
    want = ref_dgemm(A[:1], B[:, :1])[0, 0]
    got = rt.dgemm(A, B, moduli=s, min_bits=0)
    if s >= 16:
        assert (got == want).all()
    assert np.abs(got - want).max() <= 2.0 ** -(G.gemm_width(s, k) - 2) * k
    Z = rt.zgemm(A * (1 + 1j), B * (1 + 1j), moduli=s, min_bits=0)  # Ar + Ai and Br + Bi at 2**(t+1): P2 at its bound
    zwant = ref_zgemm(A[:1] * (1 + 1j), B[:, :1] * (1 + 1j))[0, 0]
    if s >= 16:
        assert (Z == zwant).all()


def test_wide_range_default_within_error_bound():
    # phi = 2 data at the default width is not exact; [2610.26945] Eq. 7 bounds the error
    k = 300
    A, B = phi((6, k), 2.0, 11), phi((k, 5), 2.0, 12)
    got, ref = rt.dgemm(A, B, moduli="fast"), ref_dgemm(A, B)
    t = G.gemm_width(rt.moduli_for_bits(k), k)
    D = t - np.frexp(np.abs(A).max(axis=1))[1]
    E = t - np.frexp(np.abs(B).max(axis=0))[1]
    bound = (
        0.5 * np.ldexp(np.abs(B).sum(axis=0)[None, :], -D[:, None])
        + 0.5 * np.ldexp(np.abs(A).sum(axis=1)[:, None], -E[None, :])
        + 0.25 * k * np.ldexp(1.0, -(D[:, None] + E[None, :]))
        + 2.0**-53 * np.abs(ref)
    )
    assert (np.abs(got - ref) <= bound * (1 + 1e-12)).all()


def test_auto_moduli_is_correctly_rounded_on_wide_data():
    k = 200
    A, B = phi((5, k), 2.0, 13), phi((k, 4), 2.0, 14)
    need = max(G.exact_bits_needed(A, (1,)), G.exact_bits_needed(B, (0,)))
    assert need > 53 and G.gemm_width(G._resolve_moduli("auto", A, B, k, False), k) >= need
    assert_bitwise(rt.dgemm(A, B, moduli="auto"), ref_dgemm(A, B))


@settings(max_examples=20)
@given(
    st.integers(1, 4),
    st.integers(1, 40),
    st.integers(1, 4),
    st.integers(-1000, 1000),
    st.integers(0, 2**32 - 1),
)
def test_property_auto_exact(m, k, n, shift, seed):
    r = rng(seed)
    A = np.ldexp(r.standard_normal((m, k)), r.integers(-30, 30, (m, k)))
    B = np.ldexp(r.standard_normal((k, n)), r.integers(-30, 30, (k, n)) + shift // 2)
    A[r.random((m, k)) < 0.2] = 0.0
    assert_bitwise(rt.dgemm(A, B, moduli="auto"), ref_dgemm(A, B))


# ----- the default keeps the classical componentwise bound (never less accurate than float64 DGEMM) -------

_U = Fraction(1, 2**53)


def _gamma(n: int) -> Fraction:
    return n * _U / (1 - n * _U)


def _wide(r, shape, spread: int, zeros: float, cplx: bool) -> np.ndarray:
    """Random significands at exponents spread over ``spread`` binades (the whole float64 range at 2100)."""
    def part():
        e = np.clip(r.integers(-spread // 2, spread // 2 + 1, shape), -1073, 1020)
        x = np.ldexp(r.uniform(0.5, 1, shape) * r.choice([-1, 1], shape), e)
        x[r.random(shape) < zeros] = 0.0
        return x
    return part() + 1j * part() if cplx else part()


def _scale2(x, e: int):
    """``x * 2**e`` in two exact steps (each factor finite; complex too)."""
    return x * 2.0 ** (e // 2) * 2.0 ** (e - e // 2)


def _parts(z) -> tuple[Fraction, Fraction]:
    z = complex(z)
    return Fraction(z.real), Fraction(z.imag)


def _abs_up(z) -> Fraction:
    """An upper bound of ``|z|`` (exact for real ``z``; the float64 hypot raised by two ulps otherwise)."""
    z = complex(z)
    if z.imag == 0:
        return Fraction(abs(z.real))
    return Fraction(float(np.nextafter(np.nextafter(math.hypot(z.real, z.imag), np.inf), np.inf)))


def _classical_violations(got, A, B, alpha, cplx: bool) -> list:
    """Entries where ``|got - alpha A B|`` exceeds the classical bound (exact rationals).

    Real: ``gamma_k |alpha| (|A||B|)_ij``; complex: ``sqrt(2) gamma_{k+2}``
    times the same; both plus ``k + 2`` underflows of ``2**-1074`` per part
    (the classical bound's eta terms).
    """
    k = A.shape[1]
    al = _parts(alpha)
    eta = (k + 2) * Fraction(1, 2**1074)
    bad = []
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            re = im = Fraction(0)
            absum = Fraction(0)
            for p in range(k):
                (ar, ai), (br, bi) = _parts(A[i, p]), _parts(B[p, j])
                re += ar * br - ai * bi
                im += ar * bi + ai * br
                absum += _abs_up(A[i, p]) * _abs_up(B[p, j])
            re, im = al[0] * re - al[1] * im, al[0] * im + al[1] * re
            absum *= _abs_up(alpha)
            g = complex(got[i, j])
            if not (math.isfinite(g.real) and math.isfinite(g.imag)):
                bad.append((i, j, "not finite"))
                continue
            er, ei = Fraction(g.real) - re, Fraction(g.imag) - im
            if cplx:  # |err| <= sqrt(2) (gamma_{k+2} absum + eta), squared
                ok = er * er + ei * ei <= 2 * (_gamma(k + 2) * absum + eta) ** 2
            else:
                ok = abs(er) <= _gamma(k) * absum + eta
            if not ok:
                bad.append((i, j, g, float(re), float(absum)))
    return bad


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4), st.integers(1, 12), st.integers(1, 3),
    st.sampled_from([0, 8, 40, 120, 400, 2100]), st.sampled_from([0.0, 0.3]),
    st.sampled_from([1.0, -0.75, 3 * 2.0**-40]), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1),
)
def test_property_default_keeps_the_classical_bound(m, k, n, spread, zeros, alpha, cplx, paired, seed):
    """Wide-exponent, cancelling, paired and exactly representable products: |C~ - C| <= gamma_k |alpha| |A||B|."""
    r = rng(seed)
    A, B = _wide(r, (m, k), spread, zeros, cplx), _wide(r, (k, n), spread, zeros, cplx)
    if paired:  # B undoes row 0's magnitudes: its small entries meet B's large ones, every term matters
        e = np.frexp(np.abs(A[0]))[1]
        B = _wide(r, (k, n), 4, zeros, cplx) * (2.0 ** np.clip(-e, -1000, 1000))[:, None]
    # keep the exact product inside the float64 range (the classical bound assumes no overflow)
    A = _scale2(A, -int(np.frexp(np.abs(A).max() or 1.0)[1]) - 1)
    B = _scale2(B, -int(np.frexp(np.abs(B).max() or 1.0)[1]) + 1)
    if k > 1 and r.random() < 0.5:  # cancellation: the last column of B undoes the first terms
        with np.errstate(all="ignore"):
            undo = -B[0, -1] * A[0, 0] / A[0, -1] if A[0, -1] != 0 else B[-1, -1]
        B[-1, -1] = undo if np.isfinite(undo) and abs(undo) < 2.0 else B[-1, -1]
    f = rt.zgemm if cplx else rt.dgemm
    got = f(A, B, alpha=complex(alpha) if cplx else alpha)
    assert _classical_violations(got, A, B, alpha, cplx) == []


@pytest.mark.parametrize("cplx", [False, True])
def test_default_on_the_issue_cases(cplx):
    one = np.array([[1.0, 1e-10]]), np.array([[1e-10], [1.0]])
    assert rt.dgemm(*one)[0, 0] == 2e-10  # correctly rounded here; the 53-bit width was 8e-8 off
    assert rt.dgemm(*one, moduli="fast")[0, 0] != 2e-10
    wide = np.array([[1e300, 1e-300]]), np.array([[1e-300], [1e300]])
    assert rt.dgemm(*wide)[0, 0] == 2.0  # split into exact slices: 49 moduli cannot span 2000 binades
    A = np.array([[1e300 + 1e-300j, 1e-300, 3.0]])
    B = np.array([[1e-300], [1e300j], [2j]])
    got = rt.zgemm(A, B)
    assert _classical_violations(got, A, B, 1.0, True) == []
    A = np.array([[1.0, 2.0**-53, 2.0**-300]])
    assert _classical_violations(rt.dgemm(A, np.ones((3, 1))), A, np.ones((3, 1)), 1.0, False) == []


def test_default_moduli_follow_the_data():
    k = 256
    s0 = rt.moduli_for_bits(k)
    U = unif((8, k), 3)  # random(): exact at 53 bits whatever the spread
    assert rt.gemm_moduli(U, U.T) == s0
    N = rng(4).standard_normal((8, k))
    sa, sb = G.group_stats(N, 1, False), G.group_stats(N.T, 0, False)
    ga, gb = G._groups(sa[0], sa[1], sa[3], None, np), G._groups(sb[0], sb[1], sb[3], None, np)
    t0 = G.gemm_width(s0, k)
    budget = G.encoding_budget(k, False, default_target(k))  # the default's (1 + 2**-5) u, tighter than gamma_k
    assert budget < G.encoding_budget(k, False)
    # the spreads alone ask for more than the 53-bit width; the measured magnitudes do not, for gamma_k
    assert not G.classical_fits(k, G._inexact_rho(ga, t0, False, np), G._inexact_rho(gb, t0, False, np))
    ratio = G.magnitude_ratio(N, sa[1], N.T, sb[1])
    assert G._measured_fits(k, t0, False, ratio)
    # the default's target takes the least count whose width the measured magnitudes certify
    s = rt.gemm_moduli(N, N.T)
    assert s >= s0 and G._measured_fits(k, G.gemm_width(s, k), False, ratio, budget)
    assert s == s0 or not G._measured_fits(k, G.gemm_width(s - 1, k), False, ratio, budget)
    # the ratio is a lower bound, and a close one
    absAB = np.abs(N) @ np.abs(N.T)
    den = np.abs(N).sum(1)[:, None] * 2.0 ** sb[1][None, :] + 2.0 ** sa[1][:, None] * np.abs(N.T).sum(0)[None, :]
    assert 0.999 * (absAB / den).min() < ratio <= (absAB / den).min()
    # phi = 4 rows mix magnitudes: more moduli, the least that fits
    A, B = GA.gemm_dataset("phi4", 8, k, 6, seed=2)
    s = rt.gemm_moduli(A, B)
    ratio = G.magnitude_ratio(A, G.group_stats(A, 1, False)[1], B, G.group_stats(B, 0, False)[1])
    assert s > s0 and G._measured_fits(k, G.gemm_width(s, k), False, ratio, budget)
    assert not G._measured_fits(k, G.gemm_width(s - 1, k), False, ratio, budget)
    assert rt.gemm_moduli(A, B, 9) == 9 and rt.gemm_moduli(A, B, "fast") == s0


def test_exact_data_is_decided_by_its_lowest_bits_before_any_gemm():
    # random() data is exact at 53 bits: the lowest set bits (one pass) settle the 53-bit count, and the float32
    # magnitude GEMM is never asked; data that is not exact asks for it, and gets the count the GEMM decides
    k = 256
    U = unif((8, k), 3)
    sa, sb = G.group_stats(U, 1, False), G.group_stats(U.T, 0, False)
    lsb = lambda: (G.group_lsb(U, 1), G.group_lsb(U.T, 0))  # noqa: E731

    def refuse():
        raise AssertionError("the magnitude GEMM measured where the lowest bits decide")

    assert G.classical_moduli(k, False, sa, sb, lsb_of=lsb, magnitudes_of=refuse) == rt.moduli_for_bits(k)
    N = rng(4).standard_normal((8, k))
    asked = []
    got = G.classical_moduli(k, False, G.group_stats(N, 1, False), G.group_stats(N.T, 0, False),
                             lsb_of=lambda: (G.group_lsb(N, 1), G.group_lsb(N.T, 0)),
                             magnitudes_of=lambda: asked.append(1))  # None: no measurement, the spreads decide
    assert asked == [1] and got > rt.moduli_for_bits(k)  # full significands: the bits do not settle it
    assert rt.gemm_moduli(N, N.T) <= got  # with the GEMM measured: never more


@pytest.mark.parametrize("cplx", [False, True])
def test_split_product_semantics(cplx):
    """Slices: backends bitwise, tiles bitwise, BLAS flags, alpha / beta, inf rows, the slices sum to the rows."""
    r = rng(21)
    A, B = _wide(r, (5, 9), 2100, 0.2, cplx), _wide(r, (9, 4), 2100, 0.2, cplx)
    A = _scale2(A, -int(np.frexp(np.abs(A).max())[1]) - 1)
    B = _scale2(B, -int(np.frexp(np.abs(B).max())[1]) + 1)
    f = rt.zgemm if cplx else rt.dgemm
    with pytest.raises(G.SplitNeeded):
        G.gemm_scale(None, 9, cplx, G.group_stats(A, 1, True), G.group_stats(B, 0, True))
    got = f(A, B)
    assert _classical_violations(got, A, B, 1.0, cplx) == []
    assert_bitwise(got, f(A, B, backend="numpy"))
    assert_bitwise(got, f(A, B, workspace_bytes=1))  # one output entry per tile
    assert_bitwise(f(A.T.copy(), B, trans_a="T"), got)
    C = _wide(r, (5, 4), 10, 0.0, cplx)
    with np.errstate(over="ignore"):
        assert_bitwise(f(A, B, C, alpha=-0.5, beta=2.0), -0.5 * 0 + f(A, B, alpha=-0.5) + 2.0 * C)
    A2 = A.copy()
    A2[1, 3] = np.inf
    got2 = f(A2, B)
    with np.errstate(invalid="ignore", over="ignore"):
        assert_bitwise(got2[1], (A2[1:2] @ B)[0])
    assert_bitwise(np.delete(got2, 1, 0), np.delete(got, 1, 0))
    xs, owner, rank = G.row_slices(A, 60)
    summed = np.zeros_like(A)
    np.add.at(summed, owner, xs)
    assert_bitwise(summed, A + 0.0)  # each entry in exactly one slice (-0.0 in none)
    E = np.frexp(np.maximum(np.abs(xs.real), np.abs(xs.imag)))[1]
    nz = xs != 0
    span = np.where(nz, E, -9999).max(1) - np.where(nz, E, 9999).min(1)
    assert (span <= 60 - 53).all() and (np.diff(owner) >= 0).all()


# ----- BLAS semantics -------------------------------------------------------------------------------------


def test_alpha_beta():
    A, B = unif((4, 30), 15), unif((30, 3), 16)
    C = unif((4, 3), 17)
    Z = ref_dgemm(A, B)
    nanC = np.full((4, 3), np.nan)
    assert_bitwise(rt.dgemm(A, B, nanC, beta=0.0), Z)  # beta = 0 ignores c, NaN included
    assert_bitwise(rt.dgemm(A, B, C, beta=1.0), Z + C)
    for alpha in (-1.0, 0.1, -3.7e-5, 2.0**-20):
        assert_bitwise(rt.dgemm(A, B, alpha=alpha), ref_dgemm(A, B, alpha))  # alpha folded: one rounding
    alpha, beta = 0.3, -1.7
    assert_bitwise(rt.dgemm(A, B, C, alpha=alpha, beta=beta), ref_dgemm(A, B, alpha) + beta * C)
    # alpha = 0: a and b are not referenced (NaN there does not propagate)
    An = A.copy()
    An[0, 0] = np.nan
    assert_bitwise(rt.dgemm(An, B, C, alpha=0.0, beta=2.0), 2.0 * C)
    assert_bitwise(rt.dgemm(An, B, nanC, alpha=0.0, beta=0.0), np.zeros((4, 3)))
    # out, also aliasing c
    C2 = C.copy()
    res = rt.dgemm(A, B, C2, beta=1.0, out=C2)
    assert res is C2
    assert_bitwise(C2, Z + C)


def test_empty_dimensions():
    C = unif((3, 2), 18)
    assert_bitwise(rt.dgemm(np.zeros((3, 0)), np.zeros((0, 2)), C, beta=0.5), 0.5 * C)
    assert_bitwise(rt.dgemm(np.zeros((3, 0)), np.zeros((0, 2))), np.zeros((3, 2)))
    assert rt.dgemm(np.zeros((0, 4)), np.ones((4, 2))).shape == (0, 2)
    assert rt.dgemm(np.ones((3, 4)), np.ones((4, 0))).shape == (3, 0)
    assert rt.zgemm(np.zeros((0, 4), complex), np.ones((4, 2), complex)).shape == (0, 2)
    # k = 0 with a NaN alpha: there is no product term (BLAS)
    assert_bitwise(rt.dgemm(np.zeros((3, 0)), np.zeros((0, 2)), C, alpha=np.nan, beta=1.0), C)


def test_non_contiguous_inputs():
    big_a, big_b = unif((20, 90), 19), unif((70, 30), 20)
    a = big_a[::3, 1::2]  # 7 x 45, strided
    b = big_b[5:50, ::4]  # 45 x 8
    want = rt.dgemm(np.ascontiguousarray(a), np.ascontiguousarray(b))
    assert_bitwise(rt.dgemm(a, b), want)
    assert_bitwise(rt.dgemm(np.asfortranarray(a), b), want)
    assert_bitwise(rt.dgemm(a.T.copy().T, b), want)
    # transposed views with the matching flags
    assert_bitwise(rt.dgemm(np.ascontiguousarray(a.T).T, b), want)
    assert_bitwise(rt.dgemm(a.T, b.T, trans_a="T", trans_b="T"), want)
    assert_bitwise(want, ref_dgemm(a, b))


def test_inf_nan_rows_and_columns():
    A, B = unif((5, 20), 21), unif((20, 4), 22)
    clean = rt.dgemm(A, B)
    An, Bn = A.copy(), B.copy()
    An[1, 3] = np.inf
    An[3, 0] = np.nan
    Bn[7, 2] = -np.inf
    got = rt.dgemm(An, Bn)
    good_r = [0, 2, 4]
    good_c = [0, 1, 3]
    assert_bitwise(got[np.ix_(good_r, good_c)], clean[np.ix_(good_r, good_c)])
    np_ref = An @ Bn  # IEEE propagation in the affected rows / columns, as float64 BLAS
    assert_bitwise(got[[1, 3]], np_ref[[1, 3]])
    assert_bitwise(got[:, 2], np_ref[:, 2])
    assert np.isnan(got[3]).all() and not np.isfinite(got[:, 2]).any()
    # moduli='auto' ignores the non-finite entries when choosing s
    assert_bitwise(rt.dgemm(An, Bn, moduli="auto")[np.ix_(good_r, good_c)], clean[np.ix_(good_r, good_c)])
    with np.errstate(invalid="ignore"):
        Z = rt.zgemm(An + 0j, Bn * 1j)
    assert np.isnan(Z[3]).all()


# ----- invariances and determinism ----------------------------------------------------------------------


@pytest.mark.parametrize("j", [-400, -7, 1, 33, 500])
def test_scale_invariance(j):
    A, B = phi((6, 150), 2.0, 23), phi((150, 5), 2.0, 24)  # not exactly encodable at the default width
    base = rt.dgemm(A, B)
    assert_bitwise(rt.dgemm(np.ldexp(A, j), B), np.ldexp(base, j))
    assert_bitwise(rt.dgemm(A, np.ldexp(B, j)), np.ldexp(base, j))
    ZA = A + 1j * phi(A.shape, 2.0, 25)
    ZB = B - 1j * phi(B.shape, 2.0, 26)
    zb = rt.zgemm(ZA, ZB)
    sz = rt.zgemm(ZA * 2.0**j, ZB)
    assert_bitwise(sz, np.ldexp(zb.real, j) + 1j * np.ldexp(zb.imag, j))


def test_row_and_column_scaling_invariance():
    A, B = phi((5, 80), 1.0, 27), phi((80, 4), 1.0, 28)
    base = rt.dgemm(A, B)
    r = np.array([3, -200, 0, 41, -5])
    c = np.array([-17, 300, 2, 0])
    assert_bitwise(rt.dgemm(np.ldexp(A, r[:, None]), np.ldexp(B, c[None, :])), np.ldexp(base, r[:, None] + c[None, :]))


@pytest.mark.parametrize("cplx", [False, True])
def test_tiling_is_bitwise_identical(cplx):
    m, k, n = 37, 1030, 29
    A, B = phi((m, k), 2.0, 29), phi((k, n), 2.0, 30)
    if cplx:
        A, B = A + 1j * unif((m, k), 31), B - 1j * phi((k, n), 1.0, 32)
    f = rt.zgemm if cplx else rt.dgemm
    whole = f(A, B, workspace_bytes=1 << 40)
    ws = 200_000
    mb, nb = G._tiles(m, n, k, 16, cplx, ws)
    assert mb < m or nb < n  # really tiled
    assert_bitwise(f(A, B, workspace_bytes=ws), whole)
    assert_bitwise(f(A, B, workspace_bytes=1), whole)  # 1 x 1 tiles
    # at a fixed width rows and columns are independent (the default's width depends on all of them)
    fixed = f(A, B, moduli="fast")
    assert_bitwise(f(A[:6], B[:, :5], workspace_bytes=1, moduli="fast"), fixed[:6, :5])


@pytest.mark.parametrize("cplx", [False, True])
def test_tiling_with_op_a_encoded_once_is_bitwise_identical(cplx):
    """op(a) encoded as a whole and sliced per row tile (and op(b) once per column block) = one untiled call."""
    m, k, n = 23, 1030, 41  # n > m: op(a) can be held while C must be tiled
    A, B = phi((m, k), 2.0, 35), phi((k, n), 1.0, 36)
    A[3, :] = -0.0  # a zero row (exponent 0) and signed zeros in the middle of the tiles
    A[5, 7] = -0.0
    B[:, 4] = 0.0
    if cplx:
        A, B = A - 1j * phi((m, k), 1.0, 37), B + 1j * unif((k, n), 38)
    f = rt.zgemm if cplx else rt.dgemm
    whole = f(A, B, workspace_bytes=1 << 40)
    peak = (3 * 16 + 40 if cplx else 16 + 16) * m * k
    seen = set()
    for ws in (2 * peak + 1, 2 * peak + 150_000, 200_000, 60_000):
        mb, nb, cache = G._plan_tiles(m, n, k, 16, cplx, ws)
        seen.add(cache)
        assert mb < m or nb < n
        assert_bitwise(f(A, B, workspace_bytes=ws), whole)
    assert seen == {True, False}  # both paths exercised
    # one-row / one-column operands and transposed views through the cached path
    fixed = f(A, B, moduli="fast")  # at a fixed width rows and columns are independent
    assert_bitwise(f(A[:1], B, workspace_bytes=2 * peak + 1, moduli="fast"), fixed[:1])
    assert_bitwise(f(A, B[:, :1], workspace_bytes=2 * peak + 1, moduli="fast"), fixed[:, :1])
    At = np.ascontiguousarray(A.T)
    assert_bitwise(f(At, B, trans_a="T", workspace_bytes=2 * peak + 1), whole)
    assert G._plan_tiles(m, n, k, 16, cplx, 1 << 40) == (m, n, False)  # untiled: nothing cached


def test_row_slices_keep_the_encoding():
    # the tiles of op(a) cut from its encoding as a whole equal the encodings of the row blocks
    from rnstensor.program.execute import tensor_of

    basis = rt.Basis.int8(16)
    x = phi((6, 9), 2.0, 39)
    x[2, 3] = -0.0
    z = np.stack([x, phi((6, 9), 1.0, 40)])  # a complex operand's parts share the row exponent
    be = rt.get_backend("cpu")
    for labels, data, shared in (("ik", x, (1,)), ("cik", z, (0, 2))):
        st = G.gemm_program(basis, 40, 9, labels == "cik", 1.0).steps[0]
        assert st.labels == labels and st.shared == shared

        def encoded(a):
            stats = G.group_stats(a if labels == "ik" else a[0] + 1j * a[1], 1, False)
            e = G.gemm_scale(16, 9, labels == "cik", stats, stats)[2]
            return G._encoded(a, e[:, None] if labels == "ik" else e[None, :, None], st, basis, be)

        T = encoded(data)
        for lo, hi in ((0, 6), (1, 4), (5, 6)):
            U = G._rows(T, lo, hi)
            V = encoded(data[..., lo:hi, :])
            assert U.planes.flags.c_contiguous
            np.testing.assert_array_equal(U.planes, V.planes)
            assert_bitwise(rt.decode(tensor_of(U, basis), "exact"), rt.decode(tensor_of(V, basis), "exact"))


@pytest.mark.parametrize("cplx", [False, True])
def test_backends_bitwise(cplx):
    A, B = phi((6, 70), 2.0, 33), phi((70, 5), 2.0, 34)
    if cplx:
        A, B = A + 1j * unif(A.shape, 35), B + 1j * unif(B.shape, 36)
    f = rt.zgemm if cplx else rt.dgemm
    for kw in ({}, {"moduli": 20}, {"moduli": "auto"}):
        assert_bitwise(f(A, B, backend="numpy", **kw), f(A, B, backend="cpu", **kw))
    old = rt.set_backend("numpy")
    try:
        via_default = f(A, B, alpha=0.7)
    finally:
        rt.set_backend(old)
    assert_bitwise(via_default, f(A, B, alpha=0.7, backend="cpu"))


# ----- ZGEMM -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [20, 1100])
def test_3m_residues_equal_4m(k):
    # the 3M step of the GEMM program against the 4M form from the primitives
    from rnstensor.program.execute import run_step, tensor_of

    A = phi((4, k), 1.0, 37) + 1j * phi((4, k), 2.0, 38)
    B = phi((k, 3), 1.0, 39) - 1j * unif((k, 3), 40)
    s = 16
    basis = rt.Basis.int8(s)
    t = G.gemm_width(s, k, "complex")
    prog = G.gemm_program(basis, t, k, True, 1.0)
    be = rt.get_backend("cpu")
    _, _, ea, eb = G.gemm_scale(s, k, True, G.group_stats(A, 1, False), G.group_stats(B, 0, False))
    va = G._encoded(np.stack([A.real, A.imag]), ea[None, :, None], prog.steps[0], basis, be)
    vb = G._encoded(np.stack([B.real, B.imag]), eb[None, None, :], prog.steps[1], basis, be)
    vals = {0: va, 1: vb}
    v3 = run_step(prog.steps[2], vals, basis, be, "cpu", np)
    re3, im3 = (tensor_of(type(v3)(v3.planes[:, p], v3.exp[0], v3.factor, v3.bound, "ij"), basis) for p in (0, 1))
    # the 4M form from the primitives, on operands sharing the 3M step's exponents
    Ar, Ai = (_with_exponents(x, -ea[:, None], basis, t) for x in (A.real, A.imag))
    Br, Bi = (_with_exponents(x, -eb[None, :], basis, t) for x in (B.real, B.imag))
    re4 = rt.sub(rt.mode_product(Br, Ar, 0), rt.mode_product(Bi, Ai, 0))
    im4 = rt.add(rt.mode_product(Bi, Ar, 0), rt.mode_product(Br, Ai, 0))
    assert np.array_equal(re3.residues, re4.residues) and np.array_equal(im3.residues, im4.residues)
    assert np.array_equal(re3.scale.exponent(), re4.scale.exponent())
    assert np.array_equal(im3.scale.exponent(), im4.scale.exponent())


def _with_exponents(x, e, basis, t):
    """``x`` encoded at width ``t`` with the given keepdims exponents ``e`` (``x ~= v * 2**e``), row or column scales."""
    be = rt.get_backend("cpu")
    planes = be.encode(x, -e, basis.moduli, t)
    axes = (e.reshape(-1), None) if e.shape[1] == 1 else (None, e.reshape(-1))
    return rt.RNSTensor(planes, basis, basis.moduli, 1 << t, rt.Scale(0, 1, axes))


@pytest.mark.parametrize("ta", FLAGS)
@pytest.mark.parametrize("tb", FLAGS)
def test_zgemm_trans_correctly_rounded(ta, tb):
    m, k, n = 3, 25, 4
    A = ints_scaled((m, k), 41) + 1j * ints_scaled((m, k), 42)
    B = ints_scaled((k, n), 43) - 1j * ints_scaled((k, n), 44)

    def stored(X, f):  # the array whose op(.) is X
        return X if f == "N" else np.ascontiguousarray(X.T.conj() if f == "C" else X.T)

    got = rt.zgemm(stored(A, ta), stored(B, tb), trans_a=ta, trans_b=tb)
    assert_bitwise(got, ref_zgemm(A, B))


def test_zgemm_uniform_and_alpha_beta():
    k = 1100
    A = unif((3, k), 45) + 1j * unif((3, k), 46)
    B = unif((k, 2), 47) + 1j * unif((k, 2), 48)
    ref = ref_zgemm(A, B)
    assert_bitwise(rt.zgemm(A, B), ref)
    assert_bitwise(rt.zgemm(A, B, moduli="auto"), ref)
    C = unif((3, 2), 49) - 1j * unif((3, 2), 50)
    assert_bitwise(rt.zgemm(A, B, np.full((3, 2), np.nan + 0j)), ref)
    assert_bitwise(rt.zgemm(A, B, alpha=-1.0), -ref)
    assert_bitwise(rt.zgemm(A, B, alpha=1j), 1j * ref)  # purely imaginary alpha: still one rounding per part
    got = rt.zgemm(A, B, C, alpha=0.5 - 2j, beta=1.5j)
    want = (0.5 - 2j) * ref + 1.5j * C
    assert np.allclose(got, want, rtol=1e-15, atol=0)


# ----- matmul ---------------------------------------------------------------------------------------------


def test_matmul_semantics():
    a3 = unif((2, 1, 4, 30), 51)
    b3 = unif((3, 30, 5), 52)
    got = rt.matmul(a3, b3)
    assert got.shape == (2, 3, 4, 5)
    for i in range(2):
        for j in range(3):
            assert_bitwise(got[i, j], rt.dgemm(a3[i, 0], b3[j]))
    v = unif(30, 53)
    assert rt.matmul(v, b3).shape == (3, 5) and rt.matmul(a3, v).shape == (2, 1, 4)
    assert rt.matmul(v, v).shape == ()
    assert_bitwise(rt.matmul(v, v), ref_dgemm(v[None], v[:, None])[0, 0])
    assert (np.abs(got - a3 @ b3) <= 1e-14 * (np.abs(a3) @ np.abs(b3))).all()
    z = rt.matmul(a3 + 1j * a3, b3)
    assert z.dtype == np.complex128
    assert_bitwise(z[1, 2], rt.zgemm(a3[1, 0] + 1j * a3[1, 0], b3[2] + 0j))
    with pytest.raises(ValueError, match="shape mismatch"):
        rt.matmul(unif((2, 3)), unif((4, 2)))
    with pytest.raises(ValueError, match="broadcast"):
        rt.matmul(unif((2, 3, 4)), unif((3, 4, 2)))
    with pytest.raises(TypeError, match="float64 or complex128 holds exactly"):
        rt.matmul(unif((2, 3)).astype(np.longdouble), unif((3, 2)))
    with pytest.raises(ValueError, match="0-d"):
        rt.matmul(np.float64(2.0), unif((3, 2)))


# ----- errors ---------------------------------------------------------------------------------------------


def test_operands_that_float64_holds_exactly_are_converted():
    rng = np.random.default_rng(7)
    a32, b32 = unif((3, 40)).astype(np.float32), unif((40, 5)).astype(np.float32)
    ai, bi = rng.integers(-2**53, 2**53, (3, 40), dtype=np.int64), rng.integers(-9, 9, (40, 5)).astype(np.int8)
    for a, b in ((a32, b32), (ai, bi), (ai > 0, b32), (a32.astype(np.float16), bi.astype(np.uint16))):
        want = rt.dgemm(a.astype(np.float64), b.astype(np.float64), moduli="auto")
        assert_bitwise(rt.dgemm(a, b, moduli="auto"), want)
        assert_bitwise(rt.zgemm(a, b, moduli="auto"), rt.zgemm(a.astype(np.complex128), b.astype(np.complex128), moduli="auto"))
    exact = [[sum(Fraction(int(ai[i, p])) * Fraction(int(bi[p, j])) for p in range(40)) for j in range(5)] for i in range(3)]
    assert rt.dgemm(ai, bi, moduli="auto").tolist() == [[float(v) for v in row] for row in exact]
    c = rng.integers(-5, 5, (3, 5))
    assert_bitwise(rt.dgemm(a32, b32, c, beta=0.5), rt.dgemm(a32.astype(float), b32.astype(float), c.astype(float), beta=0.5))
    z = (unif((3, 40)) + 1j * unif((3, 40))).astype(np.complex64)
    assert_bitwise(rt.zgemm(z, b32), rt.zgemm(z.astype(np.complex128), b32.astype(np.complex128)))


def test_bad_input_errors():
    a, b = unif((3, 4)), unif((4, 2))
    with pytest.raises(TypeError, match="zgemm"):
        rt.dgemm(a + 0j, b)
    with pytest.raises(TypeError, match="zgemm"):
        rt.dgemm(a, b, a @ b + 0j, beta=1.0)
    with pytest.raises(ValueError, match=r"integer of magnitude 9007199254740993 \(> 2\^53"):
        rt.dgemm(np.full((3, 4), 2**53 + 1), b)
    with pytest.raises(TypeError, match="dtype object"):
        rt.zgemm(a.astype(object), b)
    with pytest.raises(TypeError, match="dtype longdouble|dtype float128"):
        rt.dgemm(a, b.astype(np.longdouble))
    with pytest.raises(ValueError, match="trans_a"):
        rt.dgemm(a, b, trans_a="X")
    with pytest.raises(ValueError, match="trans_b"):
        rt.zgemm(a + 0j, b + 0j, trans_b=1)
    with pytest.raises(ValueError, match="shape mismatch"):
        rt.dgemm(a, b, trans_a="T")
    with pytest.raises(ValueError, match="2-D"):
        rt.dgemm(a[0], b)
    with pytest.raises(ValueError, match="c must have shape"):
        rt.dgemm(a, b, unif((2, 2)), beta=1.0)
    with pytest.raises(ValueError, match="c is required"):
        rt.dgemm(a, b, beta=1.0)
    for bad in (1, 50, 0, "x", True, 2.5):
        with pytest.raises(ValueError, match="moduli"):
            rt.dgemm(a, b, moduli=bad)
    with pytest.raises(RNSRangeError, match="moduli"):
        rt.dgemm(unif((2, 1 << 15)), unif((1 << 15, 1)), moduli=2)
    with pytest.raises(ValueError, match="out"):
        rt.dgemm(a, b, out=np.empty((2, 2)))
    with pytest.raises(ValueError, match="workspace_bytes"):
        rt.dgemm(a, b, workspace_bytes=0)
    with pytest.raises(TypeError, match="alpha"):
        rt.dgemm(a, b, alpha=1j)
    assert_bitwise(rt.dgemm(a, b, trans_a="n", moduli=2, min_bits=0), rt.dgemm(a, b, moduli=np.int64(2), min_bits=0))
    # einsum's min_bits rule: a width below 32 bits is refused, saying how many moduli keep 53
    with pytest.raises(rt.PlanError, match=r"moduli=2 at k=4 \(width t=6\) keeps only 6.0 bits.*min_bits=32.*moduli='fast' keeps 53 bits"):
        rt.dgemm(a, b, moduli=2)
    with pytest.raises(rt.PlanError, match="min_bits=7"):
        rt.zgemm(a + 0j, b + 0j, moduli=2, min_bits=7)
    with pytest.raises(rt.PlanError, match="min_bits"):
        rt.matmul(a, b, moduli=2)
    assert rt.dgemm(a, b, moduli=2, min_bits=6).shape == (a.shape[0], b.shape[1])


@pytest.mark.parametrize("module", [G, GA])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_accuracy_harness_reference_matches_oracle():
    for name in GA.GEMM_DATASETS:
        A, B = GA.gemm_dataset(name, 3, 64, 2, seed=1)
        S, e = GA.exact_gemm(A, B)
        C = ref_dgemm(A, B)
        m = GA.gemm_metrics(C, S, e, np.abs(A) @ np.abs(B))
        assert m["cr_percent"] == 100.0 and m["max_ulp"] <= 0.5


# ----- BLAS semantics against scipy's BLAS (exact data: both sides must agree bit for bit) ------------


@pytest.mark.parametrize("cplx", [False, True])
def test_blas_semantics_match_scipy(cplx):
    blas = pytest.importorskip("scipy.linalg.blas")
    rng = np.random.default_rng(41)
    m, k, n = 4, 6, 3
    flags = ("N", "T", "C")
    code = {"N": 0, "T": 1, "C": 2}
    alphas = (0.0, 1.0, -2.5) + ((0.5 - 1.5j, 1j) if cplx else (0.75,))
    betas = (0.0, 1.0, -3.0) + ((2 + 1j,) if cplx else ())
    # small integers (and halves): every product, sum and scaling is exact in float64 BLAS and in ours
    def ints(shape):
        x = rng.integers(-9, 10, shape) / 2.0
        return x + 1j * rng.integers(-9, 10, shape) / 2.0 if cplx else x
    f, ref = (rt.zgemm, blas.zgemm) if cplx else (rt.dgemm, blas.dgemm)
    for ta in flags:
        for tb in flags:
            a = ints((m, k) if ta == "N" else (k, m))
            b = ints((k, n) if tb == "N" else (n, k))
            c = ints((m, n))
            for alpha in alphas:
                for beta in betas:
                    want = ref(alpha, a, b, beta=beta, c=c.copy(), trans_a=code[ta], trans_b=code[tb])
                    got = f(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb)
                    assert_bitwise(got + 0.0, np.asarray(want) + 0.0)  # +0.0: signed zeros aside
            # beta = 0 never reads c, NaN included (BLAS)
            cn = np.full((m, n), np.nan, dtype=c.dtype)
            want = ref(1.0, a, b, beta=0.0, c=cn.copy(), trans_a=code[ta], trans_b=code[tb])
            assert_bitwise(f(a, b, cn, beta=0.0, trans_a=ta, trans_b=tb) + 0.0, np.asarray(want) + 0.0)


def test_auto_moduli_beyond_49_moduli_split_exactly():
    """[[1, 2^-53, 2^-300]] @ ones: 'auto' returned 1.0 (capped at 49 moduli); the correctly rounded value is 1 + 2^-52."""
    a = np.array([[1.0, 2.0**-53, 2.0**-300]])
    b = np.ones((3, 1))
    with pytest.raises(G.SplitNeeded, match=r"moduli='auto' needs a width of [0-9]+ bits.*49 INT8 moduli hold t="):
        G.gemm_scale("auto", 3, False, G.group_stats(a, 1, True), G.group_stats(b, 0, True))
    assert rt.dgemm(a, b, moduli="auto")[0, 0] == 1.0 + 2.0**-52
    assert rt.zgemm(a + 0j, b + 0j, moduli="auto")[0, 0] == 1.0 + 2.0**-52
    z = np.array([[1 + 1j * 2.0**-900, 2.0**-53 - 1j, 2.0**-300 + 1j * 2.0**-600]])  # parts 900 binades apart
    with pytest.raises(G.SplitNeeded):
        G.gemm_scale("auto", 3, True, G.group_stats(z, 1, True), G.group_stats(b - 1j, 0, True))
    assert_bitwise(rt.zgemm(z, b - 1j, moduli="auto"), ref_zgemm(z, b - 1j))
    # beyond 49 moduli the parts' exact sums meet a general complex alpha exactly too: each part rounded once
    alpha = 0.7 - 0.3j
    got = rt.zgemm(z, b - 1j, moduli="auto", alpha=alpha)
    ar, ai = _xint(alpha.real), _xint(alpha.imag)
    zr, zi, br, bi = _ints(z.real)[0], _ints(z.imag)[0], _ints(b.real.T)[0], _ints((b - 1j).imag.T)[0]
    re = sum(x * y for x, y in zip(zr, br)) - sum(x * y for x, y in zip(zi, bi))
    im = sum(x * y for x, y in zip(zr, bi)) + sum(x * y for x, y in zip(zi, br))
    assert got[0, 0] == complex(_round(ar * re - ai * im, -3 * _SHIFT), _round(ar * im + ai * re, -3 * _SHIFT))
    a[0, 2] = 2.0**-100  # a spread 49 moduli hold: one product
    assert rt.dgemm(a, b, moduli="auto")[0, 0] == 1.0 + 2.0**-52


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 3), st.sampled_from([400, 1200, 2100]),
       st.sampled_from([1.0, -0.75, 3 * 2.0**-40]), st.booleans(), st.integers(0, 2**32 - 1))
def test_property_auto_correctly_rounded_on_any_spread(m, k, n, spread, alpha, cplx, seed):
    """Exponents over the whole float64 range, subnormal results included: every part correctly rounded."""
    r = rng(seed)
    A, B = _wide(r, (m, k), spread, 0.2, cplx), _wide(r, (k, n), spread, 0.2, cplx)
    A = _scale2(A, -int(np.frexp(np.abs(A).max() or 1.0)[1]) - 1)
    B = _scale2(B, -int(np.frexp(np.abs(B).max() or 1.0)[1]) + 1)
    if cplx:
        assert_bitwise(rt.zgemm(A, B, moduli="auto") + 0j, ref_zgemm(A, B) + 0j)
        # a purely imaginary alpha swaps the parts exactly: still correctly rounded (a general one adds a sum)
        got = rt.zgemm(A, B, moduli="auto", alpha=1j * alpha)
        assert_bitwise(got + 0j, np.asarray(ref_zgemm_scaled(A, B, 1j * alpha)) + 0j)
    else:
        # (the sign of an exact zero times a negative alpha is not part of the promise: -0.0 and 0.0 compare)
        assert_bitwise(rt.dgemm(A, B, moduli="auto", alpha=alpha) + 0.0, ref_dgemm(A, B, alpha) + 0.0)


def test_split_product_past_float64_range_is_exact():
    # rows / columns wider than 49 moduli hold are split; slice-pair products past float64's range summed in float64
    # gave inf - inf = NaN where the exact value is 2**-800 (numpy gives NaN too); those entries are now exact
    from rnstensor.gemm.split import _choose

    a = np.array([[2.0**1022, -2.0**908, 2.0**-800], [2.0**1022, 2.0**908, 2.0**-800], [1.0, 2.0, 3.0],
                  [-2.0**1022, -2.0**908, 2.0**-800]])
    b = np.array([[2.0**110], [2.0**224], [1.0]])
    assert _choose(None, a, b, 3, False)[0] == "pairs"
    for alpha in (1.0, -3.0, 0.375):
        y = rt.dgemm(a, b, alpha=alpha)
        for i in range(a.shape[0]):
            exact = Fraction(alpha) * sum(Fraction(float(a[i, p])) * Fraction(float(b[p, 0])) for p in range(3))
            if abs(exact) >= 2**1024:  # past the range: the sign's infinity
                assert y[i, 0] == (np.inf if exact > 0 else -np.inf), (i, alpha)
            else:
                assert abs(Fraction(float(y[i, 0])) - exact) <= _gamma(3) * abs(exact), (i, alpha, y[i, 0])
    # complex: no NaN from inf - inf; an infinite part only where the exact part lies past the range, with its sign
    # (a finite part meets sqrt(2) gamma_(k+2) of the moduli |A||B|, past the range here, so it is not checked)
    za, zb = a + 1j * a[:, ::-1] * 2.0**-60, b - 1j * b * 2.0**-2
    q = lambda v: Fraction(float(v))  # noqa: E731 - every float64 is a rational
    for alpha in (1.0, 0.5 - 2j):
        y = rt.zgemm(za, zb, alpha=alpha)
        assert not np.isnan(y.real).any() and not np.isnan(y.imag).any(), alpha
        for i in range(a.shape[0]):
            re = sum(q(za[i, p].real) * q(zb[p, 0].real) - q(za[i, p].imag) * q(zb[p, 0].imag) for p in range(3))
            im = sum(q(za[i, p].real) * q(zb[p, 0].imag) + q(za[i, p].imag) * q(zb[p, 0].real) for p in range(3))
            ar, ai = q(complex(alpha).real), q(complex(alpha).imag)
            for got, exact in ((y[i, 0].real, ar * re - ai * im), (y[i, 0].imag, ar * im + ai * re)):
                if np.isinf(got):
                    assert (got > 0) == (exact > 0) and abs(exact) >= 2**1023, (i, alpha, got)


def test_complex_alpha_terms_past_the_range_are_exact():
    # one product (no split): (ar + i ai)(Re + i Im) decodes ar Re and ai Im apart and sums them in float64; both
    # past the range gave inf - inf = NaN where the real part is exactly 0
    a, b = np.array([[2.0**1001 + 0j]]), np.array([[2.0**23 + 2.0**23 * 1j]])
    y = rt.zgemm(a, b, alpha=1 + 1j)
    assert y[0, 0].real == 0.0 and y[0, 0].imag == np.inf


def test_inf_nan_rows_do_not_widen_the_others():
    # a row holding NaN is zeroed for the residue product (numpy's rule gives its results): its exponent must not
    # count in the measured ratio, where 0 / (its sums) read as a zero magnitude and sent the matrix to the split path
    from rnstensor.gemm.split import _choose

    rng = np.random.default_rng(40)
    a = rng.uniform(-1, 1, (6, 40)) * 2.0 ** rng.integers(-100, 100, (6, 1))
    b = rng.uniform(-1, 1, (40, 5)) * 2.0 ** rng.integers(-80, 80, (40, 1))
    bad = a.copy()
    bad[2, 7] = np.nan
    keep = [0, 1, 3, 4, 5]
    assert _choose(None, bad, b, 40, False)[:2] == _choose(None, a[keep], b, 40, False)[:2]
    y = rt.dgemm(bad, b)
    assert np.isnan(y[2]).all() and np.array_equal(y[keep], rt.dgemm(a[keep], b))


@pytest.mark.parametrize("kind", ["uniform", "phi=4", "complex"])
@pytest.mark.parametrize("moduli", [None, "fast", "auto", 20])
def test_matmul_of_a_stack_sharing_b_is_each_matrix_alone(monkeypatch, kind, moduli):
    # a stack times one matrix (or vector): every matrix dgemm's (zgemm's) bits alone, numpy's inf / NaN rule, signed
    # zeros, without the per-matrix stack (the default: one product for every width; a fixed width or a correctly
    # rounded policy: one GEMM of the stacked rows)
    import rnstensor.gemm.api as gemm_api

    rng = np.random.default_rng(len(kind) + 3 * (moduli is None))

    def data(shape):
        if kind == "uniform":
            return rng.uniform(-1, 1, shape)
        if kind == "complex":
            return rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)
        return rng.standard_normal(shape) * np.exp(4 * rng.standard_normal(shape))

    a, b = data((2, 4, 5, 30)), data((30, 6))
    a[1, 0] = 0.0
    a[0, 2, 3] = -1e-310
    stacked = []
    monkeypatch.setattr(gemm_api, "gemm_stack", lambda *args: stacked.append(1) or list(range(args[1].shape[0])))
    gemm = rt.zgemm if kind == "complex" else rt.dgemm
    for rhs in (b, b[:, 2], b[None]):
        y = rt.matmul(a, rhs, moduli=moduli)
        for i, j in np.ndindex(2, 4):
            want = gemm(a[i, j], b if rhs.ndim > 1 else b[:, 2:3], moduli=moduli).reshape(y[i, j].shape)
            assert np.array_equal(y[i, j], want) and np.array_equal(np.signbit(y[i, j].real), np.signbit(want.real))
    assert not stacked
    a[0, 1, 2], b[7, 3] = np.nan, -np.inf
    y = rt.matmul(a, b, moduli=moduli)
    with np.errstate(invalid="ignore"):
        for i, j in np.ndindex(2, 4):
            assert np.array_equal(y[i, j], gemm(a[i, j], b, moduli=moduli), equal_nan=True)


def test_a_stack_sharing_b_keeps_each_matrix_on_its_own_width():
    # data on which one matrix's bits on its own width differ from those on the stack's widest (so one width for
    # every matrix would be caught): each matrix still holds dgemm's bits alone
    from rnstensor.gemm.stack import shared_moduli

    rng = np.random.default_rng(25)
    a = rng.standard_normal((4, 3, 60)) * np.exp(4 * rng.standard_normal((4, 3, 60)))
    b = rng.standard_normal((60, 4)) * np.exp(4 * rng.standard_normal((60, 4)))
    counts = shared_moduli(60, False, a, b, np)[0]
    assert len(set(counts)) > 1
    assert any(not np.array_equal(rt.dgemm(a[i], b), rt.dgemm(a[i], b, moduli=max(counts))) for i in range(4))
    for y in (rt.matmul(a, b), rt.einsum("ijk,kl->ijl", a, b)):
        for i in range(4):
            assert np.array_equal(y[i], rt.dgemm(a[i], b))


def test_first_calls_from_threads_find_the_kernels_module():
    # a fresh process whose first dgemm calls come from 4 threads at once (a Dask tile's in-memory dgemm, a user's
    # thread pool): the kernels' module, loaded on first use, is found whole by every thread (an ImportError when
    # the threads went through a name that is rebound to the module once it is loaded)
    import subprocess
    import sys

    script = (
        "from concurrent.futures import ThreadPoolExecutor\n"
        "import numpy as np, rnstensor as rt\n"
        "rng = np.random.default_rng(0)\n"
        "A, B = rng.standard_normal((40, 30)), rng.standard_normal((30, 20))\n"
        "with ThreadPoolExecutor(4) as pool:\n"
        "    got = list(pool.map(lambda i: rt.dgemm(A, B), range(4)))\n"
        "assert all(np.array_equal(g, got[0]) for g in got)\n"
        "print('every thread', np.abs(got[0] - A @ B).max() <= 1e-13)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "every thread True" in done.stdout, done.stderr[-2000:]


@pytest.mark.parametrize("cplx", [False, True])
def test_auto_split_with_a_non_finite_c_follows_ieee(cplx):
    # rows too wide for 49 moduli ('auto' splits them exactly) and c holding NaN and inf: IEEE's beta * c there (a
    # NaN and an inf were dropped: the exact combination read their bits as integers), the rest rounded once
    rng = np.random.default_rng(8)
    a = rng.standard_normal((30, 6)) * np.exp2(rng.integers(-400, 400, (30, 6)))
    b = rng.standard_normal((30, 5)) * np.exp2(rng.integers(-400, 400, (30, 5)))
    c = rng.standard_normal((6, 5))
    c[1, 2], c[3, 4] = np.nan, -np.inf
    if cplx:
        a, b, c = a + 0.5j * a[::-1], b - 1j * b[::-1], c + 1j
    gemm = rt.zgemm if cplx else rt.dgemm
    y = gemm(a, b, c, trans_a="T", beta=0.5, moduli="auto")
    bad = ~np.isfinite(c)
    with np.errstate(invalid="ignore"):
        assert np.array_equal(y[bad], 0.5 * c[bad], equal_nan=True)
    finite = gemm(a, b, np.where(bad, 0, c), trans_a="T", beta=0.5, moduli="auto")
    assert np.array_equal(y[~bad], finite[~bad])
    if not cplx:
        F = [[Fraction(float(v)) for v in col] for col in a.T]
        G = [[Fraction(float(v)) for v in col] for col in b.T]
        for i, j in zip(*np.nonzero(~bad)):
            exact = sum(x * z for x, z in zip(F[i], G[j])) + Fraction(1, 2) * Fraction(float(c[i, j]))
            assert y[i, j] == float(exact)
