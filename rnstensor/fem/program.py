"""Operator programs written once: as residue programs (planned, executed, packed) or run on floats (composed, float64).

A program function is a sequence of *stages*. A stage takes the live tensors
and returns new ones, each a sum of *terms* ``(input, operand, axis)``: a mode
product with a 1-D operator along a tensor axis, or (``axis is None``) a
Hadamard product with an encoded per-element field. In the residue domain
every input of a stage is first divided by the same moduli (RnsDrop, then
base extension), so all tensors that meet in a sum carry the same scale.

:class:`ProgramWriter` writes the function as a residue program
(:mod:`rnstensor.program`) with a drop point before every stage; the planner
(:func:`rnstensor.planner.program.plan_drops`) computes its exact bounds
(encode: ``2**b``; product: ``B * rho``; Hadamard: ``B * F.bound``; sum:
bounds add; drop: ``B // q + 1`` per modulus) and chooses per stage the set
of moduli with the smallest product that lets every output fit the range.
The executed program therefore never leaves the centered range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np


from ..basis import Basis, log2_int
from ..errors import PlanError
from ..planner.methods import MIN_BITS, check_kept_bits
from ..planner.program import Failure, JustEnough, plan_drops
from .. import ir

__all__ = ["Term", "ProgramPlan", "plan_program", "ProgramWriter", "FloatRunner", "mass_program", "poisson_program",
           "voigt_index", "ROW", "DEFAULT_BITS"]

#: the operators' default encoding width (``bits=None``, where the basis holds it): on the default 20 moduli their
#: result is at least as accurate as numpy's float64 evaluation in practice (53 bits on 15 moduli was 1.4-9x numpy's
#: normwise error, 70-95 % of entries less accurate: BENCHMARKS.md, 2026-12-06)
DEFAULT_BITS = 72

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


@dataclass(frozen=True)
class ProgramPlan:
    """What a residue-domain operator executes: the encoding width, the moduli dropped before each stage, and the
    planned residue program.

    ``bounds[k]`` holds, for stage ``k``, the bounds of its inputs after the
    drops and of its outputs (exact Python ints, what the primitives compute).
    """

    basis: Basis
    bits: int
    drops: tuple[tuple[int, ...], ...]
    bounds: tuple
    final_bound: int
    program: Optional[ir.Program] = None  # the planned residue program
    constants: tuple = ()  # what each constant of ``program`` is (``Encode.source`` order)

    def describe(self, file=None) -> str:
        """One line per stage: log2 of the largest input bound after the drops, dropped moduli, output bound.

        Returned, not printed, as :meth:`rnstensor.ChainPlan.describe`: ``file``,
        a text stream, is written the same text (and a newline) as well.
        """
        rng = log2_int(self.basis.product) - 1
        lines = [f"residue program on {self.basis!r}: b = {self.bits}, log2 range = {rng:.2f}"]
        for k, (d, (ins, outs)) in enumerate(zip(self.drops, self.bounds)):
            lines.append(
                f"  stage {k + 1:>2}: drop {len(d):>2} moduli -> log2 B in {log2_int(max(ins)):6.2f}, "
                f"out {log2_int(max(outs)):6.2f}"
            )
        text = "\n".join(lines)
        if file is not None:
            print(text, file=file)
        return text


def plan_program(
    program: Callable, dim: int, basis: Basis, growth_at: Callable[[int], dict], bits: Optional[int] = None,
    min_bits: int = MIN_BITS, name: str = "operator", *, hints: bool = True,
) -> ProgramPlan:
    """The widest ``b <= DEFAULT_BITS`` (or the given one) whose program fits with at least ``b`` bits kept after every
    drop.

    ``growth_at(b, basis)`` gives each operand's bound factor at width ``b`` (an
    operator's exact largest integer row sum, ``2**b`` for a field). The
    program function is written as a residue program with a drop point
    before every stage (:class:`ProgramWriter`) and planned by
    :func:`rnstensor.planner.program.plan_drops`: per stage, the subset of
    moduli with the smallest product that lets every output fit
    (:class:`~rnstensor.planner.program.JustEnough`).

    Raises
    ------
    PlanError
        No width passes (more moduli are needed), or the widest that does
        keeps fewer than ``min_bits`` bits (the rule of einsum and chains);
        the fixes it names plan when followed (``hints=False``: the error
        alone, for the search of those fixes).
    """
    def fixes() -> str:  # (each checked: it plans)
        return _operator_fixes(program, dim, basis, growth_at, bits, min_bits, name) if hints else ""

    candidates = range(DEFAULT_BITS, 7, -1) if bits is None else [int(bits)]
    failure = None
    for b in candidates:
        if 2 * (1 << b) >= basis.product:
            failure = f"encoding at b = {b} does not fit"
            continue
        w = ProgramWriter(b, dim, basis)
        out = program(w, 0, dim)
        skeleton = ir.Program(basis, tuple(w.steps), out, w.labels)
        growth = growth_at(b, basis)
        planned = plan_drops(skeleton, {i: growth[key] for i, key in enumerate(w.constants)},
                             JustEnough(basis, 1 << b))
        if isinstance(planned, Failure):
            failure = (planned.detail if planned.what == "drop" and planned.detail else
                       f"keeping it in range leaves 2^{planned.need:.1f} < 2^{planned.have:.0f}"
                       if planned.what == "kept" else "a product does not fit")
            failure = f"stage {planned.index + 1}: {failure}"
            continue
        sb = planned.slot_bounds
        stage_bounds = tuple(([sb[s] for s in ins], [sb[s] for s in outs]) for ins, outs in w.stages)
        drops = tuple(g.dropped for g in planned.groups)
        check_kept_bits(f"{name}: the residue plan on {basis!r}", float(b), min_bits, bits, fixes)
        return ProgramPlan(basis, b, drops, stage_bounds, sb[out], planned.program, tuple(w.constants))
    tried = f"b = {candidates[0]}" if len(candidates) == 1 else f"every b from {candidates[0]} down to {candidates[-1]}"
    more = fixes()
    raise PlanError(
        f"no feasible residue-domain operator on {basis!r} (2^{basis.log2_product:.1f}): with {tried}, {failure}"
        + (f"; {more}" if more else "")
    )


def _operator_fixes(program: Callable, dim: int, basis: Basis, growth_at: Callable, bits, min_bits: int,
                    name: str) -> str:
    """The fixes of an operator that does not plan, each checked to plan: the fewest INT8 moduli of its
    :class:`~rnstensor.fem.TensorBasis`, a narrower ``bits``."""
    from ..basis import int8_pool  # noqa: PLC0415
    from ..run.exact import least_moduli  # noqa: PLC0415 - the galloping search of the moduli choices

    def plans(on: Basis, b) -> bool:
        try:
            plan_program(program, dim, on, growth_at, b, min_bits, name, hints=False)
        except PlanError:
            return False
        return True

    out = []
    pool = int8_pool()
    if tuple(basis.moduli) == tuple(pool[:len(basis)]) and len(basis) < len(pool):
        s = least_moduli(lambda n: plans(Basis.int8(n), bits), len(basis) + 1)
        if s is not None:
            out.append(f"use more moduli: the operator's TensorBasis(..., moduli={s}) plans it")
    if bits is not None:
        if plans(basis, None):
            out.append("leave bits unset (the widest that plans)")
        else:
            narrower = next((b for b in range(int(bits) - 1, 7, -1) if plans(basis, b)), None)
            if narrower is not None:
                out.append(f"bits={narrower}")
    return "; or ".join(out)


# ----- execution ----------------------------------------------------------------------------


#: the label of a 1-D operator's row index in a written program (the product puts it where the contracted index was)
ROW = "\x02"


def _labels(dim: int) -> str:
    """Labels of an element tensor in a written program: the element, then one per axis."""
    return "e" + "".join(chr(0x100 + a) for a in range(dim))


class ProgramWriter:
    """Writes a program function's stages as a residue program to be planned (one drop point per stage input).

    Slot 0 is the encoded input at ``bits``; every operand (a 1-D operator
    ``'B'``, a field ``'W'``, ...) is a constant read by an
    :class:`~rnstensor.ir.Encode` step whose ``source`` indexes
    :attr:`constants`. A stage is a drop point for each input (group = the
    stage: the planner drops them all by the same moduli, then extends), then
    every output as a sum (:class:`~rnstensor.ir.Add`) of mode products
    and Hadamard products (:class:`~rnstensor.ir.Contract`), bounds
    left to the planner. :attr:`stages` lists each stage's input and output
    slots.
    """

    def __init__(self, bits: int, dim: int, basis: Basis):
        self.bits, self.dim, self.basis = bits, dim, basis
        self.labels = _labels(dim)
        self.steps: list = [ir.Encode(0, 0, bits, tuple(range(1, dim + 1)), self.labels, 1 << bits)]
        self.nslots = 1
        self.constants: list = []
        self.stages: list = []

    def _slot(self) -> int:
        self.nslots += 1
        return self.nslots - 1

    def _constant(self, key, labels: str) -> int:
        if key not in self.constants:
            self.constants.append(key)
        slot = self._slot()
        self.steps.append(ir.Encode(slot, self.constants.index(key), self.bits, (), labels, 0, constant=True))
        return slot

    def stage(self, inputs: Sequence[int], outs) -> list[int]:
        k = len(self.stages)
        dropped = []
        for s in inputs:
            d = self._slot()
            self.steps.append(ir.Drop(d, s, None, True, 0, group=k))
            dropped.append(d)
        L = self.labels
        res = []
        for terms in outs:
            acc = None
            for i, key, axis in terms:
                x = dropped[i]
                t = self._slot()
                if axis is None:  # a Hadamard product with the field: nothing contracted, every index shared
                    c = self._constant(key, L)
                    self.steps.append(ir.Contract(t, x, c, L, L, "", "", "", L, "", "", "outer", L, 0))
                else:
                    C = L[1 + axis]
                    c = self._constant(key, ROW + C)
                    self.steps.append(ir.Contract(t, x, c, L, ROW + C, "", "", C, "", L.replace(C, ""), ROW, "mode",
                                                  L, 0))
                if acc is None:
                    acc = t
                else:
                    s = self._slot()
                    self.steps.append(ir.Add(s, acc, t, False, 0))
                    acc = s
            res.append(acc)
        self.stages.append((dropped, res))
        return res


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
