"""Planning a residue program: exact bounds through its steps, and the moduli dropped at its drop points.

The planner is an interpreter of :mod:`rnstensor.program`: it walks a
program whose :class:`~rnstensor.ir.Drop` steps are *drop points*
(``moduli=None``), computes every step's bound exactly as the integers can
grow (an input's ``2**b``, a product's ``B * rho`` with the constant's exact
largest row sum, a Hadamard product's ``B * bound(F)``, a sum's ``B_1 + B_2``,
a drop's ``B // q + 1`` per modulus), checks the centered range at every step
(``2 B < P_active``) and asks a *policy* which moduli to drop at each group of
drop points (the inputs of one stage). The result is the planned program,
every bound filled in, and a trace per group; or the first failed check.

Programs whose builders bound their own steps (einsum's, which narrows
widths and drops as it builds; the GEMM's) go through the same interpreter,
which checks every range of them. Policies: :class:`Greedy` (Alg. 2 of
[2610.05059]: the smallest moduli while
the bound stays above ``2**b``), :class:`Given` (a schedule chosen elsewhere:
the error-optimal planner's, NoRescale's none), :class:`JustEnough` (the
subset of moduli with the smallest product that lets the stage's outputs fit:
the FEM operators).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from numbers import Integral
from typing import Callable, Optional, Sequence

from ..basis import Basis, log2_int
from .. import ir
from .bounds import min_product_subset

__all__ = ["fits", "drop_bound", "after_drops", "Failure", "GroupTrace", "Planned", "plan_drops", "Greedy", "Given", "JustEnough"]


def fits(bound: int, product: int) -> bool:
    """The centered range holds integers of magnitude ``bound`` on moduli of product ``product``: ``2 B < P``."""
    return 2 * int(bound) < int(product)


def drop_bound(bound: int, q: int) -> int:
    """The bound of RnsDrop by ``q`` ([2610.05059] Alg. 1): the quotient rounded to nearest, ``B // q + 1``."""
    return int(bound) // int(q) + 1


def after_drops(bound: int, product: int, moduli: Sequence[int]) -> Optional[int]:
    """``bound`` after RnsDrop by each of ``moduli`` in order (:func:`drop_bound`, on a range ``P / q``), or
    ``None`` if a quotient would not fit the moduli left."""
    B, P = int(bound), int(product)
    for q in moduli:
        B, P = drop_bound(B, q), P // q
        if not fits(B, P):
            return None
    return B


@dataclass(frozen=True)
class Failure:
    """The first failed range check: the product or stage (``index``, 0-based), what (``'product'``, ``'drop'``,
    ``'kept'``), and ``log2`` of the range needed and available (or, for ``'kept'``, of the bits kept and wanted)."""

    index: int
    what: str
    need: float
    have: float
    detail: str = ""


@dataclass
class GroupTrace:
    """One group of drop points (a stage): the bounds entering it, the moduli dropped, the range around it."""

    index: int
    before: list  # bounds of its inputs before the drops
    dropped: tuple
    after: list  # ... after them
    range_before: int  # product of the active moduli at the drops
    range_after: int  # ... after them (before any extension)


@dataclass
class Planned:
    """A planned program, the trace of every group, the bounds at every product (``Contract``) in order, and the
    bound of every slot of the program as written (drop points included)."""

    program: ir.Program
    groups: list
    products: list  # (bound entering, bound after, range at the product) per product
    slot_bounds: dict


