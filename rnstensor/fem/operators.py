"""Mass and Poisson operators applied by sum factorization entirely in the residue domain (one encode, one decode).

Error bound. ``u`` (one exponent per element), the 1-D matrices (one exponent
each, so that summed branches share their scales) and the quadrature fields
(one exponent per element) are encoded with ``b`` bits (72 on the default 20 moduli);
everything after is exact integer arithmetic except the drops, each of which
rounds by at most ``floor(q/2)`` units of the tensor it divides, and the final
decode. :meth:`MassOperator.error_bound` (likewise for Poisson) evaluates the
resulting rigorous bound per element: with ``||.||`` the row-sum norm,
``Â`` the executed and ``A`` the given matrix, every product maps
``(|x|, err)`` to ``(||A|| |x|, ||Â|| err + ||Â - A|| |x|)``, every Hadamard
product with a field ``F`` to ``(max|F| |x|, max|F̂| err + max|F̂ - F| |x|)``,
drops add ``floor(q/2) * unit``, sums add; the decode adds
``decode_factor * final_bound * unit``. On the test meshes this bound is
``1e-14 .. 1e-11`` relative to the element's result, and the observed error
against the exact (Fraction) result stays within 4 units of float64 rounding.
"""

from __future__ import annotations

import copy
import weakref

from fractions import Fraction
from functools import lru_cache, partial
from typing import Optional

import numpy as np

from ..arrays import array_module, to_module
from ..backends import dispatch
from ..chain import plan_chain
from ..planner.methods import MIN_BITS
from ..encode import check_float_array, encode
from ..ir.lower import FusionRequest
from ..program.errors import FieldErrors, NormErrors, OperatorBounds, decode_factor
from ..primitives import DECODE_MODES, operator_row_sums, to_int
from ..primitives import decode as _decode
from ..program.execute import Value, encode_value, execute, moved, tensor_of, value_of
from ..run.fusion import fused_program
from ..tensor import RNSTensor, Scale
from .program import (
    FloatRunner,
    ProgramPlan,
    mass_program,
    plan_program,
    poisson_program,
    voigt_index,
)
from .fused import fusion_request, operator_field
from ..basis import Basis
from .tensorbasis import TensorBasis

__all__ = ["MassOperator", "PoissonOperator", "METHODS", "InvertedElementError"]

#: The methods an operator runs: 'rescale_be' and 'composed' in residues, 'float64' in plain float64 (to compare).
METHODS = ("rescale_be", "composed", "float64")
_INFLATE = 1.0 + 2.0**-45  # covers the float rounding of the error-bound arithmetic (all terms positive)
#: per residue program (an operator and its element slices share one): (backend, decode) -> (program, reason)
_FUSED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class InvertedElementError(ValueError):
    """Geometric data of an inverted (or degenerate) element: ``detJ <= 0`` at some quadrature point."""


def _matrices(basis: TensorBasis) -> dict:
    return {"B": basis.B, "D": basis.D, "Bt": np.ascontiguousarray(basis.B.T), "Dt": np.ascontiguousarray(basis.D.T)}


@lru_cache(maxsize=None)
def _encoded_ops(basis: TensorBasis, bits: int, on: Optional[Basis] = None) -> dict:
    """``B, D, B^T, D^T`` encoded once with one exponent each (so that summed branches share scales), on the
    basis's moduli (or ``on``: another residue basis, e.g. one a hint plans on; the integers are the same)."""
    out = {}
    for key, A in _matrices(basis).items():
        T = encode(A, basis.moduli if on is None else on, bits, shared_axes=None)
        operator_row_sums(T)  # computed once, cached on T
        out[key] = T
    return out


def _growth(basis: TensorBasis, fields: tuple):
    def at(b: int, on: Optional[Basis] = None) -> dict:  # (the largest integer row sums: any basis holding them)
        g = {k: max(operator_row_sums(T)) for k, T in _encoded_ops(basis, b, None if on == basis.moduli else on).items()}
        for f in fields:
            g[f] = 1 << b
        return g

    return at


