"""Chains of mode products: plans built once, executed by the four methods of [2610.05059]."""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Optional, Sequence, Union

import numpy as np

from .arrays import array_module, to_host
from .backends import dispatch
from .basis import Basis, log2_int
from .encode import as_basis, check_float_array, check_nonfinite, encode, finite_part, group_exponents
from .errors import renamed
from .planner import Schedule, plan_schedule
from .planner.methods import MIN_BITS
from .planner.drops import ROW as _ROW
from .planner.drops import axis_labels as _axis_labels
from .program.errors import composed_bound, fraction_up, operator_norms, persistent_coefficients
from .primitives import DECODE_MODES, strip_pending
from .run.fusion import fused_program
from . import ir
from .ir.lower import FusionRequest
from .program.execute import Value, encode_value, execute, moved, run_step, value_of
from .run.exact import half_spacing
from .run.policy import accuracy_policy, check_rtol
from .tensor import RNSTensor, Scale
from .chain_policy import ChainPolicies

__all__ = ["ChainPlan", "plan_chain", "mode_chain"]



class ChainPlan(ChainPolicies):
    """A chain of mode products planned once for a basis and applied to any number of tensors.

    Build it with :func:`plan_chain`. Calling it, ``plan(X, decode='fp64')``,
    runs the chain on ``X`` whose trailing ``ndim`` axes are the tensor and
    whose leading axes are a batch.

    Attributes
    ----------
    method : str
        ``'rescale_be'``, ``'rescale'``, ``'norescale'`` or ``'composed'``.
    bits : int
        The encoding width ``b`` selected (or given) for the operators.
    input_bits : int
        The width the input tensor is encoded with (``bits`` unless set).
    planner : str
        ``'greedy'`` (Alg. 2) or ``'optimal'`` (drops minimising :meth:`error_bound`).
    drops : tuple of int
        Moduli dropped after each product (the last is 0).
    basis : Basis
    axes : tuple of int
        The contracted axis of each product, counted within the tensor.
    ndim : int
        Number of tensor (non-batch) axes.
    """

    def __init__(
        self, schedule: Schedule, operators: Sequence[np.ndarray], axes: Sequence[int], ndim: int, planner: str
    ):
        self._schedule = schedule
        self.method = schedule.method
        self.planner = planner
        self.bits = schedule.bits
        self.input_bits = schedule.input_bits
        self.drops = schedule.drops
        self.basis = schedule.basis
        self.axes = tuple(axes)
        self.ndim = ndim
        self.operators = tuple(operators)
        self._lengths = _axis_lengths(self.operators, self.axes, ndim)
        # the operator residues, encoded once: exactly the integers the planner bounded
        self._encoded = tuple(_encode_operator(op, self.basis, self.bits) for op in schedule.operators)
        self._norms = None
        self._coefficients: dict = {}
        self._op_values: dict = {}
        self._fused_programs: dict = {}  # (backend, tensor shape, decode) -> (compiled program, reason)
        #: the plan as a residue program (:mod:`rnstensor.program`), as the planner wrote and planned it
        self.program = schedule.program
        #: Held to the classical float64 bound (``plan_chain(moduli=None)``, the default): see :meth:`run`.
        self.classical = False
        #: The accuracy policy of moduli= (:mod:`rnstensor.run.policy`): 'classical', 'fast', 'auto' or 'basis'.
        self.policy = "basis"
        #: a target in place of the classical bound (``plan_chain(rtol=...)``), or None
        self.rtol: Optional[float] = None
        self._exact_exprs: dict = {}
        #: How the last classical call ran: ``'residues on 15 moduli'`` (certified; more moduli where this plan's run
        #: is not) or ``'composed classical GEMMs'``. :meth:`error_bound` leaves it as the last call set it.
        self.last_evaluation: Optional[str] = None

    @property
    def encoded_operators(self) -> tuple[RNSTensor, ...]:
        """The operators as executed: residues encoded once, with their row exponents."""
        return self._encoded

    @property
    def schedule(self) -> Schedule:
        """The planner's output: prepared operators and the bound of every step."""
        return self._schedule

    # ----- execution ----------------------------------------------------------------------

    def _check_shape(self, shape: tuple) -> int:
        """The number of batch axes of an input of this shape (a ``ValueError`` if its tensor axes do not fit)."""
        if len(shape) < self.ndim:
            raise ValueError(f"X must have at least {self.ndim} axes (the tensor); got shape {shape}")
        batch = len(shape) - self.ndim
        for a, n_in in self._lengths.items():
            if shape[batch + a] != n_in:
                raise ValueError(
                    f"axis {a} of the tensor has length {shape[batch + a]} but the plan's first operator on it "
                    f"has {n_in} columns (X.shape={shape}, tensor axes start at {batch})"
                )
        return batch

    def _check_input(self, X) -> np.ndarray:
        x = check_float_array(X, "X")
        self._check_shape(x.shape)
        return x

    def __call__(self, X, decode: str = "fp64") -> np.ndarray:
        """Run the chain on ``X`` (``(*batch, *tensor)``) and decode (``'fp64'`` or ``'exact'``)."""
        return self.run(X, decode=decode)

    def _finite_part(self, X, nonfinite: str):
        """``(X with inf / NaN zeroed, X)`` where ``X`` has any and ``nonfinite='propagate'``, else ``(X, None)``."""
        check_nonfinite(nonfinite)
        xp = array_module(X)
        x = X if xp is not np else np.asarray(X)
        if nonfinite == "raise" or x.dtype.kind != "f":  # refused by the encode (or the fused kernel's flag)
            return X, None
        z, bad = finite_part(x)
        return (z, x) if bad else (X, None)

    def float64_chain(self, X):
        """The chain in float64 (numpy's mode products, in the plan's order): what numpy gives, inf and NaN included."""
        return self._float64_products(X, self._float_operators(array_module(X), encoded=False))

    def _float64_products(self, X, operators):
        """``operators`` (float64 arrays on ``X``'s module) applied to ``X`` along the plan's axes by numpy's (or
        CuPy's) float64 mode products."""
        xp = array_module(X)
        y = X if xp is not np else np.asarray(X, dtype=np.float64)
        batch = y.ndim - self.ndim
        with np.errstate(invalid="ignore", over="ignore", under="ignore"):
            for A, ax in zip(operators, self.axes):
                y = xp.moveaxis(xp.tensordot(A, y, axes=([1], [batch + ax])), 0, batch + ax)
        return y

    def run(self, X, decode: str = "fp64", *, backend: Optional[str] = None, fused: Optional[bool] = None,
            nonfinite: str = "propagate"):
        """Run the chain; the same as calling the plan, with a backend and the fused kernel to choose.

        Parameters
        ----------
        X : array, ``(*batch, *tensor)``
            NumPy, or CuPy (which runs on the ``'cuda'`` backend and returns CuPy,
            every step on the device).
        decode : {'fp64', 'exact'}
            How the chain's final integers leave the residues: ``'fp64'``
            faithfully rounded, ``'exact'`` correctly rounded. A chain plan
            rescales between its products (its drops round), so neither is
            the correctly rounded value of the true chain; :meth:`error_bound`
            bounds the distance to it.
        backend : str, optional
            ``'cpu'``, ``'numpy'`` or ``'cuda'`` (default: the current backend; ``'cuda'`` for CuPy input).
        fused : bool, optional
            Run the whole chain block by block, each block of tensors kept in cache
            (``'cpu'``: :mod:`rnstensor.backends.cpu_fused`) or in shared memory
            (``'cuda'``: one kernel, ``rnstensor/kernels/chain.cu``) from the float64
            load to the store. ``None`` (default) fuses where the plan allows it;
            ``True`` raises where it does not; ``False`` runs one kernel per step
            (:attr:`program`). Results are bitwise the same either way.
        nonfinite : {'propagate', 'raise'}
            Input entries that are inf or NaN: ``'propagate'`` (default) follows
            numpy, every output whose float64 chain meets one is numpy's
            (:meth:`float64_chain`), the others are computed in residues with
            those entries zeroed, which they never read; ``'raise'``: a ``ValueError``.
        """
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}; got {decode!r}")
        self._check_target_decode(decode, "ChainPlan.run")
        if self.policy == "auto":
            return self._exact_chain(X, backend, nonfinite)
        Xz, original = self._finite_part(X, nonfinite)
        if original is not None:
            # an output that meets an inf or NaN in float64 is inf or NaN (inf * 0 is NaN): numpy's there
            y = self.run(Xz, decode, backend=backend, fused=fused, nonfinite="raise")
            ref = self.float64_chain(original)
            xp = array_module(ref)
            return xp.where(xp.isfinite(ref), y, ref)
        be, xp = dispatch(X, backend=backend, names=("X",), fn="ChainPlan.run")
        if fused and not callable(getattr(be, "chain", None)):  # a backend with a fused chain interpreter
            raise ValueError(f"fused=True runs on the 'cpu' and 'cuda' backends (their fused chain kernels); backend is "
                             f"{be.name!r}")
        if self._certifies(decode):  # the default: per tensor, the narrowest plan certified on it, else the fallbacks
            return self._run_certified(self._check_input(X), decode, backend, fused, xp)
        return self._run_planned(X, decode, backend, fused)

    def _run_planned(self, X, decode: str, backend: Optional[str], fused: Optional[bool]):
        """The run as planned (no certification): fused where the backend can, else step by step."""
        be, xp = dispatch(X, backend=backend, names=("X",), fn="ChainPlan.run")
        on_device = xp is not np
        if fused and self.method == "composed":
            raise ValueError("fused=True: a 'composed' plan decodes after every product and cannot run as one "
                             "kernel; pass fused=None or False, or plan with method='rescale_be'")
        if callable(getattr(be, "chain", None)) and fused is not False and self.method != "composed":
            done = self._run_fused(X, decode, be, on_device, required=bool(fused))
            if done is not None:
                return done
        x = self._check_input(X)
        batch = x.ndim - self.ndim
        lead = tuple(x.shape[:batch])
        xb = x.reshape((math.prod(lead),) + tuple(x.shape[batch:]))
        name = be.name if on_device else backend
        vals = self._execute({}, be, xp, name, xb)
        y = run_step(ir.Decode(1, 0, decode), vals, self.basis, be, name, xp)
        return y.reshape(lead + tuple(y.shape[1:]))

    # ----- the chain as einsum (moduli='auto' evaluates it, chain_policy.py) -----------------

    def einsum_subscripts(self, batch: int) -> str:
        """The chain as an einsum expression over ``X`` (``batch`` leading axes) and the operators, in order."""
        letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        lead = "".join(next(letters) for _ in range(batch))
        cur = [next(letters) for _ in range(self.ndim)]
        terms = [lead + "".join(cur)]
        for ax in self.axes:
            new = next(letters)
            terms.append(new + cur[ax])
            cur[ax] = new
        return ",".join(terms) + "->" + lead + "".join(cur)

    def _replanned(self, **changes) -> "ChainPlan":
        """This chain planned again with ``changes`` to :func:`plan_chain`'s arguments (a wider rung of the
        default's certificate)."""
        kw = dict(moduli=self.basis, method=self.method, planner=self.planner, ndim=self.ndim)
        kw.update(changes)
        return plan_chain(self.operators, self.axes, **kw)

    def program_constants(self, xp=np) -> list:
        """The constants of :attr:`program` (the encoded operators) as values on ``xp``, in ``Encode.source`` order."""
        return [self._operator_value(k, xp) for k in range(len(self._encoded))]

    def _operator_value(self, k: int, xp) -> Value:
        """Operator ``k`` as the program's constant, on the array module ``xp`` (copied to a device once)."""
        key = (k, xp.__name__)
        if key not in self._op_values:
            self._op_values[key] = moved(value_of(self._encoded[k], _ROW + "?", self._encoded[k].bound), xp)
        return self._op_values[key]

    def _execute(self, vals: dict, be, xp, backend_name, x=None, start: int = 0) -> dict:
        """Run the program's steps from ``start`` (the input encode: ``x``, ``(B, *tensor)``) on ``vals``."""

        def encoded(st):
            if st.constant:  # read by products only, which name its axes themselves
                return self._operator_value(st.source, xp)
            return encode_value(x, st, self.basis, be, xp)

        return execute(self.program, be, backend_name, xp, encoded=encoded, vals=vals, start=start)

    def _run_fused(self, X, decode: str, be, on_device: bool, required: bool):
        """The fused kernel's result, or ``None`` where it cannot run (an error instead if ``required``)."""
        if on_device:
            if X.dtype.kind != "f" or X.dtype.itemsize > 8:
                raise TypeError(f"X must be a real floating-point array (float16/32/64); got dtype {X.dtype}")
            if X.size == 0:
                raise ValueError(f"X is empty (shape {X.shape}): there is nothing to encode")
            x = X
        else:
            x = self._check_input(X)
        batch = self._check_shape(tuple(x.shape))
        shape = tuple(x.shape[batch:])
        # the backend compiles the program once per tensor shape
        B = math.prod(x.shape[:batch])
        prog = fused_program(self._fused_programs, (be.name, shape, decode), be, lambda: self.fusion_request(shape),
                             decode, B, required, refusal="this plan cannot run as one kernel: ")
        if prog is None:
            return None
        out = be.chain(prog, x.reshape((B,) + shape), decode)
        return out.reshape(tuple(x.shape[:batch]) + prog.out_shape)

    def fusion_request(self, shape: Optional[tuple] = None) -> FusionRequest:
        """What this plan hands a backend's ``compile_program`` to run fused: its residue program, one tensor's
        ``shape`` (default: every axis's length from its operators) and the encoded operators.

        Raises
        ------
        ValueError
            If ``shape`` is left out and an axis is never contracted (its length comes from the input), or
            ``shape`` does not fit the operators.

        Examples
        --------
        >>> import numpy as np, rnstensor as rt
        >>> plan = rt.plan_chain([np.eye(3), np.ones((2, 3))], [0, 1])
        >>> plan.fusion_request().in_shape
        (3, 3)
        """
        if shape is None:
            missing = [a for a in range(self.ndim) if a not in self._lengths]
            if missing:
                raise ValueError(f"axes {missing} are never contracted: their length comes from the input; "
                                 f"pass the tensor's shape")
            shape = tuple(self._lengths[a] for a in range(self.ndim))
        shape = tuple(int(n) for n in shape)
        if self._check_shape(shape) != 0:
            raise ValueError(f"shape must be one tensor's {self.ndim} axes; got {shape}")
        return FusionRequest(self.program, shape, self.program_constants(), nbatch=1)

    def encode_input(self, X, *, backend: Optional[str] = None) -> RNSTensor:
        """``X`` encoded as the persistent methods need: one exponent per tensor, ``input_bits`` wide.

        Every batch entry gets its own exponent ([2610.05059]: one scale per
        tensor), so a tensor's result never depends on the rest of its batch.
        """
        if self.method == "composed":
            raise ValueError("the composed method encodes per fiber at every product; it has no single input encoding")
        x = self._check_input(X)
        tensor_axes = tuple(range(x.ndim - self.ndim, x.ndim))
        return encode(x, self.basis, self.input_bits, shared_axes=tensor_axes, backend=backend)

    def apply(self, T: RNSTensor, *, backend: Optional[str] = None) -> RNSTensor:
        """Apply every product, drop and extension of the plan to an encoded tensor; no decode.

        ``T`` (``(*batch, *tensor)``, e.g. :meth:`encode_input`) needs
        exponents constant along every contracted axis (a pending scale from
        an earlier product is folded into the operator, as the plan does).
        """
        if self.method == "composed":
            raise ValueError("the composed method decodes after every product; call the plan on a float array")
        batch = T.ndim - self.ndim
        if batch < 0:
            raise ValueError(f"T must have at least {self.ndim} axes (the tensor); got shape {T.shape}")
        self._check_shape(T.shape)
        if T.basis != self.basis:
            raise ValueError(f"T is on {T.basis!r}, the plan on {self.basis!r}; encode it on the plan's basis")
        for ax in set(self.axes):
            T, _ = strip_pending(T, batch + ax)  # the plan folds it into the operator
            if T.scale.field is not None and T.scale.field.shape[batch + ax] != 1:
                raise ValueError(
                    f"T's encoding exponents vary along axis {batch + ax}; encode T with shared_axes including it"
                )
        be, xp = dispatch(T.residues, backend=backend, names=("T",), fn="ChainPlan.apply")
        name = be.name if xp is not np else backend
        lead = tuple(T.shape[:batch])
        B = math.prod(lead)
        v = value_of(T, _axis_labels(self.ndim), T.bound)
        e = v.exp.total()
        e = xp.broadcast_to(e, lead + tuple(e.shape[batch:]))
        flat = Value(T.residues.reshape((len(T.active), B) + tuple(T.shape[batch:])),
                     e.reshape((B,) + tuple(e.shape[batch:])), v.factor, v.bound, v.labels, v.active)
        out = self._execute({0: flat}, be, xp, name, start=1)[0]
        active = self.basis.moduli if out.active is None else out.active
        planes = out.planes.reshape((len(active),) + lead + tuple(out.planes.shape[2:]))
        e = out.exp.total()
        exp = e.reshape(lead + tuple(e.shape[1:]))
        return RNSTensor(planes, self.basis, active, out.bound, Scale(0, out.factor, (None,) * exp.ndim, exp))

    def executed_steps(self) -> tuple[tuple[RNSTensor, int, tuple[int, ...]], ...]:
        """``(encoded operator, tensor axis, moduli dropped after it)`` for every product, in order."""
        return tuple(zip(self._encoded, self.axes, (st.dropped for st in self._schedule.steps)))

    # ----- error bound --------------------------------------------------------------------

    def norms(self):
        """Exact norms of every executed operator against the given one (cached)."""
        if self._norms is None:
            self._norms = [operator_norms(op, A) for op, A in zip(self._schedule.operators, self.operators)]
        return self._norms

    def error_bound(self, X, decode: str = "fp64") -> float:
        """A rigorous bound on ``max |plan(X) - exact|`` over all entries (float64, rounded up).

        Inf or NaN entries of ``X`` (``nonfinite='propagate'``) make the outputs
        that meet them numpy's inf or NaN; the bound covers the other outputs.
        ``inf`` where a result may overflow (never a NaN).

        Accounts for the input encoding, the rounding of every operator to
        integers, every drop (``floor(q/2)`` units, propagated through the
        remaining operators' norms) and the final decode: the a-priori error
        analysis of :mod:`rnstensor.program.errors` over :attr:`program`. Depends on each tensor of the batch
        only through its largest magnitude and its encoding error (every
        tensor is encoded with its own exponent); the bound is the largest.

        Examples
        --------
        >>> import numpy as np, rnstensor as rt
        >>> rng = np.random.default_rng(1)
        >>> plan = rt.plan_chain([rng.uniform(-1, 1, (8, 8)) for _ in range(3)], [0, 1, 2])
        >>> X = rng.uniform(-1, 1, (2, 8, 8, 8))
        >>> bool(plan.error_bound(X) < 1e-11), bool(plan.error_bound(X, decode="exact") < 1e-13)
        (True, True)
        """
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}; got {decode!r}")
        self._check_target_decode(decode, "ChainPlan.error_bound")
        said = self.last_evaluation  # the bound replays the call's paths: last_evaluation stays the call's
        try:
            return self._error_bound(X, decode)
        finally:
            self.last_evaluation = said

    def _error_bound(self, X, decode: str) -> float:
        if self.policy == "auto":  # correctly rounded: half the spacing at the largest result
            y = self._exact_chain(X, None, "propagate")
            xp = array_module(y)
            finite = y[xp.isfinite(y)]
            return float(half_spacing(finite).max()) if finite.size else 0.0
        x = self._check_input(self._finite_part(X, "propagate")[0])
        if self._certifies(decode) and x.size:
            # the default's result: per tensor, the certified residue run (bounded below, with its decode), the
            # correctly rounded result or the classical GEMMs
            return self._certified_bound(x, decode)
        return self._planned_bound(x, decode)

    def _planned_bound(self, x, decode: str) -> float:
        """:meth:`error_bound` of the plan as planned, on finite ``x``."""
        xp = array_module(x)
        xnorm = Fraction(float(xp.abs(x).max())) if x.size else Fraction(0)
        if self.method == "composed":
            rhos = [op.rho for op in self._schedule.operators]
            return self._reported(composed_bound(self.norms(), rhos, self.bits, self.basis.moduli, xnorm, decode), xnorm)
        # one exponent per tensor of the batch (as encode_input): bound each exponent class, take the max
        tensor_axes = tuple(range(x.ndim - self.ndim, x.ndim))
        e = group_exponents(x, self.input_bits, tensor_axes)
        scaled = xp.ldexp(x, e.astype(np.int32))
        enc_err = xp.abs(xp.rint(scaled) - scaled).max(axis=tensor_axes, keepdims=True).reshape(-1)
        amax = xp.abs(x).max(axis=tensor_axes, keepdims=True).reshape(-1)
        e = e.reshape(-1)
        nonzero = amax > 0  # an all-zero tensor stays exactly zero
        if not bool(nonzero.any()):
            return 0.0
        if decode not in self._coefficients:
            steps = self._schedule.steps
            gone = set() if self.method == "rescale_be" else {q for st in steps for q in st.dropped}
            final_moduli = [p for p in self.basis.moduli if p not in gone]
            self._coefficients[decode] = persistent_coefficients(
                self.norms(), [st.dropped for st in steps], steps[-1].after, final_moduli, decode, program=self.program
            )
        coef = self._coefficients[decode]
        worst = Fraction(0)
        # the reductions stay where x lives: per exponent class, two maxima are read back
        for ee in to_host(xp.unique(e[nonzero])):
            sel = nonzero & (e == int(ee))
            unit = Fraction(2) ** (-int(ee))
            enc = Fraction(float(xp.where(sel, enc_err, 0.0).max())) * unit
            worst = max(worst, coef.evaluate(enc, Fraction(float(xp.where(sel, amax, 0.0).max())), unit))
        return self._reported(worst, xnorm)

    def _reported(self, bound: Fraction, xnorm: Fraction) -> float:
        """``bound`` rounded up, or ``inf`` where a result may overflow (``|y| <= |X| prod ||A_i|| + bound``)."""
        reach = xnorm * math.prod((nm.true for nm in self.norms()), start=Fraction(1)) + bound
        if reach >= Fraction(float(np.finfo(np.float64).max)):
            return math.inf  # a result may round to inf: its error is reported as such
        return fraction_up(bound)

    # ----- reporting ----------------------------------------------------------------------

    def describe(self, file=None) -> str:
        """The plan per step: log2 bound before/after the product, drops, after, log2 range; returned, not printed.

        ``print(plan.describe())`` shows it; ``file``, a text stream, is
        written the same text (and a newline) as well.
        """
        lines = [
            f"{self.method} plan ({self.planner}) on {self.basis!r}: b = {self.bits}"
            + (f", input b = {self.input_bits}" if self.input_bits != self.bits else "")
            + f", drops = {self.drops}",
            f"{'step':>4} {'axis':>4} {'n_out x n_in':>12} {'log2 B in':>10} {'log2 B prod':>11} "
            f"{'log2 range':>10} {'drops':>5} {'log2 B out':>10} {'log2 range out':>14}",
        ]
        for i, (st, op, ax) in enumerate(zip(self._schedule.steps, self.operators, self.axes)):
            shape = f"{op.shape[0]} x {op.shape[1]}"
            lines.append(
                f"{i + 1:>4} {ax:>4} {shape:>12} {log2_int(st.before):>10.2f} {log2_int(st.product):>11.2f} "
                f"{log2_int(st.range_product) - 1:>10.2f} {st.drops:>5} {log2_int(st.after):>10.2f} "
                f"{log2_int(st.range_after) - 1:>14.2f}"
            )
        text = "\n".join(lines)
        if file is not None:  # returned, never printed unasked: a REPL shows the returned text once
            print(text, file=file)
        return text

    def __repr__(self) -> str:
        return (
            f"ChainPlan(method={self.method!r}, planner={self.planner!r}, bits={self.bits}, drops={self.drops}, axes={self.axes}, "
            f"s={len(self.basis)})"
        )


