"""ContractExpression: an einsum expression planned once, run on new operands in residues, decoded, bounded."""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Callable, Optional

import numpy as np
import opt_einsum

from ..arrays import array_module, is_device_array, to_module
from ..backends import dispatch
from ..basis import Basis, int8_pool
from ..encode import check_nonfinite, exact_bits_needed, finite_part, group_exponents
from ..errors import PlanError, RNSRangeError
from ..planner.methods import MIN_BITS, check_kept_bits
from ..planner.program import Failure, Given, plan_drops
from ..primitives import decode as decode_tensor
from .. import ir
from ..ir.lower import FusionRequest
from ..program.classical import classical_terms
from ..program.errors import EntrywiseErrors, decoded
from ..program.execute import DeferredValue, ProductValue, Value, execute, moved, permuted, tensor_of, value_of
from ..run.exact import half_spacing, least_moduli
from ..run.fusion import fused_program
from ..tensor import RNSTensor
from .auto import _CorrectlyRounded
from .classical import _ClassicalDefault
from .operands import _as_float, _leaf_array, _operand_kind, _tensor_broadcast, _tensor_diagonal
from .parse import _C, _label_sizes, _path_option, _unique
from .planner import _Planner

__all__ = ["ContractExpression"]


def _package_encode_leaf(x, basis: Basis, bits: int, shared: tuple[int, ...], be=None, xp=None) -> RNSTensor:
    """:func:`~rnstensor.contract.operands._encode_leaf` looked up in the package ``rnstensor.contract`` at each call:
    tests replace it there to count the encodings (``monkeypatch.setattr(rnstensor.contract, "_encode_leaf", f)``)."""
    return sys.modules[__package__]._encode_leaf(x, basis, bits, shared, be, xp)


# ----- the expression -----------------------------------------------------------------------