@lru_cache(maxsize=None)
def _plan(kind: str, basis: TensorBasis, bits: Optional[int], skip: frozenset, min_bits: int = MIN_BITS) -> ProgramPlan:
    d = basis.dim
    if kind == "mass":
        return plan_program(mass_program, d, basis.moduli, _growth(basis, ("W",)), bits, min_bits, "MassOperator")
    fields = tuple(("G", c) for c in range(3 * (d - 1)) if c not in skip)
    return plan_program(partial(poisson_program, skip=skip), d, basis.moduli, _growth(basis, fields), bits,
                        min_bits, "PoissonOperator")


def _residue_program(kind: str, basis: TensorBasis, bits: Optional[int], skip: frozenset, min_bits: int):
    """The operator's planned residue program, and the keys of its constants (cached with the plan)."""
    plan = _plan(kind, basis, bits, skip, min_bits)
    return plan.program, plan.constants


@lru_cache(maxsize=None)
def _composed_plan(basis: TensorBasis, key: str, axis: int):
    return plan_chain([_matrices(basis)[key]], [axis], moduli=basis.moduli, method="composed", ndim=basis.dim)


def _float64_product(basis: TensorBasis, x, key: str, axis: int):
    d = basis.dim
    idx = "ijk"[:d]
    out = idx[:axis] + "z" + idx[axis + 1:]
    xp = array_module(x)
    return xp.einsum(f"z{idx[axis]},e{idx}->e{out}", _matrix_on(basis, key, xp), x, optimize=True)


_MATRICES_ON: dict = {}


def _matrix_on(basis: TensorBasis, key: str, xp):
    """A 1-D matrix of ``basis`` in the array module ``xp`` (copied to a device once)."""
    A = _matrices(basis)[key]
    if xp is np:
        return A
    k = (basis, key, xp.__name__)
    if k not in _MATRICES_ON:
        _MATRICES_ON[k] = xp.asarray(A)
    return _MATRICES_ON[k]


@lru_cache(maxsize=None)
def _op_norms(basis: TensorBasis, bits: int) -> dict:
    """Per operator: ``(||Â||, ||A||, ||Â - A||)``, exact row-sum norms rounded up to float64."""
    out = {}
    for key, A in _matrices(basis).items():
        T = _encoded_ops(basis, bits)[key]
        s = Fraction(2) ** T.scale.exp2
        v = to_int(T)
        ex = tr = df = Fraction(0)
        for j in range(A.shape[0]):
            e_row = sum(abs(int(a)) for a in v[j]) * s
            t_row = sum(abs(Fraction(float(a))) for a in A[j])
            d_row = sum(abs(int(a) * s - Fraction(float(b))) for a, b in zip(v[j], A[j]))
            ex, tr, df = max(ex, e_row), max(tr, t_row), max(df, d_row)
        out[key] = tuple(float(x) * _INFLATE for x in (ex, tr, df))
    return out


def _field_error(F, T: RNSTensor, axes: tuple) -> tuple:
    """Per element, in units of the element's encoding step ``2**k``: ``(max |F|, max |F̂|, max |F̂ - F|, k)``.

    A field encoded with one exponent per element; its numbers are those of
    the integers (at most ``2**bits``), so no bound built from them
    underflows or overflows whatever the field's magnitude. Computed where
    ``F`` and its encoding ``T`` live.
    """
    xp = array_module(F, T.residues)
    k = xp.broadcast_to(T.exponent().reshape(-1), (F.shape[0],)).astype(np.int64)  # keepdims: (nelem,) or (1,)
    shape = (-1,) + (1,) * (F.ndim - 1)
    scaled = xp.ldexp(F, (-k).reshape(shape).astype(np.int32))  # exact: a power of two, integers below 2**bits
    diff = xp.abs(xp.rint(scaled) - scaled).max(axis=axes)
    fmag = xp.abs(scaled).max(axis=axes)
    return fmag, (fmag + diff) * _INFLATE, diff, k


