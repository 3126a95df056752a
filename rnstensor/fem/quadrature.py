"""1-D Gauss and Gauss-Lobatto-Legendre rules and Lagrange matrices, correctly rounded to float64."""

from __future__ import annotations

import math
import operator
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

import numpy as np

__all__ = ["gauss", "gll", "lagrange_matrices", "MAX_POINTS"]

#: the largest rule offered (the tests check every n up to 20)
MAX_POINTS = 64

_DIGITS = 60  # decimal working precision: ~2^-199, far below half an ulp of every node and weight


def _check_n(n, lo: int, name: str) -> int:
    try:
        k = operator.index(n)
    except TypeError:
        raise TypeError(f"{name}: n must be an integer number of points; got {type(n).__name__}") from None
    if not lo <= k <= MAX_POINTS:
        raise ValueError(f"{name}: n={n} is out of range; use {lo} <= n <= {MAX_POINTS} points")
    return k


def _legendre(n: int, x):
    """``(P_n(x), P_n'(x))`` by the three-term recurrence (works for float and Decimal ``x``)."""
    p0, p1 = x * 0 + 1, x
    if n == 0:
        return p0, x * 0
    for k in range(2, n + 1):
        p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
    # (1 - x^2) P_n' = n (P_{n-1} - x P_n); callers never evaluate at x = +-1
    return p1, n * (p0 - x * p1) / (1 - x * x)


def _newton(f, guesses):
    """Refine each guess of a simple root of ``f(x) -> (value, slope)``: float64 first, then decimal."""
    roots = []
    for g in guesses:
        x = float(g)
        for _ in range(100):
            v, d = f(x)
            step = v / d
            x -= step
            if abs(step) <= 1e-15 * max(abs(x), 1e-3):
                break
        with localcontext() as ctx:
            ctx.prec = _DIGITS
            xd = Decimal(x)
            for _ in range(8):  # quadratic convergence: 1e-15 -> 1e-30 -> 1e-60
                v, d = f(xd)
                step = v / d
                xd -= step
                if step == 0 or abs(step) < Decimal(10) ** (-_DIGITS + 5):
                    break
        roots.append(xd)
    return roots


def _finish(nodes, weights):
    """Round the decimal rule to float64 (correctly rounded), symmetric by construction."""
    x = np.array([float(v) for v in nodes])
    w = np.array([float(v) for v in weights])
    if not (np.all(np.diff(x) > 0) and np.all(w > 0)):  # pragma: no cover - a failed Newton run
        raise RuntimeError("quadrature: Newton iteration did not separate the nodes")
    return x, w


