"""The default (moduli=None) and rtol=: certified residue plans, escalated, else correctly rounded (default) or the
composed classical GEMMs (a target they meet)."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import opt_einsum

from ..arrays import array_module, is_device_array, to_module
from ..basis import int8_pool, moduli_count
from ..encode import as_basis, group_exponents
from ..errors import PlanError, RNSRangeError
from ..program.classical import certify, classical_terms, gamma
from ..run.exact import half_spacing
from ..run.escalate import certified_groups
from ..run.groups import evaluation, put_back
from ..run.policy import FALLBACK_PAIRWISE, default_target
from ..program.errors import inflate
from ..tensor import RNSTensor
from .gemm_shaped import gemm_elements, gemm_labels
from .parse import _C, _unique
from .planner import _exact_width, _rounds_inside, _shared_axes

__all__ = ["_ClassicalDefault", "_arranged", "_classical_pair", "_classical_single", "_prepared"]


class _ClassicalDefault:
    """The default evaluation (``moduli=None``) of a :class:`~rnstensor.ContractExpression` (a mixin of it: the
    expression on wider encodings and more moduli, built as ``type(self)``)."""

    # ----- the classical default ------------------------------------------------------------------

    #: The widest input encoding the escalation tries before the composed evaluation.
    _WIDEST = 160

    def _certifies(self, arrays) -> bool:
        """Whether this call is held to the classical bound (the default: ``moduli=None``, float operands)."""
        if not (self.classical and self.decode == "fp64" and self.bits is None and self.method == "rescale_be"):
            return False
        it = iter(arrays)
        for i in range(len(self.terms)):
            x = self.constants[i] if i in self.constants else next(it, None)
            if isinstance(x, RNSTensor):
                return False
        return True

    def _rung(self, cap: int, kinds: tuple, cplx: tuple) -> Optional["ContractExpression"]:
        """This expression with operands encoded at ``cap`` bits, on the fewest INT8 moduli its plan fits (cached)."""
        if cap == 53 and self.rtol is None:
            return self
        key = (cap, kinds, cplx)
        # a target may take fewer moduli than the default's 15, and any width (its certificate decides)
        fewest = len(self.basis) if self.rtol is None else 2
        if key not in self._rungs:
            self._rungs[key] = None
            for s in range(max(fewest, (2 * cap + 15) // 8), len(int8_pool()) + 1):
                expr = type(self)(self.terms, self.output, self.shapes, self.constants, as_basis(moduli_count(s), "moduli"),
                                  self.method, [tuple(p) for p in self.path], "fp64", cap, self.backend,
                                  self.min_bits if self.rtol is None else 0, self.nonfinite)
                try:
                    expr._plan(kinds, cplx, {})
                except PlanError:
                    continue
                self._rungs[key] = expr
                break
        return self._rungs[key]

    def _batch_label(self) -> Optional[str]:
        """The label along which the default decides per element: the first index of the first non-constant
        operand where that operand alone carries it, once, and the output keeps it (each element's result then
        reads that element alone: ``rnstensor.dask.apply``'s chunks); None where there is none."""
        first = next((i for i in range(len(self.terms)) if i not in self.constants), None)
        if first is None or not self.terms[first]:
            return None
        b = self.terms[first][0]
        alone = all(b not in t for i, t in enumerate(self.terms) if i != first) and self.terms[first].count(b) == 1
        return b if alone and b in self.output else None

    def _classical(self, arrays, backend, bound: bool):
        """The default evaluation: the residue program at the narrowest width whose result is certified to meet the
        classical float64 bound (:mod:`rnstensor.program.classical`, before it runs), else correctly rounded where one
        exact plan holds the operands, else the composed classical evaluation. Along :meth:`_batch_label`, per
        element: each element at the narrowest width certified for it alone
        (:func:`rnstensor.run.escalate.certified_groups`), the elements on one width run as one call."""
        if any(n == 0 for n in self.sizes.values()):  # nothing to certify: the zeros of an empty contraction
            return self._bound(arrays, backend, "fp64") if bound else self._run(arrays, backend, track=False)
        batch = self._batch_label()
        n = self.sizes[batch] if batch is not None else 1
        # one GEMM (of finite operands): each element on the moduli dgemm (zgemm) chooses for it alone, its bits
        labels = gemm_labels(self)
        routed = gemm_elements(self, labels, self._operands(arrays), backend, batch, bound) if labels else None
        if routed is None:
            y, said = self._escalated(arrays, backend, bound, batch, n)
            self.last_evaluation = evaluation(said, n, "elements")
            return y
        parts, said, left, xp = routed
        if left is not None:  # (the elements dgemm would split: the certificate's escalation, each alone)
            sub, args = self._elements(arrays, batch, left) if batch is not None else (self, arrays)
            y, more = sub._escalated(args, backend, bound, batch, int(left.shape[0]))
            parts.append((left if batch is not None else None, y))
            for how, count in more.items():
                said[how] = said.get(how, 0) + count
        self.last_evaluation = evaluation(said, n, "elements")
        return put_back(parts, n, xp, self.output.index(batch) if batch is not None else 0)

    def _escalated(self, arrays, backend, bound: bool, batch: Optional[str], n: int) -> tuple:
        """``(result, said)`` of the certificate's path: each element along ``batch`` (``n`` of them) at the narrowest
        width certified for it alone, else the fallback (``said``: evaluation -> elements)."""
        # the elements' sub-calls, each parsed and scanned once: by their index array (None: the whole call), kept
        # alive here so that its id names it (the indices may live on the device: nothing is read back)
        calls: dict = {}

        def call(idx) -> _ElementsCall:
            if id(idx) not in calls or calls[id(idx)][0] is not idx:
                calls[id(idx)] = (idx, _ElementsCall(self, arrays, backend, batch, idx))
            return calls[id(idx)][1]

        def certify_at(cap: int, idx):
            c = call(idx)
            found = c.at(cap)
            if found is None:  # no plan at this width: the fallback's
                size = c.sub.sizes[batch] if batch is not None else 1
                return c.xp.zeros(size, bool), c.xp.full(size, np.nan), c.xp.zeros(size, bool)
            obs, m, target = found[2:]
            ok, excess = obs.verdicts(m, target)
            return ok, excess, obs.exacts() if m <= 1 else array_module(ok).zeros(ok.shape, bool)

        def next_keys(cap: int, excess, failed):  # each element's next width, from its own excess (its verdicts')
            xp = array_module(excess)
            return xp.where(failed, cap + xp.maximum(8, xp.ceil(xp.log2(xp.where(failed, excess, 1.0))) + 2), math.inf)

        # a target starts at the width it asks for (a loose one, narrower and on fewer moduli), the default at 53
        first = 53 if self.rtol is None else min(53, max(8, math.ceil(-math.log2(self.rtol)) + 8))
        groups = certified_groups((first, first), certify_at, next_keys,
                                  lambda cap: (cap if cap <= self._WIDEST else None, cap), n)
        parts, said = [], {}  # (the evaluations, with their elements)
        for cap, exact, idx in groups:
            c = call(idx)
            parts.append((idx, c.fallback(bound) if cap is None else c.run(cap, exact, bound)))
            count = n if idx is None else int(idx.shape[0])
            said[c.sub.last_evaluation] = said.get(c.sub.last_evaluation, 0) + count
        return put_back(parts, n, call(None).xp, self.output.index(batch) if batch is not None else 0), said

    def _elements(self, arrays, batch: Optional[str], idx) -> tuple:
        """``(expression, arrays)`` of the elements ``idx`` along ``batch`` (None: this call's)."""
        if idx is None:
            return self, arrays
        first = next(i for i in range(len(self.terms)) if i not in self.constants)
        axis = self.terms[first].index(batch)
        shape = list(self.shapes[first])
        shape[axis] = int(idx.shape[0])
        if tuple(shape) not in self._rungs:  # (cached with the rungs: its own rungs stay planned)
            self._rungs[tuple(shape)] = self.with_shapes(*[tuple(shape) if i == first else self.shapes[i]
                                                           for i in range(len(self.terms)) if i not in self.constants])
        args = list(arrays)
        xp = array_module(idx)
        args[0] = xp.take(xp.asarray(args[0]), idx, axis=axis)
        return self._rungs[tuple(shape)], args


    def _composed_classical(self, arrays, bound: bool, parsed: tuple):
        """Each pairwise step by the classical GEMM (:func:`rnstensor.matmul`), decoded in between.

        Steps meeting ``γ_k |X||Y|`` compose to ``γ_(k1 + k2 + ...)`` of the
        magnitudes: the fallback for operands the residue certification
        refuses (slices spanning hundreds of binades) or that would need more
        than 49 moduli.
        """
        ops, kinds, cplx, _, nonfinite = parsed
        _, xp, _ = self._backend(ops, kinds, None)
        vals = [(_prepared(t, self.sizes, self.constants[i] if kinds[i] == "const" else x, xp), _unique(t))
                for i, (t, x) in enumerate(zip(self.terms, ops))]
        if bound:
            m = classical_terms(self._plan(kinds, cplx, {}), self.sizes)
            terms = math.prod(self.sizes.values())  # every product of the whole contraction, for the underflows
            # complex: each step's ZGEMM meets sqrt(2) γ_(k+2) |X||Y|, and |Re err| + |Im err| <= sqrt(2) |err|
            factor = 2 * gamma(m + 2 * len(self._info.contraction_list)) if any(cplx) else gamma(m)
            with np.errstate(over="ignore", under="ignore"):
                mag = opt_einsum.contract(",".join(lab for _, lab in vals) + "->" + self.output,
                                          *[xp.abs(v) for v, _ in vals],
                                          optimize=[tuple(p) for p in self.path])
                D = inflate(inflate(mag, m + len(self.terms)) * (factor * (1 + 2.0**-40) + 2.0**-70)
                            + terms * 2.0**-1072, 4)
            if nonfinite:
                ref = self._float64_reference(arrays)
                D = xp.where(xp.isfinite(ref), D, np.inf)
            return D
        for inds, _, einsum_str, _, _ in self._info.contraction_list:
            out = einsum_str.split("->")[1]
            group = [vals.pop(i) for i in inds]
            while len(group) > 1:
                keep = out + "".join(lab for _, lab in group[2:])
                group = [_classical_pair(*group[0], *group[1], keep)] + group[2:]
            vals.append(_classical_single(*group[0], out))
        (y, lab), = vals
        y = _arranged(y, lab, self.output)
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y


class _ElementsCall:
    """Some elements of a default call (:meth:`_ClassicalDefault._classical`): their expression and operands, parsed
    once; the certified plan at each width; their run on a width, or their fallback."""

    def __init__(self, expr, arrays, backend, batch: Optional[str], idx):
        self.sub, self.args = expr._elements(arrays, batch, idx)
        self.backend, self.batch = backend, batch
        self.parsed = self.sub._operands(self.args)
        ops, kinds, cplx, _, _ = self.parsed
        _, self.xp, _ = self.sub._backend(ops, kinds, backend)  # where the non-constant operands live
        self.leaf = self.sub._leaves(ops, kinds, cplx, self.xp)
        self.widths = None
        self.plans: dict = {}

    def at(self, cap: int) -> Optional[tuple]:
        """``(expression, widths used, certificate, m, target)`` at ``cap`` bits (cached), None where none plans."""
        if cap not in self.plans:
            self.plans[cap] = self._certified(cap)
        return self.plans[cap]

    def _certified(self, cap: int) -> Optional[tuple]:
        sub, leaf = self.sub, self.leaf
        ops, kinds, cplx, _, _ = self.parsed
        expr = sub._rung(cap, kinds, cplx)
        if expr is None:
            return None
        plan, used = expr._plan(kinds, cplx, {}), None
        if _rounds_inside(plan, cap):
            # operands float64 holds in fewer bits (integers, short mantissas) encoded no wider: exactly, with
            # their data's bound; where that makes the whole plan exact, the result is the exact integer, as
            # numpy's float64 is on such data. Otherwise the plan as planned (the explicit basis's, bit for bit).
            if self.widths is None:
                self.widths = tuple(_exact_width(leaf(i), _shared_axes((_C if cplx[i] else "") + _unique(t), sub.output))
                                    for i, t in enumerate(sub.terms))
            if min(self.widths, default=math.inf) < cap:
                exact = expr._plan(kinds, cplx, {}, self.widths)
                if exact.kept_bits == math.inf:
                    plan, used = exact, self.widths
        m = classical_terms(plan, sub.sizes)
        target = default_target(m, sub.rtol)  # the default's: (1 + 2**-5) u of the magnitudes (run/policy.py)
        per = (self.batch, sub.sizes[self.batch]) if self.batch is not None else ()

        def exponents(st):  # what the encode gives each slice (encode: e = bits - E, the value 2**-e times the integer)
            return -group_exponents(leaf(st), st.bits, st.shared, self.xp)

        return expr, used, certify(plan, leaf, exponents, m, target, *per, xp=self.xp), m, target

    def run(self, cap: int, exact: bool, bound: bool):
        """The elements' result (``bound``: their error bound) at ``cap`` bits, certified for each of them."""
        expr, used = self.at(cap)[:2]
        mode = "exact" if exact else "fp64"
        self.sub.last_evaluation = f"{len(expr.basis)} moduli, {cap} bits"
        if bound:
            return expr._bound(self.args, self.backend, mode, self.parsed, used)
        y = expr._fused(self.parsed, self.backend, used, mode)
        if y is not None:
            return y
        T, plan, _, be_name, nonfinite = expr._run(self.args, self.backend, False, self.parsed, used, mode)
        return expr._finish(T, plan, be_name, nonfinite, self.args, mode)

    def fallback(self, bound: bool):
        """No width certified: the correctly rounded result (moduli='auto', within any target) where one exact plan
        of at most 49 moduli holds it, else each element alone (so that no element's path depends on the others'),
        else the composed classical GEMMs (the bound gamma_m), where they meet the target."""
        sub = self.sub
        try:
            y = sub._auto(self.args, self.backend, FALLBACK_PAIRWISE)
        except RNSRangeError:
            n = sub.sizes[self.batch] if self.batch is not None else 1
            if n > 1:
                parts, said = [], {}
                for t in range(n):
                    at = self.xp.arange(t, t + 1)
                    one = _ElementsCall(sub, self.args, self.backend, self.batch, at)
                    parts.append((at, one.fallback(bound)))
                    said[one.sub.last_evaluation] = said.get(one.sub.last_evaluation, 0) + 1
                sub.last_evaluation = evaluation(said, n, "elements")
                return put_back(parts, n, self.xp, sub.output.index(self.batch))
            if sub.rtol is not None:
                ops, kinds, cplx, _, _ = self.parsed
                m = classical_terms(sub._plan(kinds, cplx, {}), sub.sizes)
                meets = 2 * gamma(m + 2 * len(sub._info.contraction_list)) if any(cplx) else gamma(m)
                if sub.rtol < meets:  # the correctly rounded value meets any target, as moduli='auto' takes it
                    y = sub._auto(self.args, self.backend)
                    sub.last_evaluation = f"correctly rounded ({sub.last_evaluation})"
                    return half_spacing(y) if bound else y
            sub.last_evaluation = "composed classical GEMMs"
            return sub._composed_classical(self.args, bound, self.parsed)
        sub.last_evaluation = f"correctly rounded ({sub.last_evaluation})"
        return half_spacing(y) if bound else y


def _arranged(x, labels: str, order: str, sizes: Optional[dict] = None):
    """``x`` (axes ``labels``) with its axes in ``order``; labels it lacks are broadcast to ``sizes``."""
    xp = array_module(x)
    present = [c for c in order if c in labels]
    x = x.transpose([labels.index(c) for c in present]) if present != list(labels) else x
    if len(present) == len(order):
        return x
    dims = iter(x.shape)
    x = x.reshape([next(dims) if c in labels else 1 for c in order])
    return xp.broadcast_to(x, [sizes[c] for c in order])


def _classical_pair(x, xl: str, y, yl: str, keep: str):
    """``x`` and ``y`` (float64 or complex128) summed over their labels absent from ``keep``, as batched classical GEMMs."""
    from ..gemm import matmul  # noqa: PLC0415 - the fallback of the classical default only

    sizes = dict(zip(xl, x.shape)) | dict(zip(yl, y.shape))
    batch = "".join(c for c in xl if c in yl and c in keep)
    xk = "".join(c for c in xl if c not in yl and c in keep)
    yk = "".join(c for c in yl if c not in xl and c in keep)
    summed = "".join(c for c in dict.fromkeys(xl + yl) if c not in keep)
    n = lambda labels: math.prod(sizes[c] for c in labels)  # noqa: E731
    X = _arranged(x, xl, batch + xk + summed, sizes).reshape(n(batch), n(xk), n(summed))
    Y = _arranged(y, yl, batch + summed + yk, sizes).reshape(n(batch), n(summed), n(yk))
    Z = matmul(X, Y)
    return Z.reshape([sizes[c] for c in batch + xk + yk]), batch + xk + yk


def _classical_single(x, xl: str, out: str):
    """``x`` summed over its labels absent from ``out`` (a classical GEMM with a column of ones), axes as ``out``."""
    from ..gemm import matmul  # noqa: PLC0415

    summed = "".join(c for c in xl if c not in out)
    kept = "".join(c for c in xl if c in out)
    if summed:
        sizes = dict(zip(xl, x.shape))
        X = _arranged(x, xl, kept + summed).reshape(-1, math.prod(sizes[c] for c in summed))
        ones = array_module(x).ones(X.shape[1])
        x = matmul(X, ones).reshape([sizes[c] for c in kept])
    return _arranged(x, kept, out), out


def _prepared(term: str, sizes: dict, x, xp):
    """An operand with its diagonals taken and broadcast to the full sizes, float64 or complex128, on ``xp``."""
    x = to_module(x, xp) if array_module(x) is not xp else xp.asarray(x)
    labels = _unique(term)
    if labels != term:
        x = xp.einsum(f"{term}->{labels}", x)  # a diagonal is a selection: exact
    x = xp.broadcast_to(x, tuple(sizes[c] for c in labels))
    return x.astype(np.complex128 if xp.iscomplexobj(x) else np.float64, copy=False)