class _Operator:
    """Shared machinery: checks, the plan, the three methods, the error bound."""

    kind = ""

    @classmethod
    def on(cls, mesh, **kwargs):
        """This operator on a mesh's elements, bound to its global numbering: a :class:`~rnstensor.fem.MeshOperator`.

        ``kwargs`` go to the constructor (``method``, ``bits``, ...). The mesh
        is any :class:`~rnstensor.fem.FEMesh` (``box_mesh``, ``read_mesh``).
        """
        from .meshop import MeshOperator  # the layer above: gather, operator, scatter

        field = mesh.qdata if cls.kind == "mass" else mesh.G
        return MeshOperator(mesh, cls(mesh.basis, field, **kwargs))

    def _setup(self, basis, method, bits, backend, min_bits):
        if not isinstance(basis, TensorBasis):
            raise TypeError(f"basis must be a rnstensor.fem.TensorBasis; got {type(basis).__name__}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}; got {method!r}")
        self.basis, self.method, self.backend = basis, method, backend
        self._bits_arg = bits
        self._min_bits = min_bits

    def _finish_setup(self, skip: frozenset):
        self.plan = _plan(self.kind, self.basis, self._bits_arg, skip, self._min_bits)
        self.bits = self.plan.bits
        self._ops = _encoded_ops(self.basis, self.bits)
        self._skip = skip
        #: the residue program of ``method='rescale_be'`` (:mod:`rnstensor.program`), written once per plan
        self.program, self._constant_keys = _residue_program(self.kind, self.basis, self._bits_arg, skip, self._min_bits)
        self._placed: dict = {}  # per array module: the program's constants, fields and the fused kernel's field

    def _on(self, what: str, xp, make):
        """``make()`` for the array module ``xp``, made (and copied to a device) once per operator."""
        key = (what, xp.__name__)
        if key not in self._placed:
            self._placed[key] = make()
        return self._placed[key]

    def program_constants(self, xp=np) -> list:
        """The constants of :attr:`program` (1-D operators, encoded fields) as values on ``xp``, in source order."""
        return self._constants(xp)

    def program_constants_keys(self) -> tuple:
        """What each constant of :attr:`program` is: ``'B'``, ``'D'``, ``'Bt'``, ``'Dt'`` or a field key."""
        return self._constant_keys

    def _constants(self, xp) -> list:
        """The program's constants (1-D operators, fields) as values on ``xp``, in ``Encode.source`` order."""

        def make():
            fields = self._residue_fields()
            out = []
            for key in self._constant_keys:
                T = self._ops[key] if key in self._ops else fields[key]
                out.append(moved(value_of(T, "", T.bound), xp))
            return out

        return self._on("constants", xp, make)

    def _backend_of(self, x):
        be, xp = dispatch(x, backend=self.backend, names=("u",), fn=f"{type(self).__name__}.apply")
        return be, xp, (be.name if xp is not np else self.backend)

    @property
    def nelem(self) -> int:
        """Number of elements of the geometric data."""
        return self._nelem

    def elements(self, lo: int, hi: int) -> "_Operator":
        """The same operator restricted to elements ``lo:hi``: same plan, width and skipped components.

        Every element's result depends only on that element (its fields and
        ``u`` are encoded with their own exponents), so
        ``op.elements(lo, hi).apply(u[lo:hi])`` equals ``op.apply(u)[lo:hi]``
        bit for bit; :func:`rnstensor.dask.apply` runs element chunks this way.
        """
        lo, hi = int(lo), int(hi)
        if not 0 <= lo < hi <= self._nelem:
            raise ValueError(f"elements: need 0 <= lo < hi <= nelem = {self._nelem}; got lo={lo}, hi={hi}")
        new = copy.copy(self)
        new._nelem = hi - lo
        for name, cache in (("qdata", "_W"), ("G", "_Gres")):
            if hasattr(self, name):
                setattr(new, name, getattr(self, name)[lo:hi])
                setattr(new, cache, None)
        # what this operator placed (on a device) is sliced, not made again: every element has its own exponent
        new._placed = {key: self._slice_placed(key[0], val, lo, hi) for key, val in self._placed.items()}
        return new

    def _slice_placed(self, what: str, val, lo: int, hi: int):
        """Elements ``lo:hi`` of a placed cache entry (see :meth:`_on`)."""
        if what == "constants":
            out = []
            for key, v in zip(self._constant_keys, val):
                if key not in self._ops:  # a field: the element axis is the values' first
                    xp = array_module(v.planes)
                    v = Value(xp.ascontiguousarray(v.planes[:, lo:hi]), v.exp[lo:hi], v.factor, v.bound, v.labels,
                              v.active)
                out.append(v)
            return out
        if what == "fused_field":
            field, fexp = val
            xp = array_module(field)
            return xp.ascontiguousarray(field[:, lo:hi]), fexp[lo:hi]
        if what == "float_fields":
            return {k: a[lo:hi] for k, a in val.items()}
        return {k: tuple(a[lo:hi] for a in v) for k, v in val.items()}  # field_errors

    def place(self, xp) -> None:
        """Encode and move this operator's constants and fields to the array module ``xp`` now (once), not at first use.

        :func:`rnstensor.dask.apply` places an operator on the client before
        its element blocks run, so the blocks slice these rather than encode.
        """
        if self.method == "rescale_be":
            self._constants(xp)
            if xp is not np:
                self._fused_field_on(xp)
        else:
            self._float_fields_on(xp)

    def _float_fields_on(self, xp) -> dict:
        """The float fields of the composed and float64 methods on ``xp`` (copied to a device once)."""
        return self._on("float_fields", xp, lambda: {k: to_module(f, xp) for k, f in self._float_fields().items()})

    def _fused_field_on(self, xp) -> tuple:
        """The encoded field as the fused kernel reads it, and its exponents, on ``xp`` (once per operator)."""
        return self._on("fused_field", xp, lambda: tuple(to_module(a, xp) for a in operator_field(self)))

    def fusion_request(self) -> FusionRequest:
        """What this operator hands a backend's ``compile_program`` to run fused (:func:`rnstensor.fem.fused.fusion_request`).

        Raises
        ------
        ValueError
            If the operator does not run in residues from encode to decode (``method`` other than ``'rescale_be'``).
        """
        return fusion_request(self)

    def _check_u(self, u):
        x, single = self.basis.check_elements(u, self.basis.P)
        if x.shape[0] != self._nelem:
            raise ValueError(
                f"u has {x.shape[0]} elements but the operator's geometric data has {self._nelem}; "
                f"u must have shape ({self._nelem}, {', '.join([str(self.basis.P)] * self.basis.dim)})"
            )
        return x, single

    def _encode_u(self, x):
        return encode(x, self.basis.moduli, self.bits, shared_axes=tuple(range(1, x.ndim)), backend=self.backend)

    def apply_rns(self, u) -> RNSTensor:
        """The ``'rescale_be'`` result before its decode: an :class:`~rnstensor.RNSTensor`, ``(nelem, P, ..., P)``.

        Its bound is exactly the plan's ``final_bound``; decode it with
        :func:`rnstensor.decode`. The operator's :attr:`program` run by the
        executor, where ``u`` lives (CuPy input: every step on the device).
        """
        if self.method != "rescale_be":
            raise ValueError(f"apply_rns needs method='rescale_be' (this operator uses {self.method!r})")
        x, _ = self._check_u(u)
        vals = self._run_program(x)
        return tensor_of(vals[self.program.out], self.basis.moduli)

    def run_program(self, x, observer=None) -> dict:
        """Execute :attr:`program` on element values ``x`` (NumPy or CuPy, of :meth:`apply`'s shape; checked as
        :meth:`apply` checks them: a ``ValueError`` for inf or NaN): every slot's value.

        ``observer`` is handed to :func:`rnstensor.program.execute.execute` (a benchmark's step timer).
        """
        return self._run_program(self._check_u(x)[0], observer)

    def _run_program(self, x, observer=None) -> dict:
        """:meth:`run_program` on values already checked (the runtime encodes them as they are)."""
        be, xp, name = self._backend_of(x)
        consts = self._constants(xp)
        basis = self.basis.moduli

        def encoded(st):
            if st.constant:  # read by products only, which name its axes themselves
                return consts[st.source]
            return encode_value(x, st, basis, be, xp)

        return execute(self.program, be, name, xp, encoded=encoded, observer=observer)

    def apply(self, u, decode: str = "fp64", *, fused: Optional[bool] = None) -> np.ndarray:
        """Apply the operator to element-local nodal values ``u`` of shape ``(nelem, P, ..., P)``.

        ``method='rescale_be'``: one encode, the whole program on residues
        (planned drops + base extension), one decode (``'fp64'`` or
        ``'exact'``). ``'composed'``: every mode product encoded and decoded
        on its own, the pointwise steps in float64. ``'float64'``: plain
        numpy einsum.

        ``fused``: the operator runs fused, every element from load to store
        in fast memory (its :meth:`fusion_request` compiled by the backend): on
        the ``'cpu'`` backend block by block in cache, on ``'cuda'`` as one
        kernel in shared memory. ``None`` (default)
        fuses where it can, ``True`` raises where it cannot, ``False`` runs one
        primitive per step. The bits are the same either way.
        """
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}; got {decode!r}")
        x, single = self._check_u(u)
        d = self.basis.dim
        y = None
        if fused or (fused is None and self.method == "rescale_be"):
            y = self._apply_fused(x, decode, fused)
        if y is not None:
            pass  # the whole operator in one kernel
        elif self.method == "rescale_be":
            y = _decode(self.apply_rns(x), decode, backend=self._backend_of(x)[2])
        elif self.method == "composed":
            be, xp, name = self._backend_of(x)
            run = FloatRunner(lambda z, key, ax: _composed_plan(self.basis, key, ax).run(z, backend=name), self._float_fields_on(xp))
            y = self._program(run, x, d)
        else:
            run = FloatRunner(lambda z, key, ax: _float64_product(self.basis, z, key, ax),
                              self._float_fields_on(array_module(x)))
            y = self._program(run, x, d)
        return y[0] if single else y

    __call__ = apply

    def _apply_fused(self, x: np.ndarray, decode: str, fused: Optional[bool]):
        """The fused kernel's result, or ``None`` where it cannot run (an error instead if ``fused``)."""
        be, xp, _ = self._backend_of(x)
        # one per plan (the operator's element slices share it) and method (only 'rescale_be' compiles)
        prog = fused_program(_FUSED.setdefault(self.program, {}), ("fused_program", be.name, decode, self.method),
                             be, self.fusion_request, decode, x.shape[0], bool(fused), "the fused operator")
        if prog is None:
            return None
        field, fexp = self._fused_field_on(be.xp)  # on the device once per operator
        return be.chain(prog, x, decode, field=field, fexp=fexp)

    def error_bound(self, u, decode: str = "fp64") -> np.ndarray:
        """A rigorous per-element bound on ``max |apply(u) - exact|`` for ``method='rescale_be'``.

        ``exact`` is the operator applied in exact arithmetic to the given
        float64 ``u``, 1-D matrices and geometric fields. The bound propagates
        through the program, per element, the max-norm of the true
        intermediate ``|x|`` and of the error ``|x̂ - x|``::

            product with A:   |x'| = ||A|| |x|,       err' = ||Â|| err + ||Â - A|| |x|
            Hadamard with F:  |x'| = max|F| |x|,      err' = max|F̂| err + max|F̂ - F| |x|
            drop by q:        err' = err + floor(q/2) * unit,   unit' = q * unit
            sums:             magnitudes and errors add

        starting from the encoding error of ``u`` and ending with the decode
        error (``decode_factor * bound * unit``, see
        :func:`rnstensor.program.errors.decode_factor`). ``||.||`` are exact
        row-sum norms, ``unit`` the value of one integer step; every float
        operation is rounded up by a factor ``1 + 2**-45``.

        Returns
        -------
        ndarray of float64, shape (nelem,)
        """
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}; got {decode!r}")
        x, _ = self._check_u(u)
        T = self._encode_u(x)
        xp = array_module(x)
        axes = tuple(range(1, x.ndim))
        # in units of u's encoding and of the field's, per element (exact powers of two): whatever the magnitudes
        # of u and of the geometric field, the bound's numbers are those of the integers
        umag, _, udiff, ku = _field_error(x, T, axes)
        norms = _op_norms(self.basis, self.bits)
        fields = self._on("field_errors", xp, lambda: {
            k: tuple(to_module(a, xp) for a in v) for k, v in self._field_errors().items()})
        operands, kf = {}, 0
        for source, key in enumerate(self._constant_keys):
            if key in norms:  # (||Â||, ||A||, ||Â - A||) and one integer step of the operator
                operands[source] = OperatorBounds(*norms[key], 2.0 ** self._ops[key].scale.exp2)
            else:  # (|F|, |F̂|, |F̂ - F|) per element in the field's units (one exponent for all its components)
                fm, fe, fd, kf = fields[key]
                operands[source] = FieldErrors(fm, fe, fd, 1.0)
        _, err, unit = NormErrors(operands, up=lambda z: z * _INFLATE).run(self.program, (umag, udiff, 1.0))
        dec = float(decode_factor(decode)) * _INFLATE
        scaled = (err + dec * float(self.plan.final_bound) * unit) * _INFLATE
        # back to value units (every path has one Hadamard product with the field): ldexp may round where the
        # result is subnormal, so step one float up and add the subnormal unit; inf where it overflows
        k = xp.clip(ku + kf, -(1 << 20), 1 << 20).astype(np.int32)
        with np.errstate(over="ignore"):
            return xp.nextafter(xp.ldexp(scaled, k), np.inf) + 2.0**-1074

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.basis!r}, nelem={self._nelem}, method={self.method!r}, bits={self.bits})"


