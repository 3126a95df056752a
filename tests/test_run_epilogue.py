"""The exact GEMM epilogue (rnstensor/run/epilogue.py) and ``moduli='auto'`` with alpha, beta and complex scalars.

Oracle: Fractions. ``float(Fraction)`` rounds once to nearest-even, so the
correctly rounded value of ``alpha * op(a) @ op(b) + beta * c`` (each part)
is ``float`` of the exact rational.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import rnstensor as rt
from rnstensor.run.epilogue import exact_combination


def _F(x) -> Fraction:
    return Fraction(float(x))


def _rounded(v: Fraction) -> float:
    try:
        return float(v)
    except OverflowError:
        return float("inf") if v > 0 else float("-inf")


def _oracle(opa, opb, c, alpha, beta, cplx: bool) -> np.ndarray:
    m, k = opa.shape
    n = opb.shape[1]
    out = np.empty((m, n), np.complex128 if cplx else np.float64)
    al, be = complex(alpha), complex(beta)
    for i in range(m):
        for j in range(n):
            if cplx:
                sr = sum(_F(opa[i, p].real) * _F(opb[p, j].real) - _F(opa[i, p].imag) * _F(opb[p, j].imag)
                         for p in range(k))
                si = sum(_F(opa[i, p].real) * _F(opb[p, j].imag) + _F(opa[i, p].imag) * _F(opb[p, j].real)
                         for p in range(k))
                re = _F(al.real) * sr - _F(al.imag) * si
                im = _F(al.real) * si + _F(al.imag) * sr
                if be != 0:
                    re += _F(be.real) * _F(c[i, j].real) - _F(be.imag) * _F(c[i, j].imag)
                    im += _F(be.real) * _F(c[i, j].imag) + _F(be.imag) * _F(c[i, j].real)
                out[i, j] = complex(_rounded(re), _rounded(im))
            else:
                v = _F(alpha) * sum(_F(opa[i, p]) * _F(opb[p, j]) for p in range(k))
                if beta != 0:
                    v += _F(beta) * _F(c[i, j])
                out[i, j] = _rounded(v)
    return out


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    bad = np.argwhere(got.view(np.uint64) != want.view(np.uint64)) if got.dtype.kind == "f" else np.argwhere(
        (got.real.view(np.uint64) != want.real.view(np.uint64)) | (got.imag.view(np.uint64) != want.imag.view(np.uint64)))
    assert bad.size == 0, f"{len(bad)} of {got.size} entries not correctly rounded, e.g. {bad[:3].tolist()}"


def _wide(rng, shape, spread, cplx=False):
    def part():
        return rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))
    return part() + 1j * part() if cplx else part()


# ----- the epilogue alone ----------------------------------------------------------------------------


def test_exact_combination_real_against_fractions():
    rng = np.random.default_rng(1)
    shape = (7, 5)
    S = np.array([int(v) << int(s) for v, s in zip(rng.integers(-2**62, 2**62, 35), rng.integers(0, 90, 35))],
                 dtype=object).reshape(shape)
    e = rng.integers(-1300, 900, shape)
    c = _wide(rng, shape, 1000)
    c[0, 0] = 5e-324
    c[0, 1] = -1.7976931348623157e308
    for alpha, beta in ((1.0, 0.0), (-0.7, 1.0), (3.5e-300, -2.25e200), (1.0, 1e-320)):
        got = exact_combination([(S, e)], alpha, beta, c, False)
        for idx in np.ndindex(*shape):
            want = _rounded(_F(alpha) * Fraction(S[idx]) * Fraction(2) ** int(e[idx]) + _F(beta) * _F(c[idx]))
            assert got[idx] == want or (np.isnan(got[idx]) and np.isnan(want)), (idx, got[idx], want)
            assert np.signbit(got[idx]) == np.signbit(want) or want != 0


def test_exact_combination_ties_and_sticky_terms():
    # 1 + 2**-53 is a tie (rounds to 1); any term beyond, however far below, breaks it
    S = np.array([[1 << 53, (1 << 1000) + 1, (1 << 1000) - 1]], dtype=object)  # 1, 1 + 2**-1000, 1 - 2**-1000
    e = np.array([[-53, -1000, -1000]])
    c = np.full((1, 3), 2.0**-53)
    got = exact_combination([(S, e)], 1.0, 1.0, c, False)
    assert got.tolist() == [[1.0, 1.0 + 2.0**-52, 1.0]]


# ----- through dgemm / zgemm ----------------------------------------------------------------------------


@pytest.mark.parametrize("trans_a, trans_b", [("N", "N"), ("T", "N"), ("N", "T")])
@pytest.mark.parametrize("alpha, beta", [(1.5, -0.3), (-1.0, 1.0), (2.0**-600, 1e150), (1.0, 0.0)])
def test_dgemm_auto_rounds_the_whole_expression_once(trans_a, trans_b, alpha, beta):
    rng = np.random.default_rng(7)
    m, k, n = 5, 6, 4
    opa, opb = _wide(rng, (m, k), 40), _wide(rng, (k, n), 40)
    c = _wide(rng, (m, n), 60)
    a = opa.T.copy() if trans_a == "T" else opa
    b = opb.T.copy() if trans_b == "T" else opb
    got = rt.dgemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, moduli="auto")
    _same(got, _oracle(opa, opb, c, alpha, beta, False))


@pytest.mark.parametrize("alpha, beta", [(0.75 - 1.25j, 0.5 + 2j), (1j, -1.0), (1 + 1j, 0.0), (2.0, 1j)])
@pytest.mark.parametrize("trans_a", ["N", "C"])
def test_zgemm_auto_rounds_each_part_once(alpha, beta, trans_a):
    rng = np.random.default_rng(8)
    m, k, n = 4, 5, 3
    opa, opb = _wide(rng, (m, k), 30, True), _wide(rng, (k, n), 30, True)
    c = _wide(rng, (m, n), 50, True)
    a = opa.T.conj().copy() if trans_a == "C" else opa
    got = rt.zgemm(a, opb, c, alpha=alpha, beta=beta, trans_a=trans_a, moduli="auto")
    _same(got, _oracle(opa, opb, c, alpha, beta, True))


def test_auto_split_rows_with_beta():
    # rows spanning more binades than 49 moduli hold: the exact split product, then the same epilogue
    rng = np.random.default_rng(9)
    a = np.array([[1e300, 1e-300, 3.0], [2.5, -1e-200, 1e250]])
    b = _wide(rng, (3, 2), 20)
    c = np.array([[-1.0, 1e-310], [7.0, -2.0**-1074]])
    got = rt.dgemm(a, b, c, alpha=-0.375, beta=1.5, moduli="auto")
    _same(got, _oracle(a, b, c, -0.375, 1.5, False))
    za = a + 1j * a[::-1]
    zb = b - 1j * b
    zc = c + 2j * c
    got = rt.zgemm(za, zb, zc, alpha=0.5 + 0.25j, beta=-1j, moduli="auto")
    _same(got, _oracle(za, zb, zc, 0.5 + 0.25j, -1j, True))


def test_auto_with_beta_keeps_numpys_inf_and_nan_rows():
    a = np.array([[1.0, 2.0], [np.inf, 1.0]])
    b = np.array([[1.0, 0.5], [0.25, 1.0]])
    c = np.array([[0.1, 0.2], [0.3, 0.4]])
    got = rt.dgemm(a, b, c, alpha=1.0, beta=0.5, moduli="auto")
    with np.errstate(invalid="ignore"):
        want_bad = 1.0 * (a[1:] @ b) + 0.5 * c[1:]
    assert np.array_equal(got[1:], want_bad, equal_nan=True)
    _same(got[:1], _oracle(a[:1], b, c[:1], 1.0, 0.5, False))


def test_auto_alpha_zero_is_beta_c_rounded_once():
    a, b = np.ones((2, 3)), np.ones((3, 2))
    c = np.array([[1.0 + 3e-16j, -2.5 + 1e300j], [3.0 - 1j, 0.1 + 0.2j]])
    beta = 1 / 3 + 2j / 7
    for alpha, kdim in ((0.0, 3), (1.0, 0)):
        got = rt.zgemm(a[:, :kdim], b[:kdim], c, alpha=alpha, beta=beta, moduli="auto")
        _same(got, _oracle(a[:, :kdim] + 0j, b[:kdim] + 0j, c, alpha, beta, True))


def test_exact_epilogue_in_residues_gives_the_exact_combinations_bits(monkeypatch):
    # alpha S 2**e + beta c formed as one integer in residues (base-extended where the product's moduli do not
    # hold it) and decoded exactly once: the bits of the entry-by-entry Python combination, ties, subnormals,
    # overflow and signed zeros included; entries whose sum no 49 moduli hold take that combination
    from rnstensor.basis import Basis
    from rnstensor.program.execute import Value
    from rnstensor.run import epilogue

    rng = np.random.default_rng(8)
    basis = Basis.int8(16)
    shape = (9, 11)
    bound = 1 << 120
    S = np.array([int(v) << int(s) for v, s in zip(rng.integers(-2**62, 2**62, 99), rng.integers(0, 58, 99))],
                 dtype=object).reshape(shape)
    S[0, 0], S[0, 1], S[0, 2] = 0, 1 << 119, -(1 << 53)
    planes = np.stack([np.array([[(int(x) % p) - p if int(x) % p >= (p + 1) // 2 else int(x) % p for x in row]
                                 for row in S], np.int8) for p in basis.moduli])
    e = (rng.integers(-90, 40, (shape[0], 1)) + rng.integers(-90, 40, (1, shape[1]))).astype(np.int64)
    e[0, 2] = -53
    e[1, 0], e[1, 1] = -1200, 900  # a subnormal product, one past the range
    c = rng.standard_normal(shape) * np.exp2(rng.integers(-60, 60, shape))
    c[0, 0], c[0, 1], c[0, 2] = 0.0, 5e-324, 2.0**-53  # (S = 0; a tiny c beside a huge product; a tie: 1 + 2**-53)
    c[2, 0], c[2, 1] = 1e300, -1e-300  # gaps of thousands of bits: the entry-by-entry path
    seen = []
    real = epilogue.exact_combination
    monkeypatch.setattr(epilogue, "exact_combination", lambda parts, *a: seen.append(parts[0][0].size) or real(parts, *a))
    for alpha, beta, far in ((1.0, 1.0, 5), (-0.7, 0.3, 5), (1.5, -1.0, 5), (-1.0, 1.0, 5), (1.0, 0.0, 0),
                             (0.0, -2.5, 0), (2.0**-1000, 3.0, 99)):  # (far: the entries no 49 moduli hold)
        seen.clear()
        cc = (-c if alpha == -1.0 else c) if beta != 0 else None
        got = epilogue.exact_epilogue(Value(planes, e, 1, bound, "ij"), basis, alpha, beta, cc, False)
        _same(got, real([(S, e)], alpha, beta, cc, False))
        assert sum(seen) <= far, (alpha, beta, seen)


def test_the_combination_kernel_gives_the_references_residues(monkeypatch):
    # the CPU backend's one-pass kernel and the NumPy reference (a cold kernel's path) agree residue for residue
    from rnstensor.backends.cpu.backend import CpuBackend
    from rnstensor.basis import Basis
    from rnstensor.run.epilogue import combined_planes

    rng = np.random.default_rng(4)
    moduli = Basis.int8(24).moduli
    raw = [rng.integers(0, p, (6, 7)) for p in moduli]  # (centered residues, as the encode gives them)
    planes = np.stack([np.where(x >= (p + 1) // 2, x - p, x) for x, p in zip(raw, moduli)]).astype(np.int8)
    e = rng.integers(-120, 40, (6, 7))
    c = rng.standard_normal((6, 7)) * np.exp2(rng.integers(-80, 80, (6, 7)))
    c[0, 0] = 0.0
    for alpha, beta, cc in ((1.5, -0.3, c), (0.0, 2.0, c), (-3.0, 0.0, None), (2.0**-30, 1.0, c)):
        fast = combined_planes(planes, moduli, e, 1 << 100, alpha, beta, cc)
        with monkeypatch.context() as m:
            m.setattr(CpuBackend, "combine_residues", lambda self, *a: None)
            ref = combined_planes(planes, moduli, e, 1 << 100, alpha, beta, cc)
        assert np.array_equal(fast[0], ref[0]) and np.array_equal(fast[1], ref[1]) and np.array_equal(fast[2], ref[2])
        assert fast[2].any()


def test_an_inf_or_nan_c_keeps_ieee_values_in_the_exact_epilogue():
    # (a reviewer found finite garbage: inf's float parts are not an integer)
    a, b = np.array([[1.0, 2.0]]), np.array([[2.0], [0.5]])
    for c, want in ((np.inf, np.inf), (-np.inf, -np.inf), (np.nan, np.nan)):
        C = np.array([[c]])
        for kw in (dict(moduli="auto"), dict(rtol=1.2e-16), dict(moduli="auto", alpha=0.0)):
            y = rt.dgemm(a, b, C, beta=0.5, **kw)
            assert np.array_equal(y, [[0.5 * want]], equal_nan=True), (c, kw, y)


def test_far_out_c_entries_take_the_python_path_not_every_entry_wider(monkeypatch):
    # two entries of c 2**±900 away from the rest: the residues stay on the range the others need (extending every
    # entry to 49 moduli for two would cost more) and those two are summed in Python integers; every entry still
    # alpha * A @ B + beta * c rounded once (Fractions)
    import rnstensor.run.epilogue as ep

    rng = np.random.default_rng(30)
    A, B, c = rng.standard_normal((40, 30)), rng.standard_normal((30, 20)), rng.standard_normal((40, 20))
    c[3, 4], c[10, 7] = 2.0**900, -(2.0**-900)
    sizes, real = [], ep.exact_combination
    monkeypatch.setattr(ep, "exact_combination", lambda sums, *a: sizes.append(sums[0][0].size) or real(sums, *a))
    alpha, beta = 1.5, -0.3
    y = rt.dgemm(A, B, c, alpha=alpha, beta=beta, moduli="auto")
    assert sizes == [2]
    AF, BF = [[_F(v) for v in row] for row in A], [[_F(v) for v in row] for row in B]
    for i in range(40):
        for j in range(20):
            p = sum(AF[i][k] * BF[k][j] for k in range(30))
            assert y[i, j] == _rounded(_F(alpha) * p + _F(beta) * _F(c[i, j])), (i, j)
