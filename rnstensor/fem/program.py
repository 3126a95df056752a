"""Operator programs written once, run on bounds (planning), residues (rescale_be) or floats (composed, float64).

A program is a sequence of *stages*. A stage takes the live tensors and
returns new ones, each a sum of *terms* ``(input, operand, axis)``: a mode
product with a 1-D operator along a tensor axis, or (``axis is None``) a
Hadamard product with an encoded per-element field. In the residue domain
every input of a stage is first divided by the same moduli (RnsDrop, then
base extension), so all tensors that meet in a sum carry the same scale.

The planner runs the program on exact integer bounds, computed exactly as the
primitives compute them (encode: ``2**b``; product: ``B * rho``; Hadamard:
``B * F.bound``; sum: bounds add; drop: ``B // q + 1`` per modulus), and
chooses per stage the set of moduli with the smallest product that lets every
output of the stage fit the range. The executed run therefore never raises
:class:`~rnstensor.RNSRangeError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..basis import Basis, log2_int
from ..errors import PlanError
from ..planner.bounds import min_product_subset
from ..program import ir

__all__ = ["Term", "ProgramPlan", "plan_program", "ProgramWriter", "residue_program", "FloatRunner", "mass_program",
           "poisson_program", "voigt_index", "ROW"]

Term = tuple  # (input index, operand key, tensor axis or None)


def voigt_index(i: int, j: int, dim: int) -> int:
    """Position of ``G[i, j]`` in the packed symmetric storage: 3-D ``xx yy zz yz xz xy``, 2-D ``xx yy xy``.

    Examples
    --------
    >>> from rnstensor.fem.program import voigt_index
    >>> [voigt_index(i, j, 3) for i, j in [(0, 0), (2, 2), (2, 1), (0, 2), (1, 0)]], voigt_index(1, 0, 2)
    ([0, 2, 3, 4, 5], 2)
    """
    if i == j:
        return i
    if dim == 2:
        return 2
    return {frozenset((1, 2)): 3, frozenset((0, 2)): 4, frozenset((0, 1)): 5}[frozenset((i, j))]


def mass_program(run, u, dim: int):
    """``B^T diag(W) B`` per element: ``dim`` products, one Hadamard, ``dim`` transposed products."""
    x = [u]
    for a in range(dim):
        x = run.stage(x, [[(0, "B", a)]])
    x = run.stage(x, [[(0, "W", None)]])
    for a in range(dim):
        x = run.stage(x, [[(0, "Bt", a)]])
    return x[0]


def poisson_program(run, u, dim: int, skip: frozenset = frozenset()):
    """``sum_ij grad_i^T G_ij grad_j`` per element, sharing the partial products between components.

    Forward: axes from the last to the first, the tensors with ``B`` on every
    axis so far and those with ``D`` on one of them; then ``f_i = sum_j G_ij
    g_j``; backward: ``acc <- B^T acc + D^T f_a`` axis by axis, in the
    forward order (so the axes cycle: each product's new axis goes outermost
    and the next one to contract is innermost, the fused kernel's layouts).
    Every sum adds
    tensors that went through the same operators (one ``D``, the rest ``B``)
    and the same drops, hence with equal scales. ``skip``: packed components
    of ``G`` that are zero everywhere (their terms are left out).
    """
    all_b, with_d = u, {}
    order = list(range(dim - 1, -1, -1))
    for k, a in enumerate(order):
        last = k == dim - 1
        keys = list(with_d)
        inputs = [all_b] + [with_d[j] for j in keys]
        outs = [[(0, "D", a)]] + [[(1 + n, "B", a)] for n in range(len(keys))]
        if not last:
            outs.append([(0, "B", a)])
        res = run.stage(inputs, outs)
        with_d = {a: res[0], **{j: res[1 + n] for n, j in enumerate(keys)}}
        all_b = None if last else res[-1]
    g = [with_d[j] for j in range(dim)]
    outs = []
    for i in range(dim):
        terms = [(j, ("G", voigt_index(i, j, dim)), None) for j in range(dim) if voigt_index(i, j, dim) not in skip]
        outs.append(terms)
    f = run.stage(g, outs)
    acc, fs = None, dict(enumerate(f))
    for a in order:  # the forward order again: the axes cycle (the fused kernel's layouts follow it)
        keys = [i for i in fs if i != a]
        inputs = ([acc] if acc is not None else []) + [fs[a]] + [fs[i] for i in keys]
        o = 1 if acc is not None else 0
        acc_terms = ([(0, "Bt", a)] if acc is not None else []) + [(o, "Dt", a)]
        outs = [acc_terms] + [[(o + 1 + n, "Bt", a)] for n in range(len(keys))]
        res = run.stage(inputs, outs)
        acc, fs = res[0], {i: res[1 + n] for n, i in enumerate(keys)}
    return acc


# ----- planning on bounds -------------------------------------------------------------------


def _after_drops(bound: int, P: int, subset: Sequence[int]) -> Optional[int]:
    """``bound`` after RnsDrop by each of ``subset`` in order, or ``None`` if a drop's range check fails."""
    for q in subset:
        bound, P = bound // q + 1, P // q
        if 2 * bound >= P:
            return None
    return bound


class BoundRunner:
    """Runs a program on exact integer bounds and chooses each stage's drops (the planner)."""

    def __init__(self, basis: Basis, growth: dict, threshold: int):
        self.basis = basis
        self.P = basis.product
        self.growth = growth
        self.threshold = threshold
        self.drops: list[tuple[int, ...]] = []
        self.bounds: list[tuple[list[int], list[int]]] = []  # (inputs after drops, outputs) per stage
        self.failure: Optional[str] = None

    def _outputs(self, bounds: Sequence[int], outs) -> list[int]:
        return [sum(bounds[i] * self.growth[key] for i, key, _ in terms) for terms in outs]

    def stage(self, inputs: Sequence[int], outs) -> list[int]:
        if self.failure is not None:
            return [1] * len(outs)
        P, k = self.P, len(self.drops)
        res = self._outputs(inputs, outs)
        subset: tuple[int, ...] = ()
        if 2 * max(res) >= P:
            target = -(-2 * max(res) // P)
            while True:
                subset = min_product_subset(self.basis.moduli, target)
                if subset is None:
                    self.failure = f"stage {k + 1}: no drop of the basis moduli makes room for it"
                    return [1] * len(outs)
                after = [_after_drops(b, P, subset) for b in inputs]
                if all(a is not None for a in after):
                    res = self._outputs(after, outs)
                    if 2 * max(res) < P:
                        inputs = after
                        break
                target = max(target + 1, math.prod(subset) + 1)  # every drop's +1 cost a little: ask for more
            if max(inputs) < self.threshold:
                self.failure = (
                    f"stage {k + 1}: keeping it in range leaves 2^{log2_int(max(inputs)):.1f} "
                    f"< 2^{log2_int(self.threshold):.0f}"
                )
        self.drops.append(subset)
        self.bounds.append((list(inputs), res))
        return res


@dataclass(frozen=True)
class ProgramPlan:
    """What a residue-domain operator executes: the encoding width and the moduli dropped before each stage.

    ``bounds[k]`` holds, for stage ``k``, the bounds of its inputs after the
    drops and of its outputs (exact Python ints, what the primitives compute).
    """

    basis: Basis
    bits: int
    drops: tuple[tuple[int, ...], ...]
    bounds: tuple
    final_bound: int

    def describe(self) -> str:
        """One line per stage: log2 of the largest input bound after the drops, dropped moduli, output bound."""
        rng = log2_int(self.basis.product) - 1
        lines = [f"residue program on {self.basis!r}: b = {self.bits}, log2 range = {rng:.2f}"]
        for k, (d, (ins, outs)) in enumerate(zip(self.drops, self.bounds)):
            lines.append(
                f"  stage {k + 1:>2}: drop {len(d):>2} moduli -> log2 B in {log2_int(max(ins)):6.2f}, "
                f"out {log2_int(max(outs)):6.2f}"
            )
        return "\n".join(lines)


def plan_program(
    program: Callable, dim: int, basis: Basis, growth_at: Callable[[int], dict], bits: Optional[int] = None
) -> ProgramPlan:
    """The widest ``b <= 53`` (or the given one) whose program fits with at least ``b`` bits kept after every drop.

    ``growth_at(b)`` gives each operand's bound factor at width ``b`` (an
    operator's exact largest integer row sum, ``2**b`` for a field).

    Raises
    ------
    PlanError
        No width passes (more moduli are needed).
    """
    candidates = range(53, 7, -1) if bits is None else [int(bits)]
    failure = None
    for b in candidates:
        if 2 * (1 << b) >= basis.product:
            failure = f"encoding at b = {b} does not fit"
            continue
        run = BoundRunner(basis, growth_at(b), 1 << b)
        out = program(run, 1 << b, dim)
        if run.failure is None:
            return ProgramPlan(basis, b, tuple(run.drops), tuple(run.bounds), out)
        failure = run.failure
    tried = f"b = {candidates[0]}" if len(candidates) == 1 else f"every b from {candidates[0]} down to {candidates[-1]}"
    raise PlanError(
        f"no feasible residue-domain operator on {basis!r} (2^{basis.log2_product:.1f}): with {tried}, {failure}; "
        f"use more moduli (e.g. moduli=20) or method='composed'"
    )


# ----- execution ----------------------------------------------------------------------------


#: the label of a 1-D operator's row index in a written program (the product puts it where the contracted index was)
ROW = "\x02"


def _labels(dim: int) -> str:
    """Labels of an element tensor in a written program: the element, then one per axis."""
    return "e" + "".join(chr(0x100 + a) for a in range(dim))


class ProgramWriter:
    """Writes a program function's stages as residue program steps, with the plan's drops and exact bounds.

    Slot 0 is the encoded input; every operand (a 1-D operator ``'B'``, a
    field ``'W'``, ...) is a constant read by an :class:`~rnstensor.program.ir.Encode`
    step whose ``source`` indexes :attr:`constants`. A stage drops each input
    by its planned moduli (RnsDrop + base extension, one :class:`~rnstensor.program.ir.Drop`
    each), then writes every output as a sum (:class:`~rnstensor.program.ir.Add`)
    of mode products and Hadamard products (:class:`~rnstensor.program.ir.Contract`).
    Bounds are those the planner computed (``growth``: each operand's bound factor).
    """

    def __init__(self, plan: "ProgramPlan", growth: dict, dim: int):
        self.plan, self.growth, self.dim = plan, growth, dim
        self.labels = _labels(dim)
        self.steps: list = [ir.Encode(0, 0, plan.bits, tuple(range(1, dim + 1)), self.labels, 1 << plan.bits)]
        self.bounds = {0: 1 << plan.bits}
        self.constants: list = []
        self.k = 0

    def _slot(self, bound: int) -> int:
        n = len(self.bounds)
        self.bounds[n] = bound
        return n

    def _constant(self, key, labels: str) -> int:
        if key not in self.constants:
            self.constants.append(key)
        slot = self._slot(0)
        self.steps.append(ir.Encode(slot, self.constants.index(key), self.plan.bits, (), labels, 0, constant=True))
        return slot

    def stage(self, inputs: Sequence[int], outs) -> list[int]:
        subset = self.plan.drops[self.k]
        after, out_bounds = self.plan.bounds[self.k]
        self.k += 1
        if subset:
            dropped = []
            for s, b in zip(inputs, after):
                d = self._slot(b)
                self.steps.append(ir.Drop(d, s, tuple(subset), True, b))
                dropped.append(d)
            inputs = dropped
        L = self.labels
        res = []
        for terms, want in zip(outs, out_bounds):
            acc = None
            for i, key, axis in terms:
                x = inputs[i]
                b = self.bounds[x] * self.growth[key]
                if axis is None:  # a Hadamard product with the field: nothing contracted, every index shared
                    c = self._constant(key, L)
                    t = self._slot(b)
                    self.steps.append(ir.Contract(t, x, c, L, L, "", "", "", L, "", "", "outer", L, b))
                else:
                    C = L[1 + axis]
                    c = self._constant(key, ROW + C)
                    t = self._slot(b)
                    self.steps.append(ir.Contract(t, x, c, L, ROW + C, "", "", C, "", L.replace(C, ""), ROW, "mode",
                                                  L, b))
                if acc is None:
                    acc = t
                else:
                    s = self._slot(self.bounds[acc] + b)
                    self.steps.append(ir.Add(s, acc, t, False, self.bounds[s]))
                    acc = s
            if self.bounds[acc] != want:  # pragma: no cover - the writer and the planner disagree
                raise AssertionError(f"stage {self.k}: bound {self.bounds[acc]} written, {want} planned")
            res.append(acc)
        return res


def residue_program(program: Callable, plan: "ProgramPlan", growth: dict, dim: int) -> tuple[ir.Program, tuple]:
    """The residue program of ``program`` under ``plan``, and the keys of its constants (``Encode.source`` order)."""
    w = ProgramWriter(plan, growth, dim)
    out = program(w, 0, dim)
    return ir.Program(plan.basis, tuple(w.steps), out, w.labels), tuple(w.constants)


class FloatRunner:
    """Runs a program on float64 arrays: products by ``product(x, key, axis)``, fields multiplied in float64."""

    def __init__(self, product: Callable, fields: dict):
        self.product = product
        self.fields = fields

    def stage(self, inputs: Sequence[np.ndarray], outs) -> list[np.ndarray]:
        res = []
        for terms in outs:
            acc = None
            for i, key, axis in terms:
                t = inputs[i] * self.fields[key] if axis is None else self.product(inputs[i], key, axis)
                acc = t if acc is None else acc + t
            res.append(acc)
        return res
