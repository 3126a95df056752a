"""DropPlan (papers/002 Alg. 2) and the step-by-step bound simulation behind every plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..basis import Basis, log2_int

__all__ = ["drop_plan", "simulate", "StepBounds", "Trace", "log2_steps"]


def drop_plan(bits: int, rhos: Sequence[int], basis: Basis, restore: bool) -> Optional[tuple[int, ...]]:
    """Alg. 2: how many moduli to drop after each product, or ``None`` if a range check fails.

    Starts from ``B = 2**bits``; each product multiplies ``B`` by ``rho_i`` and
    needs ``2B < P_L``. After every non-final product the smallest available
    modulus ``q`` is dropped while ``B // q >= 2**bits`` and more than one
    modulus remains, each time checking ``2(B // q + 1) < P_L / q`` before
    accepting ``B <- B // q + 1``. ``restore`` (τ = 1) assumes base extension
    gives back the whole basis before the next product.

    Examples
    --------
    >>> drop_plan(4, [3, 2], Basis((7, 5, 3)), restore=True)  # 48 // 3 = 16 >= 2**4: drop 3, B = 17
    (1, 0)
    >>> drop_plan(2, [7, 7], Basis((7, 5, 3)), restore=True) is None  # 2 * 10 * 7 >= 105
    True
    """
    trace = simulate(bits, rhos, basis, restore, None)
    if trace.failure is not None:
        return None
    return tuple(s.drops for s in trace.steps)


@dataclass(frozen=True)
class StepBounds:
    """The bounds around one product of a plan (the data of papers/002 Fig. 3).

    ``before``: bound entering the product; ``product``: after it;
    ``after``: after the drops; ``drops``: how many; ``range_product`` /
    ``range_after``: product of the moduli available at the product / after
    the drops (before any extension).
    """

    before: int
    product: int
    drops: int
    after: int
    range_product: int
    range_after: int
    dropped: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """The outcome of :func:`simulate`: the steps that passed, and the first failed check if any.

    ``failure`` is ``(step, what, need, have)``: the 0-based product index, a
    word for the check (``'product'`` or ``'drop'``) and the log2 of the range
    needed (``2B``) and available (``P_L``).
    """

    steps: list
    failure: Optional[tuple[int, str, float, float]] = None


def simulate(
    bits: int,
    rhos: Sequence[int],
    basis: Basis,
    restore: bool,
    drops: Optional[Sequence] = None,
    start: Optional[int] = None,
) -> Trace:
    """Run the bound recurrence of a chain; ``drops=None`` chooses them greedily (Alg. 2).

    With given ``drops`` (per product: a count of smallest moduli, or a tuple
    of moduli in drop order) it checks that schedule instead. Stops at the
    first failed range check. ``start`` overrides the initial bound ``2**bits``.
    """
    B = (1 << bits) if start is None else int(start)
    threshold = 1 << bits
    full = sorted(basis.moduli)
    avail = list(full)
    P = basis.product
    PL = P
    d = len(rhos)
    out: list[StepBounds] = []
    for i, rho in enumerate(rhos):
        before = B
        B = B * int(rho)
        if 2 * B >= PL:
            return Trace(out, (i, "product", log2_int(2 * B), log2_int(PL)))
        prod_bound, range_prod = B, PL
        dropped: list[int] = []
        if i < d - 1:
            if drops is None:
                order = None  # greedy: decided one modulus at a time
            elif isinstance(drops[i], (int, np.integer)):
                order = avail[: int(drops[i])] if int(drops[i]) < len(avail) else None
                if order is None:
                    return Trace(out, (i, "drop", float("inf"), log2_int(PL)))
            else:
                order = [int(q) for q in drops[i]]
                if any(q not in avail for q in order) or len(set(order)) != len(order) or len(order) >= len(avail):
                    return Trace(out, (i, "drop", float("inf"), log2_int(PL)))
            k = 0
            while True:
                if order is None:
                    if len(avail) == 1 or B // avail[0] < threshold:
                        break
                    q = avail[0]
                else:
                    if k == len(order):
                        break
                    q = order[k]
                k += 1
                nb = B // q + 1
                if 2 * nb >= PL // q:
                    return Trace(out, (i, "drop", log2_int(2 * nb), log2_int(PL // q)))
                avail.remove(q)
                PL //= q
                B = nb
                dropped.append(q)
        out.append(StepBounds(before, prod_bound, len(dropped), B, range_prod, PL, tuple(dropped)))
        if restore:
            avail, PL = list(full), P
    return Trace(out)


def log2_steps(steps: Sequence[StepBounds]) -> list[tuple[float, float, int, float, float]]:
    """``(log2 before, log2 product, drops, log2 after, log2 range)`` per step, for tables."""
    return [
        (log2_int(s.before), log2_int(s.product), s.drops, log2_int(s.after), log2_int(s.range_product) - 1)
        for s in steps
    ]