def _encode_operator(op, basis: Basis, bits: int) -> RNSTensor:
    """The residues of a prepared operator, carrying the row exponents and exact row sums the planner used.

    They differ from :func:`encode`'s only on all-zero rows (see
    :func:`rnstensor.planner.prepare_operators`), whose integers are zero.
    """
    T = encode(op.effective, basis, bits, shared_axes=(1,))
    rows = -np.asarray(op.row_exponents, dtype=np.int64).reshape(-1)
    if T.scale.axes[0] is not None and not np.array_equal(T.scale.axes[0], rows):
        T = RNSTensor(T.residues, T.basis, T.active, T.bound, T.scale.replace(axes=(rows, None)), T.negative_zeros)
    T._row_sums = tuple(int(sum(abs(int(a)) for a in row)) for row in op.ints)
    return T


def _axis_lengths(operators, axes, ndim: int) -> dict[int, int]:
    """The input length each axis must have; checks that consecutive operators on an axis fit."""
    first: dict[int, int] = {}
    current: dict[int, int] = {}
    for i, (A, ax) in enumerate(zip(operators, axes)):
        n_out, n_in = A.shape
        if ax in current and current[ax] != n_in:
            raise ValueError(
                f"operator {i} ({n_out} x {n_in}) on axis {ax} needs length {n_in}, but the previous product "
                f"on that axis left length {current[ax]}"
            )
        first.setdefault(ax, n_in)
        current[ax] = n_out
    return first