class MassOperator(_Operator):
    """The mass operator ``M_e = B^T diag(w detJ) B`` (``B`` the tensor-product interpolation) on every element.

    Parameters
    ----------
    basis : TensorBasis
    qdata : array_like, shape (nelem, Q, ..., Q)
        ``w * detJ`` at every quadrature point (e.g. ``box_mesh(...).qdata``);
        must be positive (a non-positive value means an inverted element).
    method : {'rescale_be', 'composed', 'float64'}
        ``'rescale_be'`` (default): the whole operator between one encode and
        one decode, drops planned once (:attr:`plan`). ``'composed'``: encode
        and decode around every product. ``'float64'``: numpy einsum.
    bits : int, optional
        Encoding width of ``u``, the 1-D matrices and ``qdata``; default the
        widest ``<= 72`` that the basis holds with at least that many bits
        kept at every drop (:data:`rnstensor.fem.program.DEFAULT_BITS`): 72 on
        the default 20 moduli, where the result is at least as accurate as
        numpy's float64 evaluation in practice (BENCHMARKS.md), about 54 on
        ``moduli=15`` (1.5x faster, a few ulps).
    backend : str, optional
        Residue backend name (default: the current one).
    min_bits : int
        The fewest bits the plan may keep (or ``bits``, when smaller), as in
        :func:`rnstensor.einsum`: a plan below it raises :class:`PlanError`.

    Attributes
    ----------
    plan : ProgramPlan
        The drops before every stage and the exact bounds (``plan.describe()``).
    bits : int
        The encoding width used.

    Raises
    ------
    InvertedElementError
        ``qdata`` has a value ``<= 0``.
    PlanError
        The residue basis is too small for the program, or its plan keeps
        fewer than ``min_bits`` bits.

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.fem import TensorBasis, MassOperator, box_mesh
    >>> b = TensorBasis(3)
    >>> mesh = box_mesh(b, shape=(2, 1, 1), upper=(2.0, 1.0, 0.5))
    >>> M = MassOperator(b, mesh.qdata)
    >>> one = np.ones((mesh.nelem, 3, 3, 3))
    >>> round(float(M.apply(one).sum()), 12)  # the volume
    1.0
    """

    kind = "mass"

    def __init__(self, basis: TensorBasis, qdata, *, method: str = "rescale_be", bits: Optional[int] = None,
                 backend: Optional[str] = None, min_bits: int = MIN_BITS):
        self._setup(basis, method, bits, backend, min_bits)
        w, _ = basis.check_elements(qdata, basis.Q, "qdata")
        if np.asarray(qdata).ndim == basis.dim:
            qs = ", ".join([str(basis.Q)] * basis.dim)
            raise ValueError(f"qdata must have a leading element axis: shape (nelem, {qs})")
        bad = np.argwhere(~(w > 0))
        if bad.size:
            first = tuple(int(i) for i in bad[0])
            raise InvertedElementError(
                f"qdata must be positive (w * detJ); {len(bad)} value(s) are <= 0, the first in element {first[0]} "
                f"at quadrature point {first[1:]} ({w[first]!r}): the element is inverted or degenerate; "
                f"check its node ordering or reduce the mesh curvature"
            )
        self.qdata = w
        self._nelem = w.shape[0]
        self._finish_setup(frozenset())
        self._W = None

    def _program(self, run, u, d):
        return mass_program(run, u, d)

    def _residue_fields(self) -> dict:
        if self._W is None:
            self._W = encode(self.qdata, self.basis.moduli, self.bits, shared_axes=tuple(range(1, self.qdata.ndim)),
                             backend=self.backend)
        return {"W": self._W}

    def _float_fields(self) -> dict:
        return {"W": self.qdata}

    def _field_errors(self) -> dict:
        T = self._residue_fields()["W"]
        return {"W": _field_error(self.qdata, T, tuple(range(1, self.qdata.ndim)))}

    def element_diagonal(self) -> np.ndarray:
        """The diagonals of the element matrices, ``(nelem, P, ..., P)``, in float64 (sum factorized).

        ``sum_q W_q prod_k B[q_k, j_k]**2``: the diagonal of :meth:`dense`,
        without forming it.
        """
        B2 = self.basis.B * self.basis.B
        return _diagonal_term(self.qdata, [B2] * self.basis.dim)

    def dense(self, e: int) -> np.ndarray:
        """The dense element matrix of element ``e`` in float64 (Kronecker products; for tests and small cases)."""
        K = _kron_all([self.basis.B] * self.basis.dim)
        return K.T @ (self.qdata[e].reshape(-1)[:, None] * K)


