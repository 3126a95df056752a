"""Rigorous a-priori error bounds of chain plans, and the drop schedule that minimises them.

All quantities are exact rationals (``fractions.Fraction``); a bound is rounded
up once when it becomes a float. Norms are max-norms of tensors and induced
row-sum norms of operators, which bound a mode product along any axis.

The persistent methods compute ``Ŷ = Â_d D_{d-1}(Â_{d-1} ... D_1(Â_1 X̂))``
with ``X̂`` the encoded input, ``Â_i`` the executed operators (the integers
times their exact scales, in the input's units) and ``D_i`` the drops. With
``F_i = prod_{j>i} ||Â_j||`` and ``G_i = prod_{j<i} ||A_j||``::

    ||Ŷ - Y|| <= F_0 ||X̂ - X||                       (input encoding)
               + sum_i F_i ||Â_i - A_i|| G_i ||X||    (operator encoding, telescoped)
               + sum_i F_i δ_i                        (drops after product i)
               + decode error

A drop by ``q`` changes an entry by at most ``floor(q/2)`` units, the unit
being the largest value of one integer step (``2**-e`` times the dropped
moduli so far times the largest pending row scale of each axis). The fp64
decode (MRC digits, Horner, scaling) errs by at most ``(6m + 4) u B s`` for
``m`` moduli, the final bound ``B`` and unit ``s`` (every Horner step rounds a
partial value of magnitude at most ``2B``); the exact decode by ``u B s``;
both plus ``2**-1074`` for a subnormal result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from ..basis import Basis
from .operators import PreparedOperator

__all__ = [
    "OperatorNorms",
    "operator_norms",
    "persistent_coefficients",
    "decode_factor",
    "optimal_drops",
    "fraction_up",
]

UNIT_ROUNDOFF = Fraction(1, 2**53)
SUBNORMAL = Fraction(1, 2**1074)


def fraction_up(x: Fraction) -> float:
    """The smallest float64 not below ``x``."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def decode_factor(mode: str, moduli: int) -> Fraction:
    """Relative decode error per unit of ``B * s``: ``(6m + 4) u`` for ``'fp64'``, ``u`` for ``'exact'``."""
    return UNIT_ROUNDOFF * (6 * moduli + 4 if mode == "fp64" else 1)


def _pow2(k: int) -> Fraction:
    return Fraction(2) ** int(k)


@dataclass(frozen=True)
class OperatorNorms:
    """Exact norms of one step: executed ``||Â||``, true ``||A||``, ``||Â - A||``, and the unit shift.

    ``unit_shift`` is ``max_j(-f_j)``: after the product one integer step is
    worth at most ``2**unit_shift`` times what it was worth before.
    """

    executed: Fraction
    true: Fraction
    diff: Fraction
    unit_shift: int


def operator_norms(op: PreparedOperator, A: np.ndarray) -> OperatorNorms:
    """Norms of the executed operator ``Â[j, k] = ints[j, k] * 2**(-f_j - r_k)`` against the true ``A``."""
    ints, f, r = op.ints, op.row_exponents, op.column_exponents
    col = [_pow2(-int(rk)) for rk in r]
    executed = true = diff = Fraction(0)
    for j in range(ints.shape[0]):
        rs = _pow2(-int(f[j]))
        e_row = a_row = d_row = Fraction(0)
        for k in range(ints.shape[1]):
            ahat = int(ints[j, k]) * rs * col[k]
            a = Fraction(float(A[j, k]))
            e_row += abs(ahat)
            a_row += abs(a)
            d_row += abs(ahat - a)
        executed, true, diff = max(executed, e_row), max(true, a_row), max(diff, d_row)
    shift = int(max(-f)) if f.size else 0
    return OperatorNorms(executed, true, diff, shift)


@dataclass(frozen=True)
class Coefficients:
    """``bound = enc * ||X̂ - X|| + x * ||X|| + unit * 2**-e + 2**-1074`` for an input with exponent ``e``."""

    enc: Fraction
    x: Fraction
    unit: Fraction

    def evaluate(self, enc_error: Fraction, x_norm: Fraction, unit: Fraction) -> Fraction:
        return self.enc * enc_error + self.x * x_norm + self.unit * unit + SUBNORMAL