def _normalize_chain(operators, axes, ndim: Optional[int]):
    ops = list(operators) if not isinstance(operators, np.ndarray) or operators.ndim == 3 else [operators]
    if not ops:
        raise ValueError("operators is empty: a chain needs at least one operator")
    if isinstance(axes, (int, np.integer)):
        axes = [axes]
    axes = list(axes)
    if len(axes) != len(ops):
        raise ValueError(f"got {len(ops)} operators but {len(axes)} axes; give one axis per operator")
    clean = []
    for i, A in enumerate(ops):
        a = check_float_array(A, f"operators[{i}]")
        if a.ndim != 2:
            raise ValueError(f"operators[{i}] must be a 2-D matrix (n_out x n_in); got shape {a.shape}")
        clean.append(a)
    try:
        axes = [operator.index(a) for a in axes]
    except TypeError:
        raise TypeError(f"axes must be integers; got {axes!r}") from None
    if ndim is None:
        if any(a < 0 for a in axes):
            raise ValueError("negative axes need ndim= (the number of tensor axes) to be given")
        ndim = max(axes) + 1
    else:
        ndim = operator.index(ndim)
        bad = [a for a in axes if not -ndim <= a < ndim]
        if bad:
            raise ValueError(f"axes {bad} are out of range for a {ndim}-axis tensor")
        axes = [a % ndim for a in axes]
    return clean, axes, ndim


