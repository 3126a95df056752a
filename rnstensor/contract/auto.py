"""moduli='auto': the correctly rounded result, on the fewest moduli that hold it exactly (else pairwise in integers)."""

from __future__ import annotations

import math
from typing import Optional

from ..arrays import is_device_array, to_host, to_module
from ..basis import moduli_count
from ..encode import as_basis, exact_bits_needed
from ..errors import PlanError, RNSRangeError
from ..run.exact import least_moduli, round_exact_sum
from ..run.exact_path import exact_einsum
from .operands import _leaf_array
from .parse import _C, _unique
from .gemm_shaped import gemm_auto, gemm_labels
from .planner import _shared_axes

__all__ = ["_CorrectlyRounded"]


class _CorrectlyRounded:
    """The ``moduli='auto'`` evaluation of a :class:`~rnstensor.ContractExpression` (a mixin of it: the expression
    on other bases, built as ``type(self)``)."""

    # ----- moduli='auto': correctly rounded ---------------------------------------------------------

    def _auto(self, arrays, backend, pairwise: bool = True):
        """The correctly rounded result: the plan on the fewest moduli that encodes every operand exactly and drops
        nothing (:func:`rnstensor.run.exact.least_moduli`), decoded exactly, else (``pairwise``) the exact value pairwise
        in Python integers (:meth:`_auto_pairwise`); numpy's inf / NaN where they enter. Without ``pairwise``, no plan
        of at most 49 moduli holding the value raises :class:`~rnstensor.RNSRangeError` (the default's fallback
        then takes the classical GEMMs)."""
        parsed = self._operands(arrays)
        ops, kinds, cplx, tensors, nonfinite = parsed
        if tensors:
            raise TypeError("einsum: moduli='auto' takes float operands (an RNSTensor carries its own basis: pass "
                            "moduli=None or its basis)")
        _, xp, _ = self._backend(ops, kinds, backend)
        if any(n == 0 for n in self.sizes.values()):
            return self._run(arrays, backend, track=False, parsed=parsed)
        # one GEMM: dgemm's 'auto', the same correctly rounded value (not for the certificate's fallback, which takes
        # one exact plan or else the classical GEMMs)
        labels = gemm_labels(self) if pairwise else None
        y = gemm_auto(self, labels, parsed, backend) if labels else None
        if y is not None:
            self.last_evaluation = "one GEMM, correctly rounded (dgemm's 'auto')"
            return y
        leaf = self._leaves(ops, kinds, cplx, xp)
        widths = tuple(max(1, exact_bits_needed(leaf(i), _shared_axes((_C if cplx[i] else "") + _unique(t),
                                                                          self.output)))
                       for i, t in enumerate(self.terms))
        expr = self._exact_rung(kinds, cplx, widths)
        if expr is None and pairwise:
            return self._auto_pairwise(parsed, arrays, backend)
        if expr is None:
            raise RNSRangeError(f"einsum: the exact value of {self.subscripts!r} on these operands (encoded exactly at "
                                f"{list(widths)} bits) needs more than 49 INT8 moduli in one plan")
        self.last_evaluation = f"{len(expr.basis)} moduli, exact"
        y = expr._fused(parsed, backend, widths, "exact")
        if y is not None:
            return y
        T, plan, _, be_name, nonfinite = expr._run(arrays, backend, False, parsed, widths, "exact")
        return expr._finish(T, plan, be_name, nonfinite, arrays, "exact")

    def _auto_pairwise(self, parsed: tuple, arrays, backend):
        """``moduli='auto'`` beyond 49 moduli: the exact value pairwise along the path in Python integers, each
        pairwise contraction one exact residue GEMM of limbs (:func:`rnstensor.run.exact_path.exact_einsum`), rounded
        once per entry."""
        ops, kinds, cplx, _, nonfinite = parsed
        be, xp, _ = self._backend(ops, kinds, backend)
        leaves = []
        for t, x, c in zip(self.terms, ops, cplx):
            x = to_host(_leaf_array(t, self.sizes, x, c, xp))
            leaves.append([x[0], x[1]] if c else [x])
        parts, e = exact_einsum([_unique(t) for t in self.terms], self.output, self.path, leaves, be)
        y = round_exact_sum([(parts[0], e)])
        if len(parts) > 1:
            y = y + 1j * round_exact_sum([(parts[1], e)])
        y = to_module(y, xp)
        self.last_evaluation = "exact, pairwise in Python integers (residue GEMMs of limbs)"
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
