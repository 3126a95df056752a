"""The drop schedules that minimise a chain's error bound, and the smallest drops that make room.

The bound itself is the error analysis of :mod:`rnstensor.program.errors`
(:func:`~rnstensor.program.errors.persistent_coefficients`, re-exported here):
all quantities exact rationals (``fractions.Fraction``), rounded up once when
a bound becomes a float. Norms are max-norms of tensors and induced row-sum
norms of operators, which bound a mode product along any axis.

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
decode (MRC digits, double-double Horner, scaling) is faithful and errs by at
most ``u (1 + 2**-40) B s`` for the final bound ``B`` and unit ``s`` (see
:func:`decode_factor`); the exact decode by ``u B s``; both plus ``2**-1074``
for a subnormal result.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence


from ..basis import Basis
from ..program.errors import (
    SUBNORMAL,
    UNIT_ROUNDOFF,
    Coefficients,
    OperatorNorms,
    composed_bound,
    decode_factor,
    fraction_up,
    operator_norms,
    persistent_coefficients,
)

__all__ = [
    "OperatorNorms",
    "operator_norms",
    "persistent_coefficients",
    "decode_factor",
    "optimal_drops",
    "fraction_up",
    "min_product_subset",
    "composed_bound",
    "Coefficients",
    "UNIT_ROUNDOFF",
    "SUBNORMAL",
]


#: Branch-and-bound nodes :func:`min_product_subset` visits at most: the search is exponential in the number of
#: moduli it may choose from (8 s on 36 moduli unbounded); the best subset found by then is kept.
SUBSET_NODES = 20000


def min_product_subset(avail: Sequence[int], target: int, nodes: Optional[int] = None) -> Optional[tuple[int, ...]]:
    """The subset of ``avail`` (leaving one modulus) with the smallest product ``>= target`` found, ascending.

    Branch and bound over the sorted moduli: the drops that divide a bound by
    just enough (the error-optimal planners of chains and FEM programs). The
    first subset reached is the smallest moduli taken in order; the search
    then improves on it for at most ``nodes`` nodes (default
    :data:`SUBSET_NODES`, read at each call; exact whenever it ends
    sooner, as it does for a few moduli), so every answer is a feasible
    subset and the planners' time stays bounded on 30 to 49 moduli.

    Examples
    --------
    >>> min_product_subset([2, 3, 5, 7], 10)
    (2, 5)
    """
    a = sorted(avail)
    m = len(a)
    suffix = [1] * (m + 1)
    for j in range(m - 1, -1, -1):
        suffix[j] = suffix[j + 1] * a[j]
    best: list = [None, None]
    left = [int(SUBSET_NODES if nodes is None else nodes)]

    def dfs(idx: int, prod: int, chosen: list):
        left[0] -= 1
        if prod >= target:
            if best[0] is None or prod < best[0]:
                best[:] = [prod, tuple(chosen)]
            return
        if len(chosen) >= m - 1 or (left[0] <= 0 and best[0] is not None):
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

    The score uses the ``'exact'`` decode term by default (the fp64 decode's
    own term is that one times ``1 + 2**-40``): a decode term grows with the
    final range bound and would favour one large late drop — which in practice costs far more
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