class Greedy:
    """Alg. 2: after a product, drop the smallest active modulus while ``B // q >= threshold`` and more than one
    modulus is left, each drop's quotient checked against the moduli left."""

    def __init__(self, threshold: int):
        self.threshold = int(threshold)

    def choose(self, k: int, bounds: list, active: tuple, product: int, outputs_fit: Callable):
        (B,) = bounds
        avail, P, out = sorted(active), product, []
        while len(avail) > 1 and B // avail[0] >= self.threshold:
            q = avail.pop(0)
            nb = drop_bound(B, q)
            if not fits(nb, P // q):
                return Failure(k, "drop", log2_int(2 * nb), log2_int(P // q))
            B, P = nb, P // q
            out.append(q)
        return tuple(out)


class Given:
    """A schedule chosen beforehand: per group a count of the smallest active moduli, or the moduli in order."""

    def __init__(self, schedule: Sequence):
        self.schedule = list(schedule)

    def choose(self, k: int, bounds: list, active: tuple, product: int, outputs_fit: Callable):
        want = self.schedule[k] if k < len(self.schedule) else ()
        avail = sorted(active)
        if isinstance(want, Integral):
            if want >= len(avail):
                return Failure(k, "drop", float("inf"), log2_int(product))
            order = tuple(avail[:want])
        else:
            order = tuple(int(q) for q in want)
            if any(q not in avail for q in order) or len(set(order)) != len(order) or len(order) >= len(avail):
                return Failure(k, "drop", float("inf"), log2_int(product))
        for B in bounds:
            b, P = B, product
            for q in order:
                b, P = drop_bound(b, q), P // q
                if not fits(b, P):
                    return Failure(k, "drop", log2_int(2 * b), log2_int(P))
        return order


class JustEnough:
    """The subset of the basis moduli with the smallest product after which every output of the stage fits
    (every input dropped by it); no drop where they fit already. ``threshold``: the fewest bits an input may
    keep after its drops (a ``'kept'`` failure below it)."""

    def __init__(self, basis: Basis, threshold: int):
        self.basis, self.threshold = basis, int(threshold)

    def choose(self, k: int, bounds: list, active: tuple, product: int, outputs_fit: Callable):
        need = outputs_fit(bounds)
        if need is True:
            return ()
        target = -(-2 * need // product)
        while True:
            subset = min_product_subset(self.basis.moduli, target)
            if subset is None:
                return Failure(k, "drop", log2_int(2 * need), log2_int(product),
                               "no drop of the basis moduli makes room for it")
            after = [after_drops(b, product, subset) for b in bounds]
            if all(a is not None for a in after) and outputs_fit(after) is True:
                break
            target = max(target + 1, math.prod(subset) + 1)  # every drop's +1 cost a little: ask for more
        if max(after) < self.threshold:
            return Failure(k, "kept", log2_int(max(after)), log2_int(self.threshold))
        return tuple(subset)


def _operand_bound(st, bounds: dict, consts: dict, growth: dict) -> int:
    """A product's or sum's bound: ``B * rho`` with a constant of known growth, ``B_1 + B_2`` for a sum; where the
    builder bounded a contraction of two values itself (the sizes it sums over are its own), the step's."""
    if isinstance(st, ir.Contract):
        source = consts.get(st.y)
        if source is not None and source in growth:
            return bounds[st.x] * growth[source]
        return st.bound
    if isinstance(st, ir.Add):
        return bounds[st.x] + bounds[st.y]
    return st.bound  # Sum, Contract3M: the builder's bound (checked against the range here)


def plan_drops(program: ir.Program, growth: dict, policy) -> "Planned | Failure":
    """Plan ``program``: fill every bound, choose the moduli at its drop points, check every range.

    ``growth[source]`` is the bound factor of each constant (an operator's
    exact largest integer row sum, a field's ``2**b``). Products and sums
    read their bounds from here; the program's own ``Encode`` bounds are the
    inputs'. A contraction of two values, a sum over indices and an aligned
    RNSTensor operand keep the bounds their builder gave them (einsum's, the
    GEMM's ``k 4**t``): the planner checks that they fit. A drop point's
    ``extend`` restores the basis after its drops (the range of the next
    steps is the whole basis again); without it the moduli stay dropped.
    """
    basis = program.basis
    steps = program.steps
    bounds: dict = {}
    active: dict = {}
    consts: dict = {}
    out_steps: list = []
    groups: list = []
    products: list = []
    i, n_products = 0, 0
    while i < len(steps):
        st = steps[i]
        if isinstance(st, ir.Encode):
            if st.constant:
                consts[st.out] = st.source
            bounds[st.out] = st.bound
            active[st.out] = basis.moduli
            out_steps.append(st)
            i += 1
        elif isinstance(st, ir.Fold):
            bounds[st.out], active[st.out] = bounds[st.x], active[st.x]
            out_steps.append(st)
            i += 1
        elif isinstance(st, ir.Reencode):  # decoded and encoded afresh: the bound of its width, every modulus
            bounds[st.out], active[st.out] = st.bound, basis.moduli
            out_steps.append(st)
            i += 1
        elif isinstance(st, (ir.Operand, ir.Combine)):  # an RNSTensor operand, aligned; a complex combination
            bounds[st.out] = st.bound if isinstance(st, ir.Operand) else bounds[st.x]
            active[st.out] = basis.moduli
            out_steps.append(st)
            i += 1
        elif isinstance(st, ir.Decode):
            out_steps.append(st)
            i += 1
        elif isinstance(st, (ir.Contract, ir.Contract3M, ir.Add, ir.Sum)):
            B = _operand_bound(st, bounds, consts, growth)
            P = math.prod(active[st.x])
            if not fits(B, P):
                return Failure(n_products if isinstance(st, ir.Contract) else max(n_products - 1, 0), "product",
                               log2_int(2 * B), log2_int(P))
            if isinstance(st, (ir.Contract, ir.Contract3M)):
                products.append((bounds[st.x], B, P))
                n_products += 1
            bounds[st.out], active[st.out] = B, active[st.x]
            out_steps.append(replace(st, bound=B))
            i += 1
        elif isinstance(st, ir.Drop):
            if st.moduli is not None:  # a drop already chosen: its bound follows
                order = tuple(st.moduli)
                b = after_drops(bounds[st.x], math.prod(active[st.x]), order)
                if b is None:
                    return Failure(max(n_products - 1, 0), "drop", float("inf"), log2_int(math.prod(active[st.x])))
                bounds[st.out] = b
                rest = tuple(p for p in active[st.x] if p not in order)
                active[st.out] = basis.moduli if st.extend else rest
                out_steps.append(replace(st, bound=b))
                i += 1
                continue
            j = i
            while j < len(steps) and isinstance(steps[j], ir.Drop) and steps[j].moduli is None \
                    and steps[j].group == st.group:
                j += 1
            points = steps[i:j]
            before = [bounds[d.x] for d in points]
            act = active[points[0].x]
            P = math.prod(act)
            stage_end = j
            while stage_end < len(steps) and not (isinstance(steps[stage_end], ir.Drop)):
                stage_end += 1

            def outputs_fit(trial, points=points, j=j, stage_end=stage_end, P=P):
                """``True`` if the stage's products and sums fit with its inputs at ``trial``, else the largest."""
                b = dict(bounds)
                for d, t in zip(points, trial):
                    b[d.out] = t
                worst = 0
                for s in steps[j:stage_end]:
                    if isinstance(s, (ir.Contract, ir.Add)):
                        b[s.out] = _operand_bound(s, b, consts, growth)
                        worst = max(worst, b[s.out])
                    elif isinstance(s, ir.Encode) and s.constant:
                        consts[s.out] = s.source
                return True if fits(worst, P) else worst

            k = len(groups)
            chosen = policy.choose(k, before, act, P, outputs_fit)
            if isinstance(chosen, Failure):
                return chosen
            after = [after_drops(b, P, chosen) for b in before]
            rest = tuple(p for p in act if p not in chosen)
            groups.append(GroupTrace(k, before, tuple(chosen), after, P, math.prod(rest)))
            for d, b in zip(points, after):
                bounds[d.out] = b
                active[d.out] = basis.moduli if (d.extend and chosen) else (rest if chosen else act)
                if chosen:
                    out_steps.append(replace(d, moduli=tuple(chosen), bound=b))
                else:  # nothing to drop: the slot is the input itself
                    bounds[d.out], active[d.out] = bounds[d.x], active[d.x]
                    out_steps.append(_Alias(d.out, d.x))
            i = j
        else:
            out_steps.append(st)
            i += 1
    return Planned(_resolve_aliases(program, out_steps), groups, products, bounds)


@dataclass(frozen=True)
class _Alias:
    """A drop point where nothing was dropped: its slot is its input's (removed by :func:`_resolve_aliases`)."""

    out: int
    x: int


def _resolve_aliases(program: ir.Program, steps: list) -> ir.Program:
    """The planned steps with every empty drop point removed and its slot read as its input's."""
    alias: dict = {}
    out = []
    for st in steps:
        if isinstance(st, _Alias):
            alias[st.out] = alias.get(st.x, st.x)
            continue
        changes = {}
        for name in ("x", "y"):
            v = getattr(st, name, None)
            if v is not None and v in alias:
                changes[name] = alias[v]
        out.append(replace(st, **changes) if changes else st)
    result = alias.get(program.out, program.out)
    return ir.Program(program.basis, tuple(out), result, program.out_labels, program.complex, program.notes,
                      program.kept_bits, program.nslots)
