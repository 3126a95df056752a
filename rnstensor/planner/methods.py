"""The method planners of [2610.05059]: RescaleBE (Alg. 3), Rescale (Alg. 9), NoRescale (Alg. 8), Composed (Alg. 6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from ..basis import Basis, log2_int
from ..errors import PlanError
from .bounds import operator_norms, optimal_drops
from .drops import StepBounds, axis_labels, chain_program, simulate
from .operators import PreparedOperator, prepare_operators

#: The fewest bits a plan may keep by default (einsum, chains, FEM operators, GEMM): ``min_bits``.
MIN_BITS = 32

__all__ = ["METHODS", "PLANNERS", "MIN_BITS", "Schedule", "check_kept_bits", "plan_schedule"]

METHODS = ("rescale_be", "rescale", "norescale", "composed")
PLANNERS = ("greedy", "optimal")


@dataclass(frozen=True, eq=False)
class Schedule:
    """What a plan executes: the method, the encoding bits, the drops and the prepared operators.

    ``steps`` holds the bound recurrence (one :class:`StepBounds` per product);
    for ``'composed'`` every product starts again from ``2**bits``.
    ``program`` is the planned residue program (:func:`~rnstensor.planner.drops.chain_program`
    planned by :func:`~rnstensor.planner.program.plan_drops`).
    """

    method: str
    bits: int
    input_bits: int
    drops: tuple[int, ...]
    operators: tuple[PreparedOperator, ...]
    steps: tuple[StepBounds, ...]
    basis: Basis
    program: object = None  # the planned residue program (rnstensor.program), what the plan runs

    @property
    def kept_bits(self) -> float:
        """The fewest significant bits any encoding or intermediate keeps (its integers' width after the drops)."""
        after = [log2_int(st.after) for st in self.steps if st.drops and st.after]
        return float(min([self.bits, self.input_bits] + after))


def check_kept_bits(what: str, kept: float, min_bits: int, asked: Optional[int], more, lower: bool = True) -> None:
    """Refuse a plan that keeps fewer than ``min_bits`` bits (or than the width the caller asked for, if fewer).

    The one rule of einsum, chain plans, the FEM operators and the GEMMs:
    a plan that keeps ``b`` bits errs by about ``2**-b`` of its operands'
    norm, so below ``min_bits`` (default 32) it is refused with a
    :class:`PlanError` that says how to get more bits (``more``: the text, or
    a callable giving it, asked only on that path) or to lower ``min_bits``
    (to the bits kept, which passes) to accept the error (``lower=False``: a
    caller for which that is no fix, e.g. an exact decode, which needs every bit).
    """
    if isinstance(min_bits, bool) or not isinstance(min_bits, (int, np.integer)) or min_bits < 0:
        raise ValueError(f"min_bits must be a non-negative integer; got {min_bits!r}")
    need = min_bits if asked is None else min(min_bits, asked)  # a width the caller asked for is no loss
    if kept < need:
        more = more() if callable(more) else more
        raise PlanError(
            f"{what} keeps only {kept:.1f} bits of some operand or intermediate (min_bits={min_bits}); "
            + (f"{more}, or " if more and lower else more) + (
                f"pass min_bits={int(kept)} to accept the larger error" if lower else "")
        )


def _try(method: str, bits: int, input_bits: Optional[int], planner: str, operators, axes, basis: Basis, ndim: int):
    """Prepare the operators at ``bits``, write the chain's program and plan it: ``(schedule, failure)``."""
    xbits = bits if input_bits is None else int(input_bits)
    if 2 * (1 << xbits) >= basis.product:
        return None, (-1, "encode", float(xbits + 1), basis.log2_product)
    labels = axis_labels(ndim)
    if method == "composed":
        # decoded after every product: each operator is encoded on its own, no pending scales
        ops = tuple(prepare_operators([A], [ax], bits)[0] for A, ax in zip(operators, axes))
        # the composed range rule of Alg. 6: n * 2^(2b) < P/2 for every product
        for i, op in enumerate(ops):
            n = op.ints.shape[1]
            if 2 * n * (1 << (2 * bits)) >= basis.product:
                return None, (i, "product", log2_int(2 * n) + 2 * bits, basis.log2_product)
        rhos = [op.rho for op in ops]
        program = chain_program(rhos, basis, 1 << bits, False, labels, axes, bits, composed=True)
        trace = simulate(bits, rhos, basis, False, [], None, program)
        # every product starts again from 2**bits on the whole basis
        steps = tuple(StepBounds(1 << bits, st.product, 0, st.product, basis.product, basis.product, ())
                      for st in trace.steps)
        failure = trace.failure
    else:
        ops = prepare_operators(operators, axes, bits)
        rhos = [op.rho for op in ops]
        start = 1 << xbits
        restore = method == "rescale_be"

        def planned(drops):
            program = chain_program(rhos, basis, start, restore, labels, axes, xbits)
            return simulate(bits, rhos, basis, restore, drops, start, program)

        if method == "norescale":
            trace = planned([0] * len(ops))
        else:
            trace = planned(None)
            if planner == "optimal" and trace.failure is None:
                norms = [operator_norms(op, A) for op, A in zip(ops, operators)]
                greedy = [st.dropped for st in trace.steps]
                best = optimal_drops(start, rhos, norms, basis, restore, extra_candidates=[greedy])
                if best is not None:
                    trace = planned(best)
        steps, failure, program = tuple(trace.steps), trace.failure, trace.program
    if failure is not None:
        return None, failure
    if method == "composed":
        program = trace.program
    drops = tuple(s.drops for s in steps)
    return Schedule(method, bits, xbits, drops, ops, tuple(steps), basis, program), None


def _widest_input(sched: Schedule, method: str, planner: str, operators, axes, basis: Basis, ndim: int) -> Schedule:
    """``sched`` with its input encoded as wide as every range check allows (``input_bits='max'``).

    Whether a width passes is the greedy plan's feasibility (the optimal
    planner only moves drops within a feasible plan), so the width is found
    by galloping and bisection on the cheap greedy check (``sched``, a greedy
    plan, passes), and planned once with ``planner``: on 30 to 49 moduli the
    widths number in the hundreds.
    """
    b = sched.bits

    def passes(xbits: int) -> bool:
        return _try(method, b, xbits, "greedy", operators, axes, basis, ndim)[0] is not None

    lo, step = sched.input_bits, 1  # lo passes
    while passes(lo + step):
        lo, step = lo + step, 2 * step
    hi = lo + step  # fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    if lo == sched.input_bits and planner == "greedy":
        return sched
    return _try(method, b, lo, planner, operators, axes, basis, ndim)[0]


def plan_schedule(
    operators: Sequence[np.ndarray],
    axes: Sequence[int],
    basis: Basis,
    method: str = "rescale_be",
    planner: str = "optimal",
    bits: Optional[int] = None,
    input_bits: Optional[Union[int, str]] = None,
    ndim: Optional[int] = None,
    min_bits: int = MIN_BITS,
    *,
    hints: bool = True,
) -> Schedule:
    """Choose the encoding bits and drop counts of a chain (largest ``b <= 53`` passing every check).

    With ``bits`` given, that width is checked and used (it may exceed 53
    where the basis holds it). ``input_bits`` encodes the tensor wider (or
    narrower) than the operators; ``'max'`` takes the widest that passes. ``planner='optimal'`` (the default) chooses the drops to
    minimise the a-priori error bound instead of Alg. 2's greedy rule (``'greedy'``). Raises
    :class:`PlanError` naming the failing step and the missing bits when no
    width passes, and when the plan found keeps fewer than ``min_bits`` bits
    (:func:`check_kept_bits`); its hints are fixes that plan when followed
    (``hints=False``: the error alone, for the search of those fixes).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if planner not in PLANNERS:
        raise ValueError(f"planner must be one of {PLANNERS}; got {planner!r}")
    if input_bits is not None and method == "composed":
        raise ValueError("input_bits applies to the persistent methods; 'composed' encodes every product at bits")
    widest = isinstance(input_bits, str) and input_bits == "max"
    for name, val in (("bits", bits), ("input_bits", None if widest else input_bits)):
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1):
            raise ValueError(f"{name} must be a positive integer" + (" or 'max'" if name == "input_bits" else "")
                             + f"; got {val!r}")
    ndim = max(axes) + 1 if ndim is None else int(ndim)
    candidates = range(53, 0, -1) if bits is None else [int(bits)]
    failure = None
    for b in candidates:
        # 'max' finds the widths on the greedy plans (same feasibility) and plans the widest once
        sched, failure = _try(method, b, None if widest else input_bits, "greedy" if widest else planner,
                              operators, axes, basis, ndim)
        if sched is not None:
            if widest:
                sched = _widest_input(sched, method, planner, operators, axes, basis, ndim)
            asked = None if bits is None else int(bits)
            args = (operators, axes, basis, method, planner, bits, input_bits, ndim, min_bits)
            check_kept_bits(f"plan_chain: the '{method}' plan on {basis!r}", sched.kept_bits, min_bits, asked,
                            (lambda: _chain_fixes(*args)) if hints else "")
            return sched
    step, what, need, have = failure
    where = "the encoding" if step < 0 else f"product {step + 1} (axis {axes[step]})" + (
        " at its drops" if what == "drop" else ""
    )
    tried = f"b = {candidates[0]}" if len(candidates) == 1 else f"every b from {candidates[0]} down to 1"
    fixes = _chain_fixes(operators, axes, basis, method, planner, bits, input_bits, ndim, min_bits) if hints else ""
    raise PlanError(
        f"no feasible '{method}' plan on {basis!r}: with {tried}, {where} needs a range of 2^{need:.2f} "
        f"but has 2^{have:.2f} ({need - have:.2f} bits missing)" + (f"; {fixes}" if fixes else "")
    )


def _chain_fixes(operators, axes, basis: Basis, method: str, planner: str, bits, input_bits, ndim, min_bits) -> str:
    """The fixes of a chain that does not plan, each checked to plan when followed: the fewest INT8 moduli that
    plan it, ``method='rescale_be'`` on this basis, a narrower ``bits``. Empty where none does."""
    from ..basis import int8_pool  # noqa: PLC0415
    from ..run.exact import least_moduli  # noqa: PLC0415 - the galloping search of the moduli choices

    def plans(**changed) -> bool:
        kw = dict(basis=basis, method=method, bits=bits, input_bits=input_bits) | changed
        try:
            plan_schedule(operators, axes, kw["basis"], kw["method"], planner, kw["bits"], kw["input_bits"], ndim,
                          min_bits, hints=False)
        except (PlanError, ValueError):
            return False
        return True

    fixes = []
    pool = int8_pool()
    if tuple(basis.moduli) == tuple(pool[:len(basis)]) and len(basis) < len(pool):
        s = least_moduli(lambda n: plans(basis=Basis.int8(n)), len(basis) + 1)
        if s is not None:
            fixes.append(f"use more moduli (moduli={s} plans it)")
    if method != "rescale_be" and plans(method="rescale_be", input_bits=None if method == "composed" else input_bits):
        fixes.append("method='rescale_be'")
    if bits is not None:
        if plans(bits=None):
            fixes.append("leave bits unset (the widest that plans)")
    return "; or ".join(fixes)