def _drop_terms(norms: Sequence[OperatorNorms], drops: Sequence[Sequence[int]]) -> tuple[list[Fraction], Fraction]:
    """Per step, the largest change the drops make (in input units, ``s_0 = 1``); and the final unit."""
    s = Fraction(1)
    terms = []
    for nm, dropped in zip(norms, drops):
        s *= _pow2(nm.unit_shift)
        delta = Fraction(0)
        for q in dropped:
            delta += s * (q // 2)
            s *= q
        terms.append(delta)
    return terms, s


def persistent_coefficients(
    norms: Sequence[OperatorNorms],
    dropped: Sequence[Sequence[int]],
    final_bound: int,
    final_moduli: int,
    mode: str,
) -> Coefficients:
    """The error-bound coefficients of a persistent plan (rescale_be, rescale, norescale)."""
    d = len(norms)
    F = [Fraction(1)] * (d + 1)  # F[i] = prod_{j >= i} ||Â_j||, F[d] = 1
    for i in range(d - 1, -1, -1):
        F[i] = F[i + 1] * norms[i].executed
    G = Fraction(1)
    cx = Fraction(0)
    for i, nm in enumerate(norms):
        cx += F[i + 1] * nm.diff * G
        G *= nm.true
    terms, s_final = _drop_terms(norms, dropped)
    cunit = sum((F[i + 1] * t for i, t in enumerate(terms)), Fraction(0))
    cunit += decode_factor(mode, final_moduli) * final_bound * s_final
    return Coefficients(F[0], cx, cunit)


def composed_bound(
    norms: Sequence[OperatorNorms], bits: int, moduli: int, x_norm: Fraction, mode: str
) -> Fraction:
    """Error bound of the composed method (encode per fiber, decode after every product)."""
    err = Fraction(0)
    size = x_norm  # bound on the exact intermediate
    tiny = _pow2(-bits)
    last = len(norms) - 1
    for i, nm in enumerate(norms):
        computed = size + err  # bound on the computed intermediate
        encoded = computed * (1 + tiny)
        dec = decode_factor(mode if i == last else "fp64", moduli) * nm.executed * encoded + SUBNORMAL
        err = nm.executed * (err + computed * tiny) + nm.diff * size + dec
        size *= nm.true
    return err


def _min_product_subset(avail: Sequence[int], target: int) -> Optional[tuple[int, ...]]:
    """The subset of ``avail`` (leaving one modulus) with the smallest product ``>= target``, ascending."""
    a = sorted(avail)
    m = len(a)
    suffix = [1] * (m + 1)
    for j in range(m - 1, -1, -1):
        suffix[j] = suffix[j + 1] * a[j]
    best: list = [None, None]

    def dfs(idx: int, prod: int, chosen: list):
        if prod >= target:
            if best[0] is None or prod < best[0]:
                best[:] = [prod, tuple(chosen)]
            return
        if len(chosen) >= m - 1:
            return
        for j in range(idx, m):
            if prod * suffix[j] < target:
                break  # even every modulus from j on falls short
            if best[0] is not None and prod * a[j] >= best[0]:
                break
            chosen.append(a[j])
            dfs(j + 1, prod * a[j], chosen)
            chosen.pop()

    dfs(0, 1, [])
    return best[1]


def _lazy_subset(B: int, rho_next: int, basis: Basis) -> Optional[tuple[int, ...]]:
    """Moduli to drop after a product (restoring the basis) so that the next product just fits."""
    P = basis.product
    if 2 * B * rho_next < P:
        return ()
    limit = (P - 1) // (2 * rho_next)  # largest bound the next product accepts
    if limit < 1:
        return None
    target = -(-B // limit)
    while True:
        subset = _min_product_subset(basis.moduli, target)
        if subset is None:
            return None
        b, pl = B, P
        ok = True
        for q in subset:
            b, pl = b // q + 1, pl // q
            if 2 * b >= pl:
                ok = False
                break
        if ok and 2 * b * rho_next < P:
            return subset
        target = max(target + 1, math.prod(subset) + 1)  # the +1 of every drop cost a little: ask for more


def optimal_drops(
    start: int,
    rhos: Sequence[int],
    norms: Sequence[OperatorNorms],
    basis: Basis,
    restore: bool,
    mode: str = "fp64",
    extra: int = 1,
    max_sequences: int = 1 << 15,
) -> Optional[list[tuple[int, ...]]]:
    """Moduli to drop after each product so that the drop terms of the error bound are smallest.

    The drop error of a step is about the unit times half the product of the
    dropped moduli, and every later unit carries that product, so the best
    is to divide by as little as the next product allows. With restoration
    (rescale_be) each step drops the subset of moduli with the smallest
    product that lets the next product fit — not necessarily the smallest
    moduli, which divide in coarse steps of ~2^7.8. Without restoration
    (rescale), the counts of smallest moduli from the fewest feasible up to
    ``extra`` more are scored by :func:`persistent_coefficients`. Returns the
    dropped moduli per product (the last empty), or ``None`` if none pass.
    """
    d = len(rhos)
    if restore:
        out: list[tuple[int, ...]] = []
        B = int(start)
        for i in range(d):
            B *= int(rhos[i])
            if 2 * B >= basis.product:
                return None
            if i == d - 1:
                out.append(())
                break
            subset = _lazy_subset(B, int(rhos[i + 1]), basis)
            if subset is None:
                return None
            for q in subset:
                B = B // q + 1
            out.append(subset)
        return out

    full = sorted(basis.moduli)
    best: list = [None, None]
    budget = [max_sequences]

    def visit(i: int, B: int, avail: list, PL: int, dropped: list):
        if budget[0] <= 0:
            return
        B = B * int(rhos[i])
        if 2 * B >= PL:
            return
        if i == d - 1:
            budget[0] -= 1
            cost = persistent_coefficients(norms, dropped + [()], B, len(avail), mode).unit
            if best[0] is None or cost < best[0]:
                best[:] = [cost, dropped + [()]]
            return
        states = []
        b, av, pl, qs = B, list(avail), PL, []
        while True:
            if 2 * b * int(rhos[i + 1]) < pl:
                states.append((b, list(av), pl, tuple(qs)))
                if len(states) > extra:
                    break
            if len(av) <= 1:
                break
            q = av[0]
            nb = b // q + 1
            if 2 * nb >= pl // q:
                break
            av.pop(0)
            pl //= q
            b = nb
            qs.append(q)
        for b2, av2, pl2, qs2 in states:
            visit(i + 1, b2, av2, pl2, dropped + [qs2])

    visit(0, int(start), full, basis.product, [])
    return best[1]
