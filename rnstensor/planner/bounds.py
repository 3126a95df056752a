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
decode (MRC digits, Horner, scaling) errs by at most ``(2k + 3) u B s`` for
the final bound ``B`` and unit ``s``, where ``k`` counts the Horner steps that
can round (see :func:`decode_factor`); the exact decode by ``u B s``; both
plus ``2**-1074`` for a subnormal result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from ..basis import Basis, mrc_order
from .operators import PreparedOperator

__all__ = [
    "OperatorNorms",
    "operator_norms",
    "persistent_coefficients",
    "decode_factor",
    "optimal_drops",
    "fraction_up",
    "min_product_subset",
]

UNIT_ROUNDOFF = Fraction(1, 2**53)
SUBNORMAL = Fraction(1, 2**1074)


def fraction_up(x: Fraction) -> float:
    """The smallest float64 not below ``x``."""
    f = float(x)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def decode_factor(mode: str, moduli: Sequence[int], bound: int) -> Fraction:
    """Decode error per unit of ``bound * s``: ``(2k + 3) u (1 + 2**-40)`` for ``'fp64'``, ``u`` for ``'exact'``.

    Horner on the centered mixed-radix digits (conversion order ``o``, weights
    ``W_j = o_0 ... o_{j-1}``) computes ``V_j = o_j V_{j+1} + d_j`` from the top
    digit down; the exact partial values obey ``|V_j| <= B / W_j + 1/2``, so a
    step is exact (integers below ``2**53``) while ``B / W_j + o_j / 2 <= 2**53``.
    Each of the ``k`` steps past that rounds twice, adding at most
    ``u (2B + W_{j+1})`` with ``W_{j+1} < 2**-44 B`` there; the float factor and
    the product with it add ``2u``. Hence ``(2k + 3) u B`` with a margin.
    """
    if mode == "exact":
        return UNIT_ROUNDOFF
    order = mrc_order(tuple(moduli))
    # B / W_j falls as j rises: the steps that may round are j = 0 .. k-1
    k, W = 0, 1
    for q in order[:-1]:
        if Fraction(int(bound), W) + Fraction(q, 2) <= 2**53:
            break
        k += 1
        W *= q
    return UNIT_ROUNDOFF * (2 * k + 3) * (1 + Fraction(1, 2**40))


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
    final_moduli: Sequence[int],
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
    cunit += decode_factor(mode, final_moduli, final_bound) * final_bound * s_final
    return Coefficients(F[0], cx, cunit)


def composed_bound(
    norms: Sequence[OperatorNorms],
    rhos: Sequence[int],
    bits: int,
    moduli: Sequence[int],
    x_norm: Fraction,
    mode: str,
) -> Fraction:
    """Error bound of the composed method (encode per fiber, decode after every product).

    Product ``i`` holds integers below ``2**bits * rhos[i]`` on the whole basis ``moduli``.
    """
    err = Fraction(0)
    size = x_norm  # bound on the exact intermediate
    tiny = _pow2(-bits)
    last = len(norms) - 1
    for i, nm in enumerate(norms):
        computed = size + err  # bound on the computed intermediate
        encoded = computed * (1 + tiny)
        factor = decode_factor(mode if i == last else "fp64", moduli, (1 << bits) * int(rhos[i]))
        dec = factor * nm.executed * encoded + SUBNORMAL
        err = nm.executed * (err + computed * tiny) + nm.diff * size + dec
        size *= nm.true
    return err


def min_product_subset(avail: Sequence[int], target: int) -> Optional[tuple[int, ...]]:
    """The subset of ``avail`` (leaving one modulus) with the smallest product ``>= target``, ascending.

    Branch and bound over the sorted moduli: the drops that divide a bound by
    just enough (the error-optimal planners of chains and FEM programs).
    """
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