def _diagonal_term(F: np.ndarray, mats) -> np.ndarray:
    """``sum_q F[e, q] prod_k mats[k][q_k, j_k]`` for every element ``e`` and node ``j`` (float64 einsum)."""
    d = len(mats)
    q, j = "abc"[:d], "ijk"[:d]
    subs = ",".join(f"{a}{b}" for a, b in zip(q, j))
    return np.einsum(f"e{q},{subs}->e{j}", F, *mats, optimize=True)


def _kron_all(mats) -> np.ndarray:
    K = mats[0]
    for A in mats[1:]:
        K = np.kron(K, A)
    return K


class PoissonOperator(_Operator):
    """The Poisson (stiffness) operator ``A_e = sum_ij grad_i^T diag(G_ij) grad_j`` on every element.

    ``grad_i`` is ``D`` along axis ``i`` and ``B`` along the others;
    ``G = w adj(J) adj(J)^T / detJ`` at every quadrature point.

    Parameters
    ----------
    basis : TensorBasis
    G : array_like
        Packed symmetric components, shape ``(nelem, 6, Q, Q, Q)`` in 3-D
        (order ``xx yy zz yz xz xy``) or ``(nelem, 3, Q, Q)`` in 2-D
        (``xx yy xy``); or the full ``(nelem, dim, dim, Q, ...)`` (symmetric).
        The diagonal must be positive (a non-positive diagonal means an
        inverted element).
    method, bits, backend
        As in :class:`MassOperator`.

    Examples
    --------
    >>> import numpy as np
    >>> from rnstensor.fem import TensorBasis, PoissonOperator, box_mesh
    >>> b = TensorBasis(4, dim=2)
    >>> mesh = box_mesh(b, shape=(2, 2), curved=0.2)
    >>> A = PoissonOperator(b, mesh.G)
    >>> bool(np.abs(A.apply(np.full((4, 4, 4), 3.0))).max() < 1e-13)  # constants: the kernel
    True
    """

    kind = "poisson"

    def __init__(self, basis: TensorBasis, G, *, method: str = "rescale_be", bits: Optional[int] = None,
                 backend: Optional[str] = None, min_bits: int = MIN_BITS):
        self._setup(basis, method, bits, backend, min_bits)
        d, Q = basis.dim, basis.Q
        ncomp = 3 * (d - 1)
        g = check_float_array(G, "G")
        qs = (Q,) * d
        if g.ndim == d + 3 and g.shape[1:3] == (d, d) and g.shape[3:] == qs:
            if not np.array_equal(g, np.swapaxes(g, 1, 2)):
                raise ValueError("G given as full (nelem, dim, dim, Q...) matrices must be symmetric")
            packed = np.empty((g.shape[0], ncomp) + qs)
            for i in range(d):
                for j in range(i, d):
                    packed[:, voigt_index(i, j, d)] = g[:, i, j]
            g = packed
        elif g.ndim != d + 2 or g.shape[1:] != (ncomp,) + qs:
            raise ValueError(
                f"G must have shape (nelem, {ncomp}, {', '.join(map(str, qs))}) (packed symmetric, "
                f"{'xx yy zz yz xz xy' if d == 3 else 'xx yy xy'}) or (nelem, {d}, {d}, {', '.join(map(str, qs))}); "
                f"got {g.shape}"
            )
        diag = g[:, :d]
        bad = np.argwhere(~(diag > 0))
        if bad.size:
            first = tuple(int(i) for i in bad[0])
            raise InvertedElementError(
                f"G must be positive definite at every quadrature point; {len(bad)} diagonal value(s) are <= 0, the "
                f"first in element {first[0]} (component {first[1]}, point {first[2:]}): detJ <= 0 there, the "
                f"element is inverted or degenerate; check its node ordering or reduce the mesh curvature"
            )
        self.G = g
        self._nelem = g.shape[0]
        skip = frozenset(c for c in range(d, ncomp) if not g[:, c].any())
        self._finish_setup(skip)
        self._Gres = None

    def _program(self, run, u, d):
        return poisson_program(run, u, d, self._skip)

    def _residue_fields(self) -> dict:
        if self._Gres is None:
            shared = tuple(range(1, self.G.ndim))
            T = encode(self.G, self.basis.moduli, self.bits, shared_axes=shared, backend=self.backend)
            vec = T.scale.axes[0]
            out = {}
            for c in range(self.G.shape[1]):
                if c in self._skip:
                    continue
                planes = np.ascontiguousarray(T.residues[:, :, c])
                scale = Scale(T.scale.exp2, T.scale.factor, (vec,) + (None,) * self.basis.dim, None)
                out[("G", c)] = RNSTensor(planes, T.basis, T.active, T.bound, scale)
            self._Gres = (T, out)
        return self._Gres[1]

    def _float_fields(self) -> dict:
        return {("G", c): self.G[:, c] for c in range(self.G.shape[1])}

    def _field_errors(self) -> dict:
        self._residue_fields()
        T = self._Gres[0]
        axes = tuple(range(1, self.G.ndim))
        fm, fe, fd, fu = _field_error(self.G, T, axes)
        return {("G", c): (fm, fe, fd, fu) for c in range(self.G.shape[1])}

    def element_diagonal(self) -> np.ndarray:
        """The diagonals of the element matrices, ``(nelem, P, ..., P)``, in float64 (sum factorized).

        ``sum_ij sum_q G_ij,q prod_k M_i[q_k, j_k] M_j[q_k, j_k]`` with
        ``M_i`` = ``D`` on axis ``i``, ``B`` elsewhere: the diagonal of
        :meth:`dense`, without forming it.
        """
        d, b = self.basis.dim, self.basis
        out = np.zeros((self._nelem,) + (b.P,) * d)
        for i in range(d):
            for j in range(i, d):
                mats = [(b.D if a == i else b.B) * (b.D if a == j else b.B) for a in range(d)]
                out += (1.0 if i == j else 2.0) * _diagonal_term(self.G[:, voigt_index(i, j, d)], mats)
        return out

    def dense(self, e: int) -> np.ndarray:
        """The dense element matrix of element ``e`` in float64 (Kronecker products; for tests and small cases)."""
        d, b = self.basis.dim, self.basis
        K = [_kron_all([b.D if a == i else b.B for a in range(d)]) for i in range(d)]
        A = np.zeros((b.P**d, b.P**d))
        for i in range(d):
            for j in range(d):
                A += K[i].T @ (self.G[e, voigt_index(i, j, d)].reshape(-1)[:, None] * K[j])
        return A
