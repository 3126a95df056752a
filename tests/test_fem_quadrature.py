"""Gauss and GLL rules and Lagrange matrices against exact rational arithmetic and closed forms."""

from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest

from rnstensor.fem import gauss, gll, lagrange_matrices

U = Fraction(1, 2**53)


def legendre_exact(n: int, x: Fraction) -> Fraction:
    p0, p1 = Fraction(1), x
    if n == 0:
        return p0
    for k in range(2, n + 1):
        p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
    return p1


def dlegendre_exact(n: int, x: Fraction) -> Fraction:
    """P_n'(x) from (1 - x^2) P_n' = n (P_{n-1} - x P_n), for |x| < 1."""
    return n * (legendre_exact(n - 1, x) - x * legendre_exact(n, x)) / (1 - x * x)


def ulp(x: float) -> Fraction:
    return Fraction(math.ulp(x)) if x != 0 else Fraction(math.ulp(0.5))


def integrate(x, w, k: int) -> Fraction:
    return sum((Fraction(wi) * Fraction(xi) ** k for xi, wi in zip(x.tolist(), w.tolist())), Fraction(0))


def monomial_integral(k: int) -> Fraction:
    return Fraction(2, k + 1) if k % 2 == 0 else Fraction(0)


@pytest.mark.parametrize("n", range(1, 21))
def test_gauss_exactness_and_roots(n):
    x, w = gauss(n)
    assert x.shape == w.shape == (n,) and np.all(np.diff(x) > 0) and np.all(w > 0)
    assert np.array_equal(x, -x[::-1]) and np.array_equal(w, w[::-1])
    for k in range(2 * n):  # exact up to degree 2n - 1, to a few roundings of the weights and nodes
        err = abs(integrate(x, w, k) - monomial_integral(k))
        assert err <= 8 * n * U, (n, k, float(err))
    # not exact at degree 2n: a test that can fail
    assert abs(integrate(x, w, 2 * n) - monomial_integral(2 * n)) > 1e-6 * Fraction(1, 4**n)
    for xi in x.tolist():  # each node within one ulp of a root of P_n (sign change)
        if xi == 0.0:
            assert legendre_exact(n, Fraction(0)) == 0
            continue
        a, b = Fraction(xi) - ulp(xi), Fraction(xi) + ulp(xi)
        assert legendre_exact(n, a) * legendre_exact(n, b) < 0, (n, xi)
    for xi, wi in zip(x.tolist(), w.tolist()):  # weights 2 / ((1 - x^2) P_n'(x)^2), correctly rounded up to node error
        if n == 1:
            assert wi == 2.0
            continue
        t = Fraction(xi)
        exact = 2 / ((1 - t * t) * dlegendre_exact(n, t) ** 2)
        assert abs(Fraction(wi) - exact) <= 4 * n * U * exact


@pytest.mark.parametrize("n", range(2, 21))
def test_gll_exactness_and_roots(n):
    x, w = gll(n)
    assert x[0] == -1.0 and x[-1] == 1.0 and np.all(np.diff(x) > 0) and np.all(w > 0)
    assert np.array_equal(x, -x[::-1]) and np.array_equal(w, w[::-1])
    assert w[0] == 2.0 / (n * (n - 1))
    for k in range(2 * n - 2):  # exact up to degree 2n - 3
        err = abs(integrate(x, w, k) - monomial_integral(k))
        assert err <= 8 * n * U, (n, k, float(err))
    assert abs(integrate(x, w, 2 * n - 2) - monomial_integral(2 * n - 2)) > 1e-6 * Fraction(1, 4**n)
    for xi in x[1:-1].tolist():  # interior nodes: roots of P'_{n-1}
        if xi == 0.0:
            assert dlegendre_exact(n - 1, Fraction(0)) == 0
            continue
        a, b = Fraction(xi) - ulp(xi), Fraction(xi) + ulp(xi)
        assert dlegendre_exact(n - 1, a) * dlegendre_exact(n - 1, b) < 0, (n, xi)