def plan_chain(
    operators: Sequence[np.ndarray],
    axes: Sequence[int],
    *,
    moduli: Union[None, int, Basis, Sequence[int]] = None,
    method: str = "rescale_be",
    planner: str = "optimal",
    bits: Optional[int] = None,
    input_bits: Optional[Union[int, str]] = None,
    ndim: Optional[int] = None,
    min_bits: int = MIN_BITS,
    rtol: Optional[float] = None,
) -> ChainPlan:
    """Plan a chain of mode products once; apply the plan to many tensors.

    Parameters
    ----------
    operators : sequence of 2-D float arrays
        ``A_i`` (``n_out × n_in``, rectangular allowed), applied in order.
    axes : sequence of int
        The tensor axis each operator contracts; repeats revisit a mode.
    moduli : None, 'fast', 'auto', int, Basis or tuple
        The working basis (``15`` = ``Basis.int8(15)``). ``'fast'``: the
        15-moduli plan, uncertified. ``'auto'``: every call returns the exact
        chain rounded once per entry (no rounding drop: the einsum of the same
        contractions with ``moduli='auto'``). ``None`` (default):
        every ``fp64`` call of the plan meets ``|Ŷ - Y| <= (1 + 2**-5) u
        |A_n| ... |A_1| |X|`` entrywise (``u = 2**-53``, the final rounding
        included; the classical ``γ_m`` where smaller, ``m`` the operators'
        columns added up), each tensor of the batch on the narrowest plan
        certified for it before it runs (:mod:`rnstensor.program.classical`):
        the chain planned on the moduli that target asks for (18) with the
        widest input encoding, else on more; where none certifies, the exact
        chain rounded once where one
        exact plan of 49 moduli holds it, else classical GEMMs
        (:meth:`ChainPlan.classical_chain`). ``plan.last_evaluation`` says
        which (the certified plan runs fused on the GPU where it can). An
        explicit basis runs the plan as planned, the fast opt-out. A chain
        that revisits a mode is certified the same way (its folded operator
        columns are exact powers of two). Each tensor's verdicts are its own,
        so a batch gives the bits of its tensors called one by one (and of any
        Dask chunking).
    method : {'rescale_be', 'rescale', 'norescale', 'composed'}
        [2610.05059] Alg. 7, 10, 8, 6.
    planner : {'optimal', 'greedy'}
        ``'optimal'`` (default): per product, the drops that minimise
        :meth:`ChainPlan.error_bound` subject to the same range checks (it
        drops only what the next product needs, so each rounding is smaller;
        never a larger bound than the greedy plan's, up to 465x more accurate
        at depth 8 at the same speed, BENCHMARKS.md). ``'greedy'``:
        [2610.05059] Alg. 2 (drop while the bound stays above ``2**bits``),
        the papers' tables.
    bits : int, optional
        Force the encoding width; by default the largest ``b <= 53`` that
        passes the method's range checks.
    input_bits : int or 'max', optional
        Encode the input tensor with this width instead of ``bits`` (persistent
        methods): wider keeps small entries of wide-range tensors. ``'max'``:
        the widest the plan's range checks allow.
    ndim : int, optional
        Number of tensor axes (default ``max(axes) + 1``); leading axes of the
        input beyond these are a batch.
    min_bits : int
        The fewest bits the encodings and intermediates may keep (or
        ``bits``, when that is smaller), as in :func:`einsum`: a plan that
        keeps fewer raises :class:`PlanError` instead of returning a poor
        result. ``0`` accepts any plan (the papers' sweeps over ``s``).
    rtol : float, optional
        A target in place of the classical bound (with ``moduli=None``):
        every entry within ``rtol |A_n| ... |A_1| |X|``, certified before the
        run on the fewest moduli that meet it (a loose target takes fewer
        than 15); a target no plan certifies and the classical GEMMs do not
        meet raises :class:`RNSRangeError` pointing to ``moduli='auto'``.

    Returns
    -------
    ChainPlan

    Raises
    ------
    PlanError
        No width passes the range checks (names the step and the missing
        bits), or the widest that does keeps fewer than ``min_bits``.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> rng = np.random.default_rng(0)
    >>> ops = [rng.uniform(-1, 1, (8, 8)) for _ in range(3)]
    >>> plan = rt.plan_chain(ops, [0, 1, 2])
    >>> plan.bits, plan.drops
    (53, (6, 7, 0))
    >>> Y = plan(rng.uniform(-1, 1, (4, 8, 8, 8)))
    """
    ops, axes, nd = _normalize_chain(operators, axes, ndim)
    _axis_lengths(ops, axes, nd)
    acc = accuracy_policy(moduli, "plan_chain")
    if acc.policy == "auto" and (bits is not None or input_bits is not None):
        raise ValueError("plan_chain: moduli='auto' chooses the widths that keep the chain exact; leave bits and "
                         "input_bits unset")
    basis = as_basis(moduli if acc.policy == "basis" else acc.moduli or 15, "moduli")
    # moduli='auto' evaluates the exact chain per call; its 15-moduli plan only describes the chain (any width)
    sched = plan_schedule(ops, axes, basis, method, planner, bits, input_bits, nd,
                          0 if acc.policy == "auto" else min_bits)
    plan = ChainPlan(sched, ops, axes, nd, planner)
    plan.policy = acc.policy
    if acc.policy == "classical" and (bits is not None or input_bits is not None):
        plan.policy = "basis"  # an explicit width is the papers' plan, as planned
    plan.classical = plan.policy == "classical"
    plan.rtol = check_rtol(rtol, "plan_chain")
    if plan.rtol is not None and not plan.classical:
        raise ValueError("plan_chain: rtol chooses the moduli and widths itself; pass it with moduli=None and no "
                         "bits or input_bits")
    return plan


