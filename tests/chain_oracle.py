"""Hand-written oracles for chain planning and chained mode products (Python ints and Fractions only).

Nothing here calls the planner, the encoder or the residue arithmetic of
``rnstensor``: the row encoding of [2610.05059] Alg. 5, the effective operators
of Sec. 5.2, DropPlan (Alg. 2), the method planners (Alg. 3, 6, 8, 9) and the
true value of a chain are written out again from the paper's text.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

# ----- float64 values as exact dyadic rationals --------------------------------------------


def dyadic(x: float) -> tuple[int, int]:
    """``x == num / 2**t`` exactly (``t >= 0``, any sign of ``num``)."""
    num, den = float(x).as_integer_ratio()
    t = den.bit_length() - 1
    assert den == 1 << t
    return num, t


def rne_shift(num: int, sh: int) -> int:
    """``round_half_even(num / 2**sh)`` for ``sh >= 0``, integer arithmetic only."""
    if sh <= 0:
        return num << -sh
    q, r = divmod(num, 1 << sh)  # floor division: 0 <= r < 2**sh
    half = 1 << (sh - 1)
    if r > half or (r == half and q & 1):
        q += 1
    return q


def frexp_exponent(num: int, t: int) -> int:
    """``E`` with ``2**(E-1) <= |num / 2**t| < 2**E`` (``num != 0``)."""
    return abs(num).bit_length() - t


# ----- effective operators and row sums ([2610.05059] Sec. 5.2, Alg. 5 on rows) ---------------


def encode_rows(rows: Sequence[Sequence[tuple[int, int]]], b: int) -> tuple[list[list[int]], list[int]]:
    """Row encoding at ``b`` bits: per row ``e = b - E``, ints = rne(x * 2**e).

    An all-zero row encodes as zeros. Alg. 5 gives it the exponent 0; its
    value does not matter for the integers, but it becomes a pending scale of
    the axis, so the chain gives it the largest exponent of the other rows
    (the smallest scale), never the one that would dominate a later folding.
    """
    ints, exps = [], []
    for row in rows:
        nz = [(n, t) for n, t in row if n != 0]
        if not nz:
            ints.append([0] * len(row))
            exps.append(None)
            continue
        E = max(frexp_exponent(n, t) for n, t in nz)
        e = b - E
        ints.append([rne_shift(n, t - e) for n, t in row])
        exps.append(e)
    known = [e for e in exps if e is not None]
    fill = max(known) if known else 0
    return ints, [fill if e is None else e for e in exps]


def effective_rhos(operators: Sequence[np.ndarray], axes: Sequence[int], b: int) -> list[int]:
    """``rho_i(b)`` of the integer operators a persistent chain executes at ``b`` bits.

    A revisited axis carries the pending row scales ``2**-f`` of the previous
    operator on it; they are folded into the new operator's columns, relative
    to their maximum (a common power of two does not change a row encoding).
    """
    pending: dict[int, list[int]] = {}
    rhos = []
    for A, ax in zip(operators, axes):
        A = np.asarray(A, dtype=np.float64)
        pend = pending.get(ax)
        rows = []
        for j in range(A.shape[0]):
            row = []
            for k in range(A.shape[1]):
                n, t = dyadic(A[j, k])
                if pend is not None:
                    t -= pend[k] - max(pend)  # times 2**(pend_k - c), c = max(pend)
                row.append((n, t))
            rows.append(row)
        ints, exps = encode_rows(rows, b)
        pending[ax] = [-e for e in exps]
        rhos.append(max(sum(abs(v) for v in r) for r in ints))
    return rhos


def first_visit_rho(A: np.ndarray, b: int) -> int:
    """``rho(b)`` of one operator encoded on its own (Composed; the first product of a chain)."""
    A = np.asarray(A, dtype=np.float64)
    ints, _ = encode_rows([[dyadic(x) for x in row] for row in A], b)
    return max(sum(abs(v) for v in r) for r in ints)


# ----- DropPlan (Alg. 2) and the method planners -----------------------------------------------


def alg2(b: int, rhos: Sequence[int], moduli: Sequence[int], tau: int, start: Optional[int] = None):
    """[2610.05059] Alg. 2, line by line: drop counts, or ``None`` for ⊥."""
    full = sorted(int(p) for p in moduli)
    P = math.prod(full)
    B = (1 << b) if start is None else start
    L = list(full)
    PL = P
    d = len(rhos)
    g = []
    for i in range(1, d + 1):
        B = B * rhos[i - 1]
        if 2 * B >= PL:
            return None
        gi = 0
        if i < d:
            while len(L) > 1 and B // min(L) >= (1 << b):
                q = min(L)
                B2 = B // q + 1
                assert PL % q == 0
                if 2 * B2 >= PL // q:
                    return None
                L.remove(q)
                PL //= q
                B = B2
                gi += 1
            if tau == 1:
                L = list(full)
                PL = P
        g.append(gi)
    return tuple(g)


def alg2_trace(b: int, rhos: Sequence[int], moduli: Sequence[int], tau: int):
    """Alg. 2 with the bounds: per step ``(before, product, drops, after, P_L at the product, P_L after)``."""
    full = sorted(int(p) for p in moduli)
    P = math.prod(full)
    B, L, PL, d, out = 1 << b, list(full), P, len(rhos), []
    for i in range(d):
        before = B
        B *= rhos[i]
        assert 2 * B < PL
        prod, pl_prod, gi = B, PL, 0
        if i < d - 1:
            while len(L) > 1 and B // min(L) >= (1 << b):
                q = min(L)
                B2 = B // q + 1
                assert 2 * B2 < PL // q
                L.remove(q)
                PL //= q
                B = B2
                gi += 1
        out.append((before, prod, gi, B, pl_prod, PL))
        if tau == 1:
            L, PL = list(full), P
    return out


def hand_plan(method: str, operators, axes, moduli: Sequence[int], rho_cache: Optional[dict] = None):
    """``(b, drops)`` of [2610.05059] Alg. 3 (rescale_be), 9 (rescale), 8 (norescale), 6 (composed)."""
    P = math.prod(int(p) for p in moduli)
    cache = {} if rho_cache is None else rho_cache
    d = len(operators)
    for b in range(53, 0, -1):
        if method == "composed":
            n = max(np.asarray(A).shape[1] for A in operators)
            if n * (1 << (2 * b)) < Fraction(P, 2):
                return b, (0,) * d
            continue
        if b not in cache:
            cache[b] = effective_rhos(operators, axes, b)
        rhos = cache[b]
        if method == "norescale":
            B, ok = 1 << b, 2 * (1 << b) < P
            for r in rhos:
                B *= r
                ok = ok and 2 * B < P
            if ok:
                return b, (0,) * d
            continue
        g = alg2(b, rhos, moduli, 1 if method == "rescale_be" else 0)
        if g is not None:
            return b, g
    return None


# ----- the true value of a chain --------------------------------------------------------------


def fraction_chain(x, operators, axes, ndim: Optional[int] = None) -> np.ndarray:
    """``A_d ×_{m_d} (... (A_1 ×_{m_1} x))`` with one Fraction per entry and explicit loops (tiny inputs)."""
    x = np.asarray(x, dtype=np.float64)
    if ndim is None:
        ndim = max(axes) + 1
    batch = x.ndim - ndim
    v = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(x.shape):
        v[idx] = Fraction(float(x[idx]))
    for A, ax in zip(operators, axes):
        a = batch + (ax % ndim)
        A = np.asarray(A, dtype=np.float64)
        vm = np.moveaxis(v, a, -1)
        out = np.empty(vm.shape[:-1] + (A.shape[0],), dtype=object)
        for idx in np.ndindex(vm.shape[:-1]):
            fiber = vm[idx]
            for j in range(A.shape[0]):
                out[idx + (j,)] = sum((Fraction(float(A[j, k])) * fiber[k] for k in range(A.shape[1])), Fraction(0))
        v = np.moveaxis(out, -1, a)
    return v


def max_abs_error(y: np.ndarray, exact) -> Fraction:
    """``max |y - exact|`` exactly; ``exact`` an object array of Fractions (or ints)."""
    y = np.asarray(y, dtype=np.float64)
    assert np.isfinite(y).all()
    return max((abs(Fraction(float(y[i])) - Fraction(exact[i])) for i in np.ndindex(y.shape)), default=Fraction(0))


def scaled_exact(ints: np.ndarray, k: int) -> np.ndarray:
    """An object array of Fractions ``ints * 2**k``."""
    s = Fraction(2) ** k
    out = np.empty(np.shape(ints), dtype=object)
    for i in np.ndindex(out.shape):
        out[i] = int(ints[i]) * s
    return out