class ContractExpression(_CorrectlyRounded, _ClassicalDefault):
    """An einsum expression planned once and applied to new operands in the residue domain.

    Build it with :func:`contract_expression`. Call it with the non-constant
    operands in order; ``explain()`` shows the path and every residue step.

    Attributes
    ----------
    subscripts : str
        The explicit form ``'ij,jk->ik'`` (``...`` expanded).
    basis : Basis
    method : str
    decode : str or None
    path : list of tuple
        opt_einsum's contraction path.
    """

    def __init__(self, terms, output, shapes, constants, basis, method, optimize, decode, bits, backend=None, min_bits=MIN_BITS,
                 nonfinite="propagate", policy="basis", rtol=None):
        self.terms, self.output = list(terms), output
        self.subscripts = ",".join(terms) + "->" + output
        self.shapes = [tuple(int(n) for n in s) for s in shapes]
        self.constants = dict(constants)
        self.basis, self.method, self.decode, self.backend = basis, method, decode, backend
        self.bits, self.min_bits = bits, min_bits
        self.nonfinite = check_nonfinite(nonfinite)
        if isinstance(policy, bool):  # (the former flag: the classical default or an explicit basis)
            policy = "classical" if policy else "basis"
        #: the accuracy policy of moduli= (:mod:`rnstensor.run.policy`): 'classical', 'fast', 'auto' or 'basis'
        self.policy = policy
        self.classical = policy == "classical"
        #: the target of the default in place of the classical bound (``rtol (|A||B|...)`` entry by entry), or None
        self.rtol = rtol
        self.sizes = _label_sizes(terms, self.shapes)
        opt, limit = _path_option(optimize, len(self.terms))
        self.path, self._info = opt_einsum.contract_path(
            self.subscripts, *self.shapes, shapes=True, optimize=list(opt) if isinstance(opt, tuple) else opt,
            memory_limit=limit,
        )
        self._plans: dict = {}
        self._const_cache: dict = {}
        self._rungs: dict = {}
        #: How the last default (classical) call was evaluated: ``'15 moduli, 53 bits'`` (certified residues) or
        #: ``'composed classical GEMMs'``; None before one. :meth:`error_bound` leaves it as the last call set it.
        self.last_evaluation: Optional[str] = None

    def with_shapes(self, *shapes) -> "ContractExpression":
        """The same expression for other operand shapes (one per non-constant), sharing the encoded constants.

        Used to apply one expression to batches of different sizes (e.g. the
        chunks of a Dask array): the constants' residues are encoded once and
        shared as long as the constants' own index sizes are unchanged.
        """
        it = iter(shapes)
        full = [self.shapes[i] if i in self.constants else tuple(int(d) for d in next(it)) for i in range(len(self.terms))]
        other = ContractExpression(
            # the same path: the same plan, so each batch entry gets the same integers however it is split
            self.terms, self.output, full, self.constants, self.basis, self.method, [tuple(p) for p in self.path],
            self.decode, self.bits, self.backend, self.min_bits, self.nonfinite, self.policy, self.rtol,
        )
        const_labels = {c for i in self.constants for c in self.terms[i]}
        if all(other.sizes[c] == self.sizes[c] for c in const_labels):
            other._const_cache = self._const_cache
        return other

    @property
    def num_args(self) -> int:
        """How many operands a call takes (the non-constants)."""
        return len(self.terms) - len(self.constants)

    def _cap(self) -> int:
        if self.bits is not None:
            return self.bits
        return self.basis.product.bit_length() if self.decode == "exact" else 53

    def _plan(self, kinds: tuple, cplx: tuple, tensors: dict, widths: Optional[tuple] = None) -> ir.Program:
        """The program for these operand kinds; ``widths``: the widths at which the operands encode exactly (an
        operand is encoded no wider)."""
        key = (kinds, cplx, widths)
        if tensors or key not in self._plans:
            consts = {i: self._const_array(i, cplx[i]) for i in self.constants}

            def planned(cap: int) -> ir.Program:
                return _Planner(self.terms, self.output, self.sizes, kinds, cplx, consts, tensors, self.basis,
                                self.method, cap, exact=self.decode == "exact", widths=widths
                                ).run(self._info.contraction_list)

            try:
                plan = planned(self._cap())
            except PlanError:
                if self.decode != "exact" or self.bits is not None:
                    raise
                # without drops the first contractions must leave range for the later ones: the widest common
                # input width at which no operand has to give up bits (planning is bounds only)
                def balanced(cap: int) -> bool:
                    try:
                        p = planned(cap)
                    except PlanError:
                        return False
                    return all(st.bits >= cap for st in p.steps if isinstance(st, ir.Encode))

                lo, hi = 0, self._cap()
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if balanced(mid) else (lo, mid)
                plan = planned(max(lo, 1))  # raises the planner's own error when even width 1 does not fit
            checked = plan_drops(plan, {}, Given([]))  # every range of the program, by the one planner
            if isinstance(checked, Failure):  # pragma: no cover - the expression's planner and the check disagree
                raise PlanError(f"einsum: the plan for {self.subscripts!r} fails its range check: {checked}")
            check_kept_bits(f"einsum: on {self.basis!r} the plan for {self.subscripts!r}", plan.kept_bits,
                            self.min_bits, self._cap(),
                            (lambda: self._plan_fixes(kinds, cplx, tensors, widths)) if self._hints else "",
                            lower=self.decode != "exact")
            if tensors:
                return plan
            if widths is not None and len(self._plans) > 64:  # plans for the data's widths: a bounded cache
                self._plans.clear()
            self._plans[key] = plan
        return self._plans[key]

    #: whether a refused plan searches the fixes it names (off for the plans that search)
    _hints = True

    def _plan_fixes(self, kinds: tuple, cplx: tuple, tensors: dict, widths: Optional[tuple]) -> str:
        """The fixes of a plan that keeps too few bits, each checked to plan when followed: the fewest INT8 moduli
        that plan it; for an exact decode, ``moduli='auto'`` (which chooses moduli and widths from the data: the
        moduli an exact decode needs depend on the data's widths, which a plan does not know) or the fp64 decode."""
        fixes = []

        def plans(basis: Basis, decode: str) -> bool:
            other = type(self)(self.terms, self.output, self.shapes, self.constants, basis, self.method,
                               [tuple(p) for p in self.path], decode, self.bits, self.backend, self.min_bits,
                               self.nonfinite, self.policy, self.rtol)
            other._hints = False  # (its own refusal names no fixes: no search inside the search)
            try:
                other._plan(kinds, cplx, tensors, widths)
            except PlanError:
                return False
            return True

        def fewest(decode: str) -> Optional[int]:
            if len(self.basis) >= len(int8_pool()):
                return None
            return least_moduli(lambda s: plans(Basis.int8(s), decode), len(self.basis) + 1)

        if not tensors and self.decode != "exact":  # (RNSTensor operands carry their basis)
            s = fewest(self.decode)
            if s is not None:
                fixes.append(f"use more moduli (moduli={s} plans it)")
        if self.decode == "exact" and self.bits is None and not tensors:
            # the fp64 decode keeps min_bits too: on this basis it may be refused as well, so name the moduli it takes
            fp64 = "decode='fp64'"
            if not plans(self.basis, "fp64"):
                s = fewest("fp64")
                fp64 = f"decode='fp64' with moduli={s}" if s is not None else None
            fixes.append("moduli='auto' (the correctly rounded result decode='exact' asks for, on the moduli and "
                         "widths the data needs)" + (f", or {fp64}" if fp64 else ""))
        return "; or ".join(fixes)

    def _const_array(self, i: int, cplx: bool, xp=np):
        """Constant ``i`` as encoded (diagonal, broadcast, parts stacked), in the array module ``xp`` (cached)."""
        key = ("array", i)
        if key not in self._const_cache:
            const = self.constants[i]
            self._const_cache[key] = _leaf_array(self.terms[i], self.sizes, const, cplx, array_module(const))
        host_or_dev = self._const_cache[key]
        if array_module(host_or_dev) is xp:
            return host_or_dev
        dkey = ("array", i, xp.__name__)
        if dkey not in self._const_cache:
            self._const_cache[dkey] = to_module(host_or_dev, xp)
        return self._const_cache[dkey]

    def _operands(self, arrays) -> tuple[list, tuple, tuple, dict, bool]:
        if len(arrays) != self.num_args:
            raise ValueError(
                f"this expression takes {self.num_args} operand(s) (the non-constants of {self.subscripts!r}); got {len(arrays)}"
            )
        it = iter(arrays)
        ops, kinds, cplx, tensors, nonfinite = [], [], [], {}, False
        for i in range(len(self.terms)):
            if i in self.constants:
                x = self.constants[i]
                k, c = _operand_kind(x, i)
                ops.append(x)
                kinds.append("const")
                cplx.append(c)
                continue
            x = _as_float(next(it), i)
            k, c = _operand_kind(x, i)
            shape = x.shape if isinstance(x, RNSTensor) else np.shape(x)
            if tuple(shape) != self.shapes[i]:
                raise ValueError(f"operand {i} has shape {tuple(shape)}; this expression was built for {self.shapes[i]}")
            if k == "tensor":
                if _unique(self.terms[i]) != self.terms[i]:
                    x = _tensor_diagonal(x, self.terms[i])  # repeated indices: take the diagonal first
                x = _tensor_broadcast(x, _unique(self.terms[i]), self.sizes)
                tensors[i] = x
            else:
                x = x if is_device_array(x) else np.asarray(x)
                x, bad = finite_part(x)
                if bad and self.nonfinite == "raise":
                    raise ValueError(f"einsum: operand {i} holds inf or NaN (nonfinite='raise'); residues hold finite "
                                     f"values only")
                nonfinite = nonfinite or bad
            ops.append(x)
            kinds.append(k)
            cplx.append(c)
        return ops, tuple(kinds), tuple(cplx), tensors, nonfinite

    def _backend(self, ops, kinds, backend):
        """The backend and array module of a call: its non-constant operands' (CuPy runs on 'cuda'; no mixing)."""
        arrays = [x.residues if isinstance(x, RNSTensor) else x for x, k in zip(ops, kinds) if k != "const"]
        names = tuple(f"operand {i}" for i, k in enumerate(kinds) if k != "const")
        be_name = backend or self.backend
        be, xp = dispatch(*arrays, backend=be_name, names=names, fn="einsum")
        return be, xp, (be.name if xp is not np else be_name)

    def __call__(self, *arrays, backend: Optional[str] = None):
        """Contract new operands (the non-constants, in order); returns what ``decode`` says.

        NumPy operands give NumPy results on the CPU backend, CuPy operands
        CuPy results on the CUDA backend (constants may be either: they are
        encoded once per device).
        """
        if self.policy == "auto":
            return self._auto(arrays, backend)
        if self._certifies(arrays):
            return self._classical(arrays, backend, bound=False)
        parsed = self._operands(arrays)
        if self.decode in ("fp64", "exact"):
            y = self._fused(parsed, backend, None, self.decode)
            if y is not None:
                return y
        out = self._run(arrays, backend, track=False, parsed=parsed, mode=self.decode)
        if not isinstance(out, tuple):
            return out
        T, plan, _, be_name, nonfinite = out
        if self.decode is None:
            if nonfinite:
                raise ValueError("einsum: decode=None cannot carry inf or NaN operands (residues are finite)")
            return T
        return self._finish(T, plan, be_name, nonfinite, arrays, self.decode)

    def _finish(self, T, plan, be_name, nonfinite, arrays, mode: str):
        """The result of :meth:`_run`'s ``T`` decoded by ``mode`` (``T`` already decoded where ``_run`` was told
        ``mode`` and its engine decoded it), numpy's inf and NaN where they enter."""
        y = decode_tensor(T, mode, backend=be_name) if isinstance(T, RNSTensor) else T
        if plan.complex:
            y = y[0] + 1j * y[1]
        if nonfinite:
            y = self._numpy_where_nonfinite(y, arrays)
        return y[()] if y.ndim == 0 and not is_device_array(y) else y

    def _float64_reference(self, arrays):
        """numpy's float64 einsum of the call's operands (where they live): what it gives where an inf or NaN enters."""
        it = iter(arrays)
        ops = [self.constants[i] if i in self.constants else next(it) for i in range(len(self.terms))]
        xp = array_module(*[x for x in ops if not isinstance(x, RNSTensor)])
        ops = [decode_tensor(x, "exact") if isinstance(x, RNSTensor) else x for x in ops]
        with np.errstate(invalid="ignore", over="ignore"):
            return xp.einsum(self.subscripts, *ops)

    def _numpy_where_nonfinite(self, y, arrays):
        # an output that meets an inf or NaN in float64 is inf or NaN there (inf * 0 is NaN, inf + -inf too), so
        # every other output never reads one: computed with those entries zeroed, it is the exact result
        ref = self._float64_reference(arrays)
        xp = array_module(ref)
        return xp.where(xp.isfinite(ref), y, ref.astype(y.dtype, copy=False))

    def error_bound(self, *arrays, backend: Optional[str] = None) -> np.ndarray:
        """A rigorous bound on the absolute error of every entry of ``self(*arrays)``.

        The plan is replayed with a running error analysis
        (:class:`rnstensor.program.errors.EntrywiseErrors`): each operand's
        encoding error (half a unit of its slice), each drop (under one unit
        of the quotient), every product and sum of those (``|x̂ŷ - xy| <=
        D_x M_y + M_x D_y`` with magnitude bounds ``M``), and the final decode
        (``'fp64'``: its faithful rounding; ``'exact'``: half an ulp). For complex
        results it bounds ``|Re err| + |Im err|``. Operands given as
        RNSTensors count as exact. The bound's own float64 arithmetic is
        inflated to stay an upper bound. Computed where the operands live
        (a CuPy array for CuPy operands).

        Examples
        --------
        >>> import numpy as np, rnstensor as rt
        >>> a = np.random.default_rng(0).uniform(-1, 1, (4, 8))
        >>> expr = rt.contract_expression("ij,kj->ik", a.shape, a.shape)
        >>> err = np.abs(expr(a, a) - a @ a.T)
        >>> bool((expr.error_bound(a, a) >= 0).all())
        True
        """
        if self.decode is None:
            raise ValueError("error_bound: this expression returns RNSTensors (decode=None); nothing is rounded")
        said = self.last_evaluation  # the bound replays the call's paths: last_evaluation stays the call's
        try:
            return self._error_bound(arrays, backend)
        finally:
            self.last_evaluation = said

    def _error_bound(self, arrays, backend):
        if self.policy == "auto":  # correctly rounded: within half the spacing at the result (per part)
            return half_spacing(self._auto(arrays, backend))
        if self._certifies(arrays):
            return self._classical(arrays, backend, bound=True)
        return self._bound(arrays, backend, self.decode)

    def _bound(self, arrays, backend, mode: str, parsed: Optional[tuple] = None, widths: Optional[tuple] = None):
        out = self._run(arrays, backend, True, parsed, widths)
        if not isinstance(out, tuple):
            return array_module(out).zeros(np.shape(out))
        T, plan, (M, D), _, nonfinite = out
        D = decoded(M, D, T, mode)
        if plan.complex:
            D = D[0] + D[1]
        if nonfinite:  # an inf or NaN result is reported with an infinite bound
            ref = self._float64_reference(arrays)
            D = array_module(D).where(array_module(ref).isfinite(ref), D, np.inf)
        return D

    def _leaves(self, ops, kinds, cplx, xp) -> Callable:
        """``leaf(step)``: an :class:`~.ir.Encode` step's operand (or operand ``i``'s) as encoded (constants from the
        cache), made once."""
        leaves: dict = {}

        def leaf(st):
            i = st if isinstance(st, int) else st.source
            if i not in leaves:
                leaves[i] = (self._const_array(i, cplx[i], xp) if kinds[i] == "const"
                             else _leaf_array(self.terms[i], self.sizes, ops[i], cplx[i], xp))
            return leaves[i]

        return leaf

    def _run(self, arrays, backend, track: bool, parsed: Optional[tuple] = None, widths: Optional[tuple] = None,
             mode: Optional[str] = None):
        """Execute on ``arrays`` (``parsed``: their :meth:`_operands`, where the caller has them; ``widths``: see
        :meth:`_plan`); ``(T, plan, magnitudes and errors where tracked, backend name, nonfinite)``. ``mode``: the
        decode :meth:`_finish` gives ``T`` next; with ``'exact'``, a last product the backend's exact GEMM engine
        took comes decoded by it in place of ``T`` (the bits of ``T`` decoded exactly, its planes never made)."""
        ops, kinds, cplx, tensors, nonfinite = parsed or self._operands(arrays)
        out_cplx = any(cplx)
        if tensors and out_cplx:
            raise TypeError("einsum: complex operands cannot be mixed with RNSTensor operands (those are real)")
        be, xp, be_name = self._backend(ops, kinds, backend)
        out_shape = tuple(self.sizes[c] for c in self.output)
        if any(n == 0 for n in self.sizes.values()):
            if self.decode is None:
                raise ValueError("einsum: decode=None needs non-empty operands")
            z = xp.zeros(out_shape, np.complex128 if out_cplx else np.float64)
            return z[()] if z.ndim == 0 and xp is np else z  # a 0-d result is a scalar, as numpy's
        plan = self._plan(kinds, cplx, tensors, widths)
        leaf = self._leaves(ops, kinds, cplx, xp)

        # operands of a plain GEMM step that the backend's exact GEMM engine takes: their planes are not needed
        takes = getattr(be, "takes_product", None)
        size = lambda labels: math.prod(self.sizes[c] for c in labels)  # noqa: E731

        def engine_takes(st) -> bool:
            sides = st.gemm_sides()
            # (no complex-part or internal axis)
            if takes is None or sides is None or not all(c in self.sizes for c in st.x_labels + st.y_labels):
                return False
            m, n = (size(st.x_keep), size(st.y_keep))[:: 1 if sides == "xy" else -1]
            return takes(m, n, size(st.contracted), len(self.basis), st.bound)

        gemm_slots = {slot for st in plan.steps if isinstance(st, ir.Contract) and engine_takes(st)
                      for slot in (st.x, st.y)}

        def encoded(st):
            i = st.source
            labels = (_C if cplx[i] else "") + _unique(self.terms[i])
            if kinds[i] != "const" and st.out in gemm_slots and not cplx[i]:
                self._check_exact(i, leaf(st), st, widths)
                return DeferredValue(
                    lambda: value_of(_package_encode_leaf(leaf(st), self.basis, st.bits, st.shared, be, xp), labels,
                                     st.bound, xp).planes,
                    -group_exponents(leaf(st), st.bits, st.shared, xp), 1, st.bound, labels, leaf(st))
            if kinds[i] != "const":
                self._check_exact(i, leaf(st), st, widths)
                T = _package_encode_leaf(leaf(st), self.basis, st.bits, st.shared, be, xp)
                v = value_of(T, labels, st.bound, xp)
            else:
                v = self._const_value(st, cplx[i], xp)
            v.source = leaf(st)  # (an exact GEMM engine may take the product from the floats)
            return v

        observer = EntrywiseErrors(self.basis, leaf) if track else None
        vals = execute(plan, be, be_name, xp, encoded=encoded, operand=lambda st: ops[st.source],
                       tables=getattr(be, "constants", None), observer=observer)
        Z = vals[plan.out]
        if mode == "exact" and not track and isinstance(Z, ProductValue) and Z.factor == 1:
            y = Z.exact().transpose([Z.labels.index(c) for c in plan.out_labels])
            return xp.ascontiguousarray(y), plan, None, be_name, nonfinite
        planes, exp = permuted(Z, plan.out_labels)
        W = Value(xp.ascontiguousarray(planes), exp.total().astype(np.int64, order="C", copy=False), Z.factor, Z.bound,
                  plan.out_labels)
        MD = None
        if track:
            perm = [Z.labels.index(c) for c in plan.out_labels]
            MD = tuple(xp.broadcast_to(z, Z.planes.shape[1:]).transpose(perm) for z in observer.err[plan.out])
        return tensor_of(W, self.basis), plan, MD, be_name, nonfinite

    def _const_value(self, st, cplx: bool, xp):
        """The constant of the :class:`~.ir.Encode` step ``st`` encoded (once per width, copied once per device)."""
        i = st.source
        labels = (_C if cplx else "") + _unique(self.terms[i])
        key = ("enc", i, st.bits, cplx, self.basis.moduli)  # (the cache is shared by the rungs of other bases)
        if key not in self._const_cache:
            self._check_exact(i, self._const_array(i, cplx), st)
            T = _package_encode_leaf(self._const_array(i, cplx), self.basis, st.bits, st.shared)
            self._const_cache[key] = value_of(T, labels, st.bound)
        v = self._const_cache[key]
        if array_module(v.planes) is not xp:  # a constant encoded on the other side: copied once
            dkey = key + (xp.__name__,)
            if dkey not in self._const_cache:
                self._const_cache[dkey] = moved(v, xp)
            v = self._const_cache[dkey]
        return Value(v.planes, v.exp, v.factor, v.bound, labels)

    def _fused(self, parsed: tuple, backend, widths: Optional[tuple], mode: str):
        """This call decoded by ``mode``, its program run block by block in cache by the backend's fused interpreter
        (``compile_program``: the CPU's :mod:`rnstensor.backends.cpu_fused`, the CUDA chain kernel): the bits of
        :meth:`_run` and its decode, or ``None`` where it does not run it (complex, RNSTensor or non-finite
        operands; steps other than mode products of one tensor by matrices (constants, or on the CPU 2-D operands
        encoded for this call), drops and extensions; batch axes other than one leading label)."""
        ops, kinds, cplx, tensors, nonfinite = parsed
        if (tensors or nonfinite or any(cplx) or "input" not in kinds or mode not in ("fp64", "exact")
                or any(n == 0 for n in self.sizes.values())):
            return None
        be, xp, _ = self._backend(ops, kinds, backend)
        if not callable(getattr(be, "compile_program", None)):
            return None
        plan = self._plan(kinds, cplx, tensors, widths)
        inputs = [st for st in plan.steps if isinstance(st, ir.Encode) and not st.constant]
        enc = max(inputs, key=lambda st: len(st.labels))  # the tensor; any other input must be a matrix
        matrices = [st for st in inputs if st is not enc]
        # (matrices encoded for this call are packed as constants: host residues, so on the CPU only)
        if any(len(st.labels) != 2 for st in matrices) or (matrices and xp is not np):
            return None
        nbatch = len(enc.labels) - len(enc.shared)
        in_shape = tuple(self.sizes[c] for c in enc.labels[nbatch:])
        leaf = self._leaves(ops, kinds, cplx, xp)
        for st in matrices:
            self._check_exact(st.source, leaf(st), st, widths)

        def request():
            """The plan as a fusion request, its constants (and the matrices, encoded for this call) as operators."""
            consts = [None] * len(self.terms)
            for st in plan.steps:
                if isinstance(st, ir.Encode) and st.constant:
                    consts[st.source] = self._const_value(st, False, np)
                elif st in matrices:
                    T = _package_encode_leaf(leaf(st), self.basis, st.bits, st.shared, be, np)
                    consts[st.source] = value_of(T, _unique(self.terms[st.source]), st.bound, np)
            steps = tuple(dataclasses.replace(st, constant=True) if st in matrices else st for st in plan.steps)
            return FusionRequest(dataclasses.replace(plan, steps=steps), in_shape, consts, nbatch=nbatch)

        # the backend compiles the plan once (its constants only), or per call (the matrices' residues are this call's)
        cache = {}
        if not matrices:
            key = ("fused", id(plan))
            if key not in self._const_cache or self._const_cache[key][0] is not plan:
                self._const_cache[key] = (plan, {})
            cache = self._const_cache[key][1]
        x = leaf(enc)
        lead = x.shape[:nbatch]
        # (the backend's own measurement may say step by step is faster here)
        prog = fused_program(cache, (be.name, mode), be, request, mode, math.prod(lead), required=False)
        if prog is None:
            return None
        self._check_exact(enc.source, x, enc, widths)
        y = be.chain(prog, x.reshape((math.prod(lead),) + x.shape[nbatch:]), mode).reshape(lead + prog.out_shape)
        last = [st for st in plan.steps if isinstance(st, ir.Contract) and st.out == plan.out][-1]
        y = y.transpose([last.labels.index(c) for c in plan.out_labels])
        return y[()] if y.ndim == 0 and xp is np else xp.ascontiguousarray(y)

    def _check_exact(self, i: int, x, st, widths: Optional[tuple] = None) -> None:
        """``decode='exact'``: operand ``i`` must be encoded exactly at the plan's width, or the result is not correctly
        rounded. ``widths``: the widths at which the caller measured the operands exact (:meth:`_plan`'s, on this
        plan's slices): an operand within its plan's width is not scanned again."""
        if self.decode != "exact" or (widths is not None and widths[i] <= st.bits):
            return
        need = exact_bits_needed(x, st.shared)  # one scalar back from the device
        if need > st.bits:
            raise RNSRangeError(
                f"einsum: decode='exact' promises the correctly rounded result, but operand {i} needs {need} bits to "
                f"be encoded exactly (one exponent per slice along the output indices) and the plan on "
                f"{self.basis!r} encodes it at {st.bits}; use moduli='auto' (the correctly rounded result: it "
                f"chooses the moduli, and goes to exact integers where 49 do not hold the value) or decode='fp64'"
            )

    def explain(self) -> str:
        """The contraction path and the residue-domain step of each contraction, with bounds and drops.

        Shown for real non-constant operands (complex ones add a (re, im) axis and a factor 2 to some bounds).
        """
        kinds = tuple("const" if i in self.constants else "input" for i in range(len(self.terms)))
        cplx = tuple(
            bool(np.iscomplexobj(self.constants[i])) if i in self.constants else False for i in range(len(self.terms))
        )
        plan = self._plan(kinds, cplx, {})
        head = [
            f"rnstensor contract_expression {self.subscripts!r}: method {self.method!r}, {self.basis!r} "
            f"(range 2^{self.basis.log2_product - 1:.1f}), decode {self.decode!r}",
            f"opt_einsum path {self.path}",
        ]
        body, k = [], 0
        for line in plan.notes:  # steps numbered; their drops (indented) follow them
            if not line.startswith("  "):
                k += 1
                line = f"{k}. {line}"
            body.append(line)
        tail = [f"fewest bits kept by any operand or intermediate: {plan.kept_bits:.1f}"]
        if self.classical and self.decode == "fp64" and self.method == "rescale_be":
            tail.append(f"moduli=None: every call is certified to meet gamma_{classical_terms(plan, self.sizes)} "
                        f"|A||B|... before it runs (wider plans, else classical GEMMs, where not); last call: "
                        f"{self.last_evaluation or 'none yet'}")
        return "\n".join(head + body + tail)

    def __repr__(self) -> str:
        return f"ContractExpression({self.subscripts!r}, method={self.method!r}, s={len(self.basis)})"
