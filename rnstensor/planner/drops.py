"""DropPlan (papers/002 Alg. 2) and the step-by-step bound simulation behind every plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

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
    >>> drop_plan(4, [3, 2], Basis((7, 5, 3)), restore=True)
    (0, 0)
    >>> drop_plan(2, [7, 7], Basis((7, 5, 3)), restore=True)
    (1, 0)
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
    drops: Optional[Sequence[int]],
    start: Optional[int] = None,
) -> Trace:
    """Run the bound recurrence of a chain; ``drops=None`` chooses them greedily (Alg. 2).

    With given ``drops`` it checks that schedule instead (a count the range
    does not allow fails as a ``'drop'`` check). Stops at the first failed
    range check. ``start`` overrides the initial bound ``2**bits``.
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
        g, dropped = 0, []
        if i < d - 1:
            want = None if drops is None else int(drops[i])
            while (B // avail[0] >= threshold if want is None else g < want):
                if len(avail) == 1:
                    if want is None:
                        break
                    return Trace(out, (i, "drop", float("inf"), log2_int(PL)))
                q = avail[0]
                nb = B // q + 1
                if 2 * nb >= PL // q:
                    return Trace(out, (i, "drop", log2_int(2 * nb), log2_int(PL // q)))
                avail.pop(0)
                PL //= q
                B = nb
                g += 1
                dropped.append(q)
        out.append(StepBounds(before, prod_bound, g, B, range_prod, PL, tuple(dropped)))
        if restore:
            avail, PL = list(full), P
    return Trace(out)


def log2_steps(steps: Sequence[StepBounds]) -> list[tuple[float, float, int, float, float]]:
    """``(log2 before, log2 product, drops, log2 after, log2 range)`` per step, for tables."""
    return [
        (log2_int(s.before), log2_int(s.product), s.drops, log2_int(s.after), log2_int(s.range_product) - 1)
        for s in steps
    ]