@lru_cache(maxsize=None)
def _gauss_rule(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if n == 1:
        return (0.0,), (2.0,)
    m = n // 2  # roots in (0, 1), the others by symmetry
    guesses = [math.cos(math.pi * (i + 0.75) / (n + 0.5)) for i in range(m)]
    pos = _newton(lambda t: _legendre(n, t), guesses)
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        wpos = [2 / ((1 - t * t) * _legendre(n, t)[1] ** 2) for t in pos]
        nodes = [-t for t in pos] + ([Decimal(0)] if n % 2 else []) + pos[::-1]
        wmid = [2 / _legendre(n, Decimal(0))[1] ** 2] if n % 2 else []
        weights = wpos + wmid + wpos[::-1]
    x, w = _finish(nodes, weights)
    return tuple(x.tolist()), tuple(w.tolist())


def _dlegendre(N: int, x):
    """``(P_N'(x), P_N''(x))``, from Legendre's equation ``(1-x^2) P'' = 2x P' - N(N+1) P``."""
    p, dp = _legendre(N, x)
    return dp, (2 * x * dp - N * (N + 1) * p) / (1 - x * x)


@lru_cache(maxsize=None)
def _gll_rule(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    N = n - 1  # interior nodes are the roots of P_N'
    m = (n - 2) // 2
    guesses = [math.cos(math.pi * (i + 1) / N) * (1 - 3 / (8 * N * N)) for i in range(m)]
    pos = _newton(lambda t: _dlegendre(N, t), guesses)
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        c = Decimal(2) / (N * (N + 1))
        wpos = [c / _legendre(N, t)[0] ** 2 for t in pos]
        mid = [Decimal(0)] if (n - 2) % 2 else []
        wmid = [c / _legendre(N, Decimal(0))[0] ** 2] if mid else []
        nodes = [Decimal(-1)] + [-t for t in pos] + mid + pos[::-1] + [Decimal(1)]
        weights = [c] + wpos + wmid + wpos[::-1] + [c]
    x, w = _finish(nodes, weights)
    return tuple(x.tolist()), tuple(w.tolist())


def gauss(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on ``[-1, 1]``, exact for polynomials of degree ``<= 2n - 1``.

    Every node and weight is the float64 nearest to the true value: Newton
    on the Legendre recurrence in float64, finished in 60-digit decimal
    arithmetic, rounded once.

    Parameters
    ----------
    n : int
        Number of points, ``1 <= n <= 64``.

    Returns
    -------
    (x, w) : tuple of ndarray
        Ascending nodes and their weights (new arrays on every call).

    Examples
    --------
    >>> from rnstensor.fem import gauss
    >>> x, w = gauss(3)
    >>> x.tolist(), w.tolist()  # -sqrt(3/5), 0, sqrt(3/5); 5/9, 8/9, 5/9
    ([-0.7745966692414834, 0.0, 0.7745966692414834], [0.5555555555555556, 0.8888888888888888, 0.5555555555555556])
    """
    x, w = _gauss_rule(_check_n(n, 1, "gauss"))
    return np.array(x), np.array(w)


def gll(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Lobatto-Legendre nodes (``±1`` included) and weights, exact for degree ``<= 2n - 3``.

    Interior nodes are the roots of ``P'_{n-1}``; weights
    ``2 / (n (n-1) P_{n-1}(x)^2)``. Correctly rounded like :func:`gauss`.

    Parameters
    ----------
    n : int
        Number of points, ``2 <= n <= 64``.

    Returns
    -------
    (x, w) : tuple of ndarray
        Ascending nodes and their weights (new arrays on every call).

    Examples
    --------
    >>> from rnstensor.fem import gll
    >>> x, w = gll(3)
    >>> x.tolist(), w.tolist()
    ([-1.0, 0.0, 1.0], [0.3333333333333333, 1.3333333333333333, 0.3333333333333333])
    """
    x, w = _gll_rule(_check_n(n, 2, "gll"))
    return np.array(x), np.array(w)


def _as_ints(values, shift: int) -> list[int]:
    out = []
    for v in values:
        f = Fraction(float(v)) * 2**shift
        if f.denominator != 1:
            raise ValueError("lagrange_matrices: a node or point is too small for the exact evaluation")
        out.append(int(f))
    return out


@lru_cache(maxsize=256)
def _lagrange_cached(nodes: tuple[float, ...], points: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    # every float64 of magnitude >= 2**-100 is an integer multiple of 2**-152: work in exact integers
    S = 160
    X = _as_ints(nodes, S)
    Y = _as_ints(points, S)
    P, Q = len(X), len(Y)
    B = np.empty((Q, P))
    D = np.empty((Q, P))
    dens = []
    for j in range(P):
        d = 1
        for m in range(P):
            if m != j:
                d *= X[j] - X[m]
        dens.append(d)
    for q, y in enumerate(Y):
        diff = [y - x for x in X]
        # prefix/suffix products: prod_{m != j} diff[m] and the sum over k != j of prod_{m != j, k} diff[m]
        pre = [1] * (P + 1)
        for m in range(P):
            pre[m + 1] = pre[m] * diff[m]
        suf = [1] * (P + 1)
        for m in range(P - 1, -1, -1):
            suf[m] = suf[m + 1] * diff[m]
        for j in range(P):
            num = pre[j] * suf[j + 1]
            dnum = 0
            for k in range(P):
                if k == j:
                    continue
                a, b = min(j, k), max(j, k)
                # product of diff over m not in {j, k}
                part = pre[a]
                for m in range(a + 1, b):
                    part *= diff[m]
                dnum += part * suf[b + 1]
            # B = num / den exactly; D carries one power of 2**S less: dnum * 2**S / den
            B[q, j] = num / dens[j] + 0.0  # int / int: correctly rounded in Python (+0.0: no -0.0)
            D[q, j] = (dnum << S) / dens[j] + 0.0
    B.setflags(write=False)
    D.setflags(write=False)
    return B, D


def lagrange_matrices(nodes, points) -> tuple[np.ndarray, np.ndarray]:
    """Interpolation ``B[q, j] = l_j(y_q)`` and derivative ``D[q, j] = l_j'(y_q)`` of the Lagrange basis.

    ``l_j`` is the Lagrange polynomial of the (distinct) float64 ``nodes``;
    both matrices are evaluated exactly in integer arithmetic and rounded
    once, so every entry is the float64 nearest to the true value for the
    given nodes.

    Parameters
    ----------
    nodes : array_like, shape (P,)
        Distinct interpolation nodes (e.g. ``gll(P)[0]``), each 0 or of magnitude ``>= 2**-100``.
    points : array_like, shape (Q,)
        Evaluation points (e.g. ``gauss(Q)[0]``), likewise.

    Returns
    -------
    (B, D) : tuple of ndarray, shape (Q, P)
        Read-only arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.fem import gll, lagrange_matrices
    >>> B, D = lagrange_matrices(gll(3)[0], np.array([-1.0, 0.5]))
    >>> B.tolist(), D.tolist()
    ([[1.0, 0.0, 0.0], [-0.125, 0.75, 0.375]], [[-1.5, 2.0, -0.5], [0.0, -1.0, 1.0]])
    """
    x = np.asarray(nodes, dtype=np.float64).reshape(-1)
    y = np.asarray(points, dtype=np.float64).reshape(-1)
    if x.size < 1 or y.size < 1:
        raise ValueError(f"lagrange_matrices: nodes and points must be non-empty; got {x.size} nodes, {y.size} points")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("lagrange_matrices: nodes and points must be finite")
    if np.unique(x).size != x.size:
        raise ValueError("lagrange_matrices: nodes must be distinct (a repeated node has no Lagrange basis)")
    small = lambda a: (a != 0) & (np.abs(a) < 2.0**-100)
    if small(x).any() or small(y).any() or np.abs(x).max() > 2.0**100 or np.abs(y).max() > 2.0**100:
        raise ValueError("lagrange_matrices: nodes and points must be 0 or of magnitude in [2**-100, 2**100]")
    return _lagrange_cached(tuple(x.tolist()), tuple(y.tolist()))