def test_known_values_correctly_rounded():
    getcontext().prec = 50
    s3, s35, s15 = Decimal(3).sqrt(), (Decimal(3) / 5).sqrt(), Decimal(5).sqrt()
    assert gauss(1)[0].tolist() == [0.0] and gauss(1)[1].tolist() == [2.0]
    assert gauss(2)[0].tolist() == [float(-1 / s3), float(1 / s3)]
    assert gauss(3)[0].tolist() == [float(-s35), 0.0, float(s35)]
    assert gauss(3)[1].tolist() == [float(Decimal(5) / 9), float(Decimal(8) / 9), float(Decimal(5) / 9)]
    # 4-point Gauss: x^2 = (3 -+ 2 sqrt(6/5)) / 7, w = (18 +- sqrt(30)) / 36
    r = (Decimal(6) / 5).sqrt()
    xs = [((3 + 2 * r) / 7).sqrt(), ((3 - 2 * r) / 7).sqrt()]
    assert gauss(4)[0].tolist() == [float(-xs[0]), float(-xs[1]), float(xs[1]), float(xs[0])]
    w30 = Decimal(30).sqrt()
    assert gauss(4)[1].tolist() == [float((18 - w30) / 36), float((18 + w30) / 36),
                                    float((18 + w30) / 36), float((18 - w30) / 36)]
    assert gll(2)[0].tolist() == [-1.0, 1.0] and gll(2)[1].tolist() == [1.0, 1.0]
    assert gll(4)[0].tolist() == [-1.0, float(-1 / s15), float(1 / s15), 1.0]
    sixths = [float(Decimal(1) / 6), float(Decimal(5) / 6)]
    assert gll(4)[1].tolist() == sixths + sixths[::-1]
    s37 = (Decimal(3) / 7).sqrt()
    assert gll(5)[0].tolist() == [-1.0, float(-s37), 0.0, float(s37), 1.0]
    assert gll(5)[1].tolist() == [0.1, float(Decimal(49) / 90), float(Decimal(32) / 45), float(Decimal(49) / 90), 0.1]


def test_rules_return_fresh_arrays():
    x, _ = gauss(5)
    x[0] = 7.0
    assert gauss(5)[0][0] != 7.0


@pytest.mark.parametrize("fn,bad,exc", [(gauss, 0, ValueError), (gll, 1, ValueError), (gauss, 65, ValueError),
                                        (gll, 2.0, TypeError), (gauss, "3", TypeError)])
def test_bad_n(fn, bad, exc):
    with pytest.raises(exc, match="n"):
        fn(bad)


# ----- Lagrange matrices -----------------------------------------------------------------------


def lagrange_exact(nodes, y, j):
    xs = [Fraction(v) for v in nodes]
    t = Fraction(y)
    val = Fraction(1)
    for m, xm in enumerate(xs):
        if m != j:
            val *= (t - xm) / (xs[j] - xm)
    der = Fraction(0)
    for k, xk in enumerate(xs):
        if k == j:
            continue
        term = 1 / (xs[j] - xk)
        for m, xm in enumerate(xs):
            if m not in (j, k):
                term *= (t - xm) / (xs[j] - xm)
        der += term
    return val, der


@pytest.mark.parametrize("P,Q", [(2, 3), (4, 5), (7, 7), (9, 12)])
def test_lagrange_correctly_rounded(P, Q):
    x = gll(P)[0]
    y = gauss(Q)[0]
    B, D = lagrange_matrices(x, y)
    assert B.shape == D.shape == (Q, P)
    for q in range(Q):
        for j in range(P):
            vb, vd = lagrange_exact(x.tolist(), y[q], j)
            assert B[q, j] == float(vb) + 0.0 and D[q, j] == float(vd) + 0.0


@pytest.mark.parametrize("P", [2, 3, 6, 11, 20])
def test_lagrange_reproduces_polynomials(P):
    x = gll(P)[0]
    y = np.concatenate([gauss(P + 2)[0], [-1.0, 0.3, 1.0]])
    B, D = lagrange_matrices(x, y)
    assert np.array_equal(lagrange_matrices(x, x)[0], np.eye(P))  # at the nodes: the identity, exactly
    p = P - 1
    for k in range(P):  # degree <= p is reproduced, value and derivative
        f = x**k
        assert np.max(np.abs(B @ f - y**k)) <= 64 * P * 2.0**-52
        df = k * y ** (k - 1) if k else np.zeros_like(y)
        assert np.max(np.abs(D @ f - df)) <= 64 * P**3 * 2.0**-52
    # degree p + 1 is not: the test can fail
    assert np.max(np.abs(B @ x ** (p + 1) - y ** (p + 1))) > 1e-6


def test_lagrange_bad_input():
    with pytest.raises(ValueError, match="distinct"):
        lagrange_matrices([0.0, 0.0, 1.0], [0.5])
    with pytest.raises(ValueError, match="finite"):
        lagrange_matrices([0.0, 1.0], [np.nan])
    with pytest.raises(ValueError, match="non-empty"):
        lagrange_matrices([], [0.5])
