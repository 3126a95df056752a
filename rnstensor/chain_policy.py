"""The accuracy policies of chain plans: moduli='auto' (the exact chain rounded once) and the certified default
(moduli=None, rtol=: certified residue plans, wider ones, else the exact chain rounded once, else classical GEMMs)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional

import numpy as np

from .arrays import array_module, to_module
from .basis import int8_pool
from .encode import group_exponents
from .errors import PlanError, RNSRangeError
from .planner.methods import MIN_BITS
from .program.classical import ClassicalErrors, certify, gamma
from .program.errors import inflate
from .ir import Encode
from .run.exact import half_spacing
from .run.escalate import certified_groups
from .run.groups import evaluation, put_back
from .run.policy import FALLBACK_PAIRWISE, default_target

__all__ = ["ChainPolicies"]


class ChainPolicies:
    """What :class:`~rnstensor.ChainPlan` does with ``moduli='auto'`` (:meth:`_exact_chain`) and with
    ``moduli=None``: the residue run certified before it runs against the default's target (or ``rtol``), on this
    plan or the narrowest wider one that meets it, per tensor (:meth:`_classical_groups`), else the exact chain rounded once
    (:meth:`_default_exact`), else one classical GEMM per product (:meth:`classical_chain`). A mixin: the plan
    supplies its operators, program, schedule and :meth:`_replanned`."""

    # ----- moduli='auto' (and the default's fallback): the exact chain rounded once --------------

    def _exact_chain(self, X, backend, nonfinite: str, pairwise: bool = True):
        """``moduli='auto'``: the exact chain, rounded once per entry (no rounding drop): the einsum of the same
        contractions with ``moduli='auto'`` (:func:`rnstensor.contract_expression`), built once per input shape.
        Without ``pairwise``, only where one exact plan of at most 49 moduli holds it (else :class:`RNSRangeError`)."""
        from .contract import contract_expression  # noqa: PLC0415 - the front end of einsum, above this one

        shape = tuple(getattr(X, "shape", np.shape(X)))
        batch = self._check_shape(shape)
        key = (shape, nonfinite)
        if key not in self._exact_exprs:
            ops = [np.asarray(A, dtype=np.float64) for A in self.operators]
            self._exact_exprs[key] = contract_expression(
                self.einsum_subscripts(batch), shape, *ops, constants=range(1, len(ops) + 1), moduli="auto",
                backend=backend, nonfinite=nonfinite)
        expr = self._exact_exprs[key]
        y = expr._auto((X,), backend, pairwise)
        self.last_evaluation = expr.last_evaluation
        return y

    # ----- the certified default ----------------------------------------------------------------

    @property
    def classical_terms(self) -> int:
        """``m`` of the classical bound ``γ_m |A_n| ... |A_1| |X|``: the columns of every operator, added up."""
        return sum(int(A.shape[1]) for A in self.operators)

    def _check_target_decode(self, decode: str, fn: str) -> None:
        """A plan with a target (``rtol``) is certified with the fp64 decode only: the exact decode of its planned
        integers (drops round) is not held to it, so it is refused rather than returned uncertified."""
        if self.rtol is not None and decode != "fp64":
            raise ValueError(f"{fn}: this plan's rtol={self.rtol:g} is certified with decode='fp64' (decode="
                             f"{decode!r} would return the planned chain's integers, not held to the target); call "
                             f"it with decode='fp64', or plan_chain(..., moduli='auto') without rtol for the "
                             f"correctly rounded chain")

    def _certifies(self, decode: str) -> bool:
        """Whether a call is held to the default's target (or ``rtol``): the default plan with the fp64 decode (the
        exact decode rounds this plan's integers once, as planned)."""
        return self.classical and decode == "fp64" and self.method == "rescale_be"

    def _classical_groups(self, xb, xp) -> list:
        """``[(plan, exact, index)]``: the tensors of ``xb`` (``(B, *tensor)``) grouped by the plan each runs on,
        the narrowest plan (from the moduli the target asks for, the widest input encoding) whose run on that tensor is
        certified to meet the default's target (or ``rtol``); ``plan`` None for tensors no residue plan certifies.
        ``exact``: the group's result is the exact integer and the bound one rounding (decoded ``'exact'``).

        Each tensor's verdicts are its own (:class:`~rnstensor.program.classical.ClassicalErrors` per tensor), and so
        is its path of rungs, so a tensor's result does not depend on the batch it comes in
        (``rnstensor.dask.apply`` gives the in-memory bits for every chunking). ``xp``: ``xb``'s array module."""
        m = self.classical_terms
        target = default_target(m, self.rtol)  # the default's: (1 + 2**-5) u of the magnitudes (run/policy.py)
        plan, s = self, len(self.basis)
        if self.rtol is not None:  # a target starts on the moduli its width asks for (a loose one, fewer than 15)
            plan, s = self._wider_from(max(2, math.ceil((2 * max(8.0, -math.log2(target) + 8) + 16) / 8)))

        def certify(plan, idx):
            obs = plan._certificate(xb if idx is None else xb[idx], m, target, per_tensor=True, xp=xp)
            ok, excess = obs.verdicts(m, target)
            return ok, excess, obs.exacts() if m <= 1 else xp.zeros(ok.shape, bool)

        def next_keys(s, excess, failed):
            # the tensors that failed go to the next rung their own excess asks for, the least first: a modulus per
            # 4 bits past the first 4 (both factors of a product widen; one modulus of range also lets the planner
            # drop less, which is what a small excess on uniform data needs: 16 moduli where 15 with the widest
            # input fail)
            step = 2 * xp.ceil((xp.log2(xp.where(failed, excess, 1.0)) + 2) / 8)
            return xp.where(failed, s + xp.maximum(1, step - 1), math.inf)

        # (the tensors no residue plan certified, however they got there: one fallback call)
        return certified_groups((plan, s), certify, next_keys, self._wider_from, xb.shape[0], merge_fallback=True)

    def _run_certified(self, x, decode: str, backend, fused, xp):
        """The default's run (``moduli=None``, or ``rtol=``) of finite ``x``: each group of
        :meth:`_classical_groups` on its plan, or correctly rounded, or by the classical GEMMs; the results put
        back in the tensors' order (``xp``: ``x``'s array module)."""
        lead = tuple(x.shape[:x.ndim - self.ndim])
        xb = x.reshape((-1,) + tuple(x.shape[x.ndim - self.ndim:]))
        groups = self._classical_groups(xb, xp)
        parts, said = [], {}  # (the evaluations, with their tensors)
        for plan, exact, idx in groups:
            sub = xb if idx is None else xb[idx]
            if plan is None:  # no residue plan certified: the exact chain rounded once, else the classical GEMMs
                y, counts = self._fallback(sub, backend)
            else:
                what = f"residues on {len(plan.basis)} moduli" + (
                    f", {plan.input_bits}-bit input" if plan.input_bits != self.input_bits else "")
                mode = "exact" if exact else decode
                y = (self._run_planned(sub, mode, backend, fused) if plan is self else
                     plan.run(sub, mode, backend=backend, fused=fused))
                counts = {what: sub.shape[0]}
            for what, n in counts.items():
                said[what] = said.get(what, 0) + n
            parts.append((idx, y))
        y = put_back(parts, xb.shape[0], xp)
        self.last_evaluation = evaluation(said, xb.shape[0], "tensors")
        return y.reshape(lead + tuple(y.shape[1:]))

    def _certified_bound(self, x, decode: str) -> float:
        """:meth:`~rnstensor.ChainPlan.error_bound` of the default's result on finite ``x``: the largest of its
        groups' bounds (:meth:`_classical_groups`)."""
        xb = x.reshape((-1,) + tuple(x.shape[x.ndim - self.ndim:]))
        groups = self._classical_groups(xb, array_module(xb))
        worst = 0.0
        for plan, exact, idx in groups:
            sub = xb if idx is None else xb[idx]
            if plan is None:  # the result is then correctly rounded (half its largest spacing), or classical GEMMs'
                bound = self._fallback_bound(sub)
            else:
                mode = "exact" if exact else decode
                bound = self._planned_bound(sub, mode) if plan is self else plan.error_bound(sub, mode)
            worst = max(worst, bound)
        return worst

    def _fallback(self, x, backend) -> tuple:
        """``(y, {evaluation: tensors})`` of tensors no residue plan certified: the exact chain rounded once where
        one exact plan holds them, else each tensor alone (correctly rounded where one holds it alone, else the
        classical GEMMs on it alone), so that no tensor's path depends on the others'."""
        y = self._default_exact(x, backend)
        if y is not None:
            return y, {self.last_evaluation: x.shape[0]}
        if x.shape[0] == 1:  # the classical GEMMs (they meet the target: a tighter one took the exact chain)
            self.last_evaluation = "composed classical GEMMs"
            return self.classical_chain(x), {self.last_evaluation: 1}
        parts, counts = [], {}
        for t in range(x.shape[0]):
            y, said = self._fallback(x[t:t + 1], backend)
            parts.append(y)
            for what, n in said.items():
                counts[what] = counts.get(what, 0) + n
        return array_module(x).concatenate(parts), counts

    def _fallback_bound(self, x) -> float:
        """:meth:`_certified_bound` of the tensors :meth:`_fallback` takes: half the largest spacing where correctly
        rounded, the classical GEMMs' bound on each tensor they run alone."""
        y = self._default_exact(x, None)
        if y is not None:
            return float(half_spacing(y).max()) if y.size else 0.0
        if x.shape[0] == 1:
            return self._classical_bound(x, Fraction(float(array_module(x).abs(x).max())))
        return max(self._fallback_bound(x[t:t + 1]) for t in range(x.shape[0]))

    def _wider_from(self, s: int) -> tuple:
        """``(plan, s)``: the first chain that plans on ``s`` or more moduli (:meth:`_wider`), ``(None, s)`` where
        none up to 49 does."""
        while s <= len(int8_pool()):
            plan = self._wider(s)
            if plan is not None:
                return plan, s
            s += 1
        return None, s

    def _default_exact(self, x, backend):
        """The fallback where no residue plan certifies (the default's and a target's): the exact chain rounded once,
        where one exact plan of at most 49 moduli holds it (``None`` otherwise: then the classical GEMMs). A target
        the classical GEMMs do not meet takes the exact chain however wide, as ``moduli='auto'`` does (the correctly
        rounded value meets any target)."""
        try:
            y = self._exact_chain(x, backend, "raise", FALLBACK_PAIRWISE)
        except RNSRangeError:
            if self.rtol is None or self.rtol >= gamma(self.classical_terms):
                return None
            y = self._exact_chain(x, backend, "raise")
        self.last_evaluation = f"correctly rounded ({self.last_evaluation})"
        return y

    def _wider(self, s: int) -> Optional["ChainPolicies"]:
        """This chain planned on ``s`` moduli with the widest input encoding (cached; None where it cannot plan)."""
        if not hasattr(self, "_rungs"):
            self._rungs = {}
        if s not in self._rungs:
            try:
                self._rungs[s] = self._replanned(moduli=s, input_bits="max",
                                                 min_bits=MIN_BITS if self.rtol is None else 0)
            except (PlanError, RNSRangeError):
                self._rungs[s] = None
        return self._rungs[s]

    def _certificate(self, xb, m: Optional[int] = None, target: Optional[float] = None,
                     per_tensor: bool = False, xp=None) -> ClassicalErrors:
        """The classical certification of this plan's run on ``xb`` (``(B, *tensor)``), before it runs.

        With ``m`` (the terms of the bound) a plain chain on the CPU is first
        certified from its statistics in one blocked pass
        (:class:`~rnstensor.program.classical.ChainStatistics`); that
        certificate is returned where it holds, and the full one otherwise,
        so the verdict is always the full certificate's. ``target``: the
        relative error it must meet (None: ``gamma_m``). ``xp``: ``xb``'s array module, where the caller has it.
        """
        xp = array_module(xb) if xp is None else xp
        ops = self._float_operators(xp, encoded=True)

        def exponents(st):  # the encoded operators' row exponents; the input's, as encode_value gives them
            if st.constant:
                return self._operator_value(st.source, xp).exp.total()
            return -group_exponents(xb, st.bits, st.shared, xp)

        leaf = lambda st: ops[st.source] if st.constant else xb  # noqa: E731
        if m is not None:
            batch = next(st.labels[0] for st in self.program.steps if isinstance(st, Encode) and not st.constant)
            return certify(self.program, leaf, exponents, m, target, *((batch, xb.shape[0]) if per_tensor else ()),
                           xp=xp)
        return ClassicalErrors(leaf, exponents, xp=xp).run(self.program)

    def _float_operators(self, xp, encoded: bool) -> list:
        """The operators as float64 arrays on ``xp``, copied to a device once: as given, or as encoded
        (``encoded``: a revisit's exponents folded into their columns, what the certification reads)."""
        key = ("encoded" if encoded else "float", xp.__name__)
        if key not in self._op_values:
            given = [op.effective for op in self._schedule.operators] if encoded else self.operators
            self._op_values[key] = [to_module(np.asarray(A, dtype=np.float64), xp) for A in given]
        return self._op_values[key]

    def classical_chain(self, X):
        """The chain as classical GEMMs (:func:`rnstensor.matmul`), one per product, decoded in between.

        Each product meets ``γ_n |A| |Y|`` (``n`` its operator's columns), so
        the chain meets ``γ_m |A_n| ... |A_1| |X|`` with ``m`` the columns
        added up (:attr:`classical_terms`): the default's path where the
        certification of the residue run fails (operators or tensors whose
        entries span many binades).
        """
        from .gemm import matmul  # noqa: PLC0415 - the classical fallback only (gemm sits beside this front end)

        xp = array_module(X)
        batch = X.ndim - self.ndim
        # each tensor scaled up by a power of two (exact) so that its largest intermediate result bound,
        # max|X| times the largest prefix product of the operators' infinity norms, lands near 2**1000, and
        # the result scaled back (one rounding): the products' roundings are scale-invariant, so this only
        # keeps intermediate results of tensors that span many binades out of the subnormal range, whose
        # absolute errors later operators would multiply past the bound
        ops = self._float_operators(xp, encoded=False)
        peak = self._norm_peak()
        e = xp.zeros(X.shape[:batch] + (1,) * self.ndim, np.int64)
        if X.size and self.ndim and math.isfinite(peak):
            amax = xp.max(xp.abs(X), axis=tuple(range(batch, X.ndim)), keepdims=True)
            top = xp.frexp(amax)[1].astype(np.int64) + math.frexp(peak)[1]
            e = xp.where(amax > 0, xp.clip(1000 - top, 0, 2000), 0)
        y = xp.ldexp(X, e.astype(np.int32))
        for A, ax in zip(ops, self.axes):
            moved_y = xp.moveaxis(y, batch + ax, 0)
            rest = moved_y.shape[1:]
            prod = matmul(A, moved_y.reshape(moved_y.shape[0], -1))
            y = xp.moveaxis(prod.reshape((A.shape[0],) + rest), 0, batch + ax)
        return xp.ldexp(y, (-e).astype(np.int32))

    def _norm_peak(self) -> float:
        """``max(1, max_k prod_{j <= k} ||A_j||_inf)`` of the operators as given (float64, computed once)."""
        if "norm peak" not in self._op_values:
            peak = prefix = 1.0
            for A in self.operators:
                A = np.asarray(A, dtype=np.float64)
                prefix *= float(np.abs(A).sum(axis=1).max()) if A.size else 0.0
                peak = max(peak, prefix)
            self._op_values["norm peak"] = peak
        return self._op_values["norm peak"]

    def _classical_bound(self, x, xnorm: Fraction) -> float:
        """``γ_m max |A_n| ... |A_1| |X|`` rounded up (the classical GEMMs' bound), plus their subnormal roundings."""
        m = self.classical_terms
        xp = array_module(x)
        mag = float(self._float64_products(xp.abs(x), [xp.abs(A) for A in self._float_operators(xp, encoded=False)]).max())
        bound = inflate(mag, m + len(self.operators) + 2) * (gamma(m) * (1 + 2.0**-40) + 2.0**-70)
        bound += 2.0**-1073 * math.prod(max(1, int(A.shape[1])) for A in self.operators) * len(self.operators)
        return self._reported(Fraction(inflate(bound, 4)), xnorm)
