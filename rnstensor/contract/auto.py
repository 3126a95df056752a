"""moduli='auto': the correctly rounded result, on the fewest moduli that hold it exactly (else exact part products)."""

from __future__ import annotations

import itertools
import math
from typing import Optional

from ..arrays import array_module, is_device_array, to_module
from ..basis import moduli_count
from ..encode import as_basis, exact_bits_needed
from ..errors import PlanError, RNSRangeError
from ..run.exact import exact_value, least_moduli, round_exact_sum, split_exact
from .parse import _C, _unique
from .gemm_shaped import gemm_auto, gemm_labels
from .planner import _shared_axes

__all__ = ["_CorrectlyRounded"]


class _CorrectlyRounded:
    """The ``moduli='auto'`` evaluation of a :class:`~rnstensor.ContractExpression` (a mixin of it: the expression
    on other bases, built as ``type(self)``)."""

    # ----- moduli='auto': correctly rounded ---------------------------------------------------------

    def _auto(self, arrays, backend, max_products: Optional[int] = None):
        """The correctly rounded result: the plan on the fewest moduli that encodes every operand exactly and drops
        nothing (:func:`rnstensor.run.exact.least_moduli`), decoded exactly; numpy's inf / NaN where they enter.
        ``max_products``: the most exact part products of a split (default :attr:`_MAX_SPLIT_PRODUCTS`)."""
        parsed = self._operands(arrays)
        ops, kinds, cplx, tensors, nonfinite = parsed
        if tensors:
            raise TypeError("einsum: moduli='auto' takes float operands (an RNSTensor carries its own basis: pass "
                            "moduli=None or its basis)")
        _, xp, _ = self._backend(ops, kinds, backend)
        if any(n == 0 for n in self.sizes.values()):
            return self._run(arrays, backend, track=False, parsed=parsed)
        # one GEMM: dgemm's 'auto', the same correctly rounded value (not for the certificate's fallback, whose
        # split is bounded: past it, it takes the classical GEMMs)
        labels = gemm_labels(self) if max_products is None else None
        y = gemm_auto(self, labels, parsed, backend) if labels else None
        if y is not None:
            self.last_evaluation = "one GEMM, correctly rounded (dgemm's 'auto')"
            return y
        leaf = self._leaves(ops, kinds, cplx, xp)
        widths = tuple(max(1, exact_bits_needed(leaf(i), _shared_axes((_C if cplx[i] else "") + _unique(t),
                                                                          self.output)))
                       for i, t in enumerate(self.terms))
        expr = self._exact_rung(kinds, cplx, widths)
        if expr is None:
            return self._auto_split(parsed, arrays, backend, widths, max_products or self._MAX_SPLIT_PRODUCTS)
        self.last_evaluation = f"{len(expr.basis)} moduli, exact"
        y = expr._fused(parsed, backend, widths, "exact")
        if y is not None:
            return y
        T, plan, _, be_name, nonfinite = expr._run(arrays, backend, False, parsed, widths, "exact")
        return expr._finish(T, plan, be_name, nonfinite, arrays, "exact")

    #: the most exact part products ``moduli='auto'`` evaluates for one call before it gives up
    _MAX_SPLIT_PRODUCTS = 512

    def _auto_split(self, parsed: tuple, arrays, backend, widths: tuple, max_products: int):
        """``moduli='auto'`` beyond 49 moduli: the widest operands split exactly (:func:`rnstensor.run.exact.split_exact`)
        until one exact plan holds every part, each product of parts evaluated exactly, their integers summed exactly
        (Python integers, on the host) and rounded once."""
        ops, kinds, cplx, _, nonfinite = parsed
        counts = [1] * len(widths)
        inputs = tuple("input" for _ in kinds)  # constants are split like the rest: every operand is passed
        while True:
            i = max(range(len(widths)), key=lambda j: -(-widths[j] // counts[j]))
            counts[i] += 1
            parts_w = tuple(-(-w // c) for w, c in zip(widths, counts))
            if math.prod(counts) > max_products or min(parts_w) < 1:
                raise RNSRangeError(
                    f"einsum: moduli='auto' needs the exact value of {self.subscripts!r}: its operands encode exactly "
                    f"at {list(widths)} bits (one exponent per slice along the output indices), and even split into "
                    f"{math.prod(counts)} exact part products they need more than 49 INT8 moduli hold without "
                    f"rounding; pass moduli=None (the classical float64 bound)"
                )
            rung = type(self)(self.terms, self.output, self.shapes, {}, self.basis, "rescale_be",
                              [tuple(p) for p in self.path], "exact", None, self.backend, 0, self.nonfinite)
            expr = rung._exact_rung(inputs, cplx, parts_w)
            if expr is not None:
                break
        xp = array_module(*[x for x in ops])
        split = [split_exact(x, _shared_axes(t, self.output), c) for x, t, c in zip(ops, self.terms, counts)]
        terms = []
        for combo in itertools.product(*split):
            T, plan, _, _, _ = expr._run(list(combo), backend, False, None, parts_w)
            terms.append(exact_value(T))
        y = round_exact_sum(terms)
        if plan.complex:
            y = y[0] + 1j * y[1]
        y = to_module(y, xp)
        self.last_evaluation = f"{len(expr.basis)} moduli, exact, {len(terms)} part products"
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y

    def _exact_rung(self, kinds: tuple, cplx: tuple, widths: tuple) -> Optional["ContractExpression"]:
        """This expression on the fewest INT8 moduli whose plan for operands of exact ``widths`` rounds nowhere
        (cached per widths: the data decides them)."""
        key = ("exact", kinds, cplx, widths)
        if key in self._rungs:
            return self._rungs[key]
        found: dict = {}

        def fits(s: int) -> bool:
            expr = type(self)(self.terms, self.output, self.shapes, self.constants,
                              as_basis(moduli_count(s), "moduli"), "rescale_be", [tuple(p) for p in self.path],
                              "exact", None, self.backend, 0, self.nonfinite)
            expr._const_cache = self._const_cache  # the constants' arrays (their encodings are per width)
            try:
                plan = expr._plan(kinds, cplx, {}, widths)
            except PlanError:
                return False
            if plan.kept_bits != math.inf:
                return False
            found[s] = expr
            return True

        # the product of the operands' widths and the sums' terms, at least: the range cannot be smaller
        start = max(2, (sum(widths) + 1) // 8 - 1)
        s = least_moduli(fits, start)
        if len(self._rungs) > 64:
            self._rungs.clear()
        self._rungs[key] = found.get(s) if s is not None else None
        return self._rungs[key]