def _lazy_subset(B: int, limit: int, basis: Basis) -> Optional[tuple[int, ...]]:
    """Moduli to drop (restoring the basis afterwards) so that the bound falls to at most ``limit``, dividing least."""
    P = basis.product
    if B <= limit:
        return ()
    if limit < 1:
        return None
    target = -(-B // limit)
    while True:
        subset = min_product_subset(basis.moduli, target)
        if subset is None:
            return None
        b, pl = B, P
        ok = True
        for q in subset:
            b, pl = b // q + 1, pl // q
            if 2 * b >= pl:
                ok = False
                break
        if ok and b <= limit:
            return subset
        target = max(target + 1, math.prod(subset) + 1)  # the +1 of every drop cost a little: ask for more


def _lazy_schedule(start: int, rhos: Sequence[int], basis: Basis):
    """Drop after each product just what the next product needs; ``(drops, final bound)`` or ``None``."""
    P, d = basis.product, len(rhos)
    out: list[tuple[int, ...]] = []
    B = int(start)
    for i in range(d):
        B *= int(rhos[i])
        if 2 * B >= P:
            return None
        if i == d - 1:
            out.append(())
            return out, B
        rho_next = int(rhos[i + 1])
        limit = (P - 1) // (2 * rho_next) if rho_next else B  # largest bound the next product accepts
        subset = _lazy_subset(B, limit, basis)
        if subset is None:
            return None
        for q in subset:
            B = B // q + 1
        out.append(subset)
    return None


def optimal_drops(
    start: int,
    rhos: Sequence[int],
    norms: Sequence[OperatorNorms],
    basis: Basis,
    restore: bool,
    mode: str = "exact",
    extra: int = 1,
    max_sequences: int = 1 << 15,
    extra_candidates: Optional[Sequence[Sequence[Sequence[int]]]] = None,
) -> Optional[list[tuple[int, ...]]]:
    """Moduli to drop after each product so that the drop terms of the error bound are smallest.

    The drop error of a step is about the unit times half the product of the
    dropped moduli, and every later unit carries that product, so the best
    is to divide by as little as the next product allows. With restoration
    (rescale_be) each step drops the subset of moduli with the smallest
    product that lets the next product fit — not necessarily the smallest
    moduli, which divide in coarse steps of ~2^7.8. Without restoration
    (rescale), the counts of smallest moduli from the fewest feasible up to
    ``extra`` more are enumerated. Every schedule is scored by
    :func:`persistent_coefficients` against those in ``extra_candidates``
    (e.g. the greedy one), so the result's bound is never above theirs.
    Returns the dropped moduli per product (the last empty), or ``None`` if
    none pass.

    The score uses the ``'exact'`` decode term by default: the fp64 decode's
    own term (about ``(2k + 3) u`` of the final range bound, ``k`` the Horner
    steps that can round) is a worst case that grows with the final bound and
    would favour one large late drop — which in practice costs far more
    accuracy than it saves, since the integers sit well below their bound by
    then. What the drops control is their own rounding.
    """
    d = len(rhos)
    if restore:
        candidates = [list(c) for c in (extra_candidates or ())]
        lazy = _lazy_schedule(start, rhos, basis)
        if lazy is not None:
            candidates.insert(0, lazy[0])
        best_cost, best_sched = None, None
        for sched in candidates:
            B = int(start)
            for rho, dropped in zip(rhos, sched):
                B *= int(rho)
                for q in dropped:
                    B = B // q + 1
            cost = persistent_coefficients(norms, sched, B, basis.moduli, mode).unit
            if best_cost is None or cost < best_cost:
                best_cost, best_sched = cost, [tuple(x) for x in sched]
        return best_sched

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
            cost = persistent_coefficients(norms, dropped + [()], B, avail, mode).unit
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
    for sched in extra_candidates or ():
        B, avail = int(start), list(full)
        for rho, dropped in zip(rhos, sched):
            B *= int(rho)
            for q in dropped:
                B = B // q + 1
                avail.remove(q)
        cost = persistent_coefficients(norms, sched, B, avail, mode).unit
        if best[0] is None or cost < best[0]:
            best[:] = [cost, [tuple(x) for x in sched]]
    return best[1]
