"""DropPlan ([2610.05059] Alg. 2) and the bound recurrence of a chain: its residue program, planned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..basis import Basis, log2_int
from .. import ir

__all__ = ["drop_plan", "simulate", "chain_program", "axis_labels", "ROW", "StepBounds", "Trace", "log2_steps"]


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
    """The bounds around one product of a plan (the data of [2610.05059] Fig. 3).

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
    """The outcome of :func:`simulate`: the steps that passed, the first failed check if any, the planned program.

    ``failure`` is ``(step, what, need, have)``: the 0-based product index, a
    word for the check (``'product'`` or ``'drop'``) and the log2 of the range
    needed (``2B``) and available (``P_L``).
    """

    steps: list
    failure: Optional[tuple[int, str, float, float]] = None
    program: object = None


#: the label of an operator's row index in a chain program (the product puts it where the contracted index was)
ROW = "\x02"


def axis_labels(ndim: int) -> str:
    """Labels of a chain program's values: the batch, then one per tensor axis."""
    return "z" + "".join(chr(0x100 + a) for a in range(ndim))


def chain_program(rhos: Sequence[int], basis: Basis, start: int, restore: bool, labels: Optional[str] = None,
                  axes: Optional[Sequence[int]] = None, bits: int = 0, composed: bool = False) -> "ir.Program":
    """A persistent chain as a residue program to be planned: the input (bound ``start``), then per product its
    operator (constant ``k``, growth ``rhos[k]``), the product, and a drop point after every product but the last
    (restoring the basis when ``restore``). With ``labels`` and ``axes`` (one tensor axis per product) the steps
    name the chain's axes, and a revisited axis is folded before its product (what :class:`~rnstensor.ChainPlan`
    runs); without them the labels are placeholders (planning only). ``composed``: every product encodes its
    input afresh, one exponent per fiber along its axis (the first from the input, the rest re-encoded from the
    previous product's fp64 decode), and nothing is dropped."""
    d = len(rhos)
    labels = labels or "z?"
    axes = list(axes) if axes is not None else [0] * d
    steps: list = []
    seen: set = set()
    for k in range(d):
        C = labels[1 + axes[k]]
        if composed:
            shared = (1 + axes[k],)
            steps.append(ir.Encode(0, 0, bits, shared, labels, 1 << bits) if k == 0
                         else ir.Reencode(0, 0, bits, shared, labels, 1 << bits))
        elif k == 0:
            steps.append(ir.Encode(0, 0, bits, tuple(range(1, len(labels))), labels, int(start)))
        if axes[k] in seen and not composed:  # the previous product's row scales, folded into this operator
            steps.append(ir.Fold(0, 0, C))
        seen.add(axes[k])
        steps.append(ir.Encode(1, k, bits, (1,), ROW + C, 0, constant=True))
        steps.append(ir.Contract(0, 0, 1, labels, ROW + C, "", "", C, "", labels.replace(C, ""), ROW, "mode", labels, 0))
        if k < d - 1 and not composed:
            steps.append(ir.Drop(0, 0, None, bool(restore), 0, group=k))
    return ir.Program(basis, tuple(steps), 0, labels)


def simulate(
    bits: int,
    rhos: Sequence[int],
    basis: Basis,
    restore: bool,
    drops: Optional[Sequence] = None,
    start: Optional[int] = None,
    program: Optional["ir.Program"] = None,
) -> Trace:
    """Run the bound recurrence of a chain; ``drops=None`` chooses them greedily (Alg. 2).

    With given ``drops`` (per product: a count of smallest moduli, or a tuple
    of moduli in drop order) it checks that schedule instead. Stops at the
    first failed range check (the trace then holds no steps). ``start``
    overrides the initial bound ``2**bits``.
    The chain's ``program`` (default: :func:`chain_program` of the growths) is
    planned by :func:`rnstensor.planner.program.plan_drops`; the trace's
    :attr:`Trace.program` is the planned one.
    """
    from .program import Failure, Given, Greedy, plan_drops

    B = (1 << bits) if start is None else int(start)
    program = program if program is not None else chain_program(rhos, basis, B, restore)
    policy = Greedy(1 << bits) if drops is None else Given(drops)
    planned = plan_drops(program, dict(enumerate(int(r) for r in rhos)), policy)
    if isinstance(planned, Failure):
        return Trace([], (planned.index, planned.what, planned.need, planned.have))
    out = []
    for k, (before, prod, rng) in enumerate(planned.products):
        g = planned.groups[k] if k < len(planned.groups) else None
        if g is None:
            out.append(StepBounds(before, prod, 0, prod, rng, rng, ()))
        else:
            out.append(StepBounds(before, prod, len(g.dropped), g.after[0], rng, g.range_after, g.dropped))
    return Trace(out, None, planned.program)


def log2_steps(steps: Sequence[StepBounds]) -> list[tuple[float, float, int, float, float]]:
    """``(log2 before, log2 product, drops, log2 after, log2 range)`` per step, for tables."""
    return [
        (log2_int(s.before), log2_int(s.product), s.drops, log2_int(s.after), log2_int(s.range_product) - 1)
        for s in steps
    ]