def mode_chain(
    X,
    operators: Sequence[np.ndarray],
    axes: Sequence[int],
    *,
    moduli: Union[None, int, Basis, Sequence[int]] = None,
    method: str = "rescale_be",
    decode: str = "fp64",
    planner: str = "optimal",
    bits: Optional[int] = None,
    input_bits: Optional[Union[int, str]] = None,
    ndim: Optional[int] = None,
    min_bits: int = MIN_BITS,
    nonfinite: str = "propagate",
    rtol: Optional[float] = None,
) -> np.ndarray:
    """One-shot chain of mode products: ``plan_chain(...)(X, decode)``.

    Examples
    --------
    >>> import numpy as np, rnstensor as rt
    >>> X = np.ones((2, 3))
    >>> rt.mode_chain(X, [np.eye(2) * 2, np.full((1, 3), 1.0)], [0, 1])
    array([[6.],
           [6.]])
    """
    try:
        plan = plan_chain(
            operators, axes, moduli=moduli, method=method, planner=planner, bits=bits, input_bits=input_bits,
            ndim=ndim, min_bits=min_bits, rtol=rtol,
        )
        return plan.run(X, decode=decode, nonfinite=nonfinite)
    except (ValueError, TypeError) as exc:  # (plan_chain's errors, their fixes mode_chain's arguments too)
        raise renamed(exc, "mode_chain", ("plan_chain",)) from None
