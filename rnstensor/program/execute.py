"""Running a residue program on a backend: NumPy arrays on the CPU backends, CuPy arrays on the CUDA backend.

The executor walks a :class:`~rnstensor.ir.Program` step by step, in the
array module its caller found once and hands it (no step asks again). A
slot's value is a :class:`Value`: planes, exponents, factor, bound and labels,
all where the data lives (the exponents are small arrays, of the planes' array
module, or host vectors beside device planes in a Dask tile). Nothing
data-sized leaves the device between the encodes and the decode; constant
operands come from the builder's cache, encoded once per device. An *observer* (the running error analysis of :mod:`.errors`) sees
every step with its operands and result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..arith import alpha_parts, drop_spec
from ..arrays import to_module
from ..basis import Basis, centered, pow2_cycle
from ..errors import RNSRangeError
from ..encode import as_basis, encode, encode_checked
from ..primitives import decode as decode_tensor
from ..tensor import RNSTensor, Scale
from ..ir import Add, Combine, Contract, Contract3M, Decode, Drop, Encode, Fold, Operand, Program, Reencode, Sum

__all__ = ["DeferredValue", "ProductValue", "Value", "Exps", "execute", "run_step", "encode_value", "value_of",
           "tensor_of", "moved", "permuted", "alpha_parts", "last_reads"]


class Exps:
    """A value's exponents as a sum of small int64 terms, each with one dim per label (size 1 where constant).

    A product adds its operator's row exponents as one more term rather than
    a full-size array: the sum is formed once, when something reads it
    (:meth:`total`: a decode, the error analysis). Layout steps map over the
    terms.
    """

    __slots__ = ("terms",)

    def __init__(self, terms):
        self.terms = tuple(terms)

    @property
    def ndim(self) -> int:
        return self.terms[0].ndim

    @property
    def shape(self) -> tuple:
        return tuple(np.broadcast_shapes(*(tuple(t.shape) for t in self.terms)))

    def total(self):
        """The exponent of every entry: the terms summed (a broadcastable array, not kept: it can be full-size)."""
        e = self.terms[0]
        for t in self.terms[1:]:
            e = e + t
        return e

    def map(self, f) -> "Exps":
        return Exps(f(t) for t in self.terms)

    def transpose(self, perm) -> "Exps":
        return self.map(lambda t: t.transpose(perm))

    def __add__(self, other: "Exps") -> "Exps":
        return Exps(self.terms + other.terms)

    def max(self, axis: int) -> "Exps":
        """The exponents made constant along ``axis``: their largest there (only the terms varying along it change)."""
        vary = [t for t in self.terms if t.shape[axis] > 1]
        if not vary:
            return self
        m = vary[0]
        for t in vary[1:]:
            m = m + t
        return Exps([t for t in self.terms if t.shape[axis] == 1] + [m.max(axis=axis, keepdims=True)])

    def __getitem__(self, idx) -> "Exps":
        """Indexing of the leading axes (ints and slices); a term constant along an axis keeps its size 1 there."""
        idx = idx if isinstance(idx, tuple) else (idx,)

        def one(t):
            sel = tuple((k if t.shape[a] > 1 else (0 if isinstance(k, (int, np.integer)) else slice(None)))
                        for a, k in enumerate(idx))
            return t[sel]

        return self.map(one)


@dataclass
class Value:
    """A slot's residues at run time: planes ``(L, *shape)``, exponents, the dropped-moduli factor, bound, labels.

    ``exp`` (:class:`Exps`; an int64 array is taken as its one term) has one
    dim per label, size 1 where the exponent is constant; ``active`` the
    moduli of the planes (``None``: the whole basis); ``source`` the float
    array an encoded operand came from (its integers ``round_half_even(source
    * 2**-exp)``), where the caller has it: a backend's exact GEMM engine
    may take the product from it (:func:`_engine_product`).
    """

    planes: Any
    exp: Any
    factor: int
    bound: int
    labels: str
    active: Optional[tuple] = None
    source: Any = None

    def __post_init__(self):
        if not isinstance(self.exp, Exps):
            self.exp = Exps((self.exp,))


class DeferredValue(Value):
    """An encoded operand whose planes are made on first use: an exact GEMM engine that takes its product from the
    floats (:func:`_engine_product`) leaves them unmade. ``make()`` gives the planes; ``exp`` is known before."""

    def __init__(self, make, exp, factor: int, bound: int, labels: str, source):
        self._planes, self._make = None, make
        super().__init__(None, exp, factor, bound, labels, None, source)

    @property
    def planes(self):
        if self._planes is None and self._make is not None:
            self._planes, self._make = self._make(), None
        return self._planes

    @planes.setter
    def planes(self, value) -> None:
        self._planes = value


class ProductValue(DeferredValue):
    """A product step's result taken by the backend's exact GEMM engine (:func:`_engine_product`): its planes made
    on first use, or, where nothing reads them, :meth:`exact` (its values correctly rounded, straight from the
    engine: the bits of the planes decoded exactly, without the planes, for a front end whose exact decode reads
    this value alone)."""

    def __init__(self, make, exact, exp, factor: int, bound: int, labels: str):
        super().__init__(make, exp, factor, bound, labels, None)
        self._exact = exact

    def exact(self):
        """The values ``2**exp`` times the product's integers (the dropped-moduli ``factor`` aside), correctly
        rounded, axes as :attr:`labels`."""
        return self._exact()


def moved(v: Value, xp) -> Value:
    """``v`` in the array module ``xp``: an explicit copy across the bus where it lives on the other side (once)."""
    return Value(to_module(v.planes, xp), v.exp.map(lambda t: to_module(t, xp)), v.factor, v.bound, v.labels, v.active)


def tensor_of(v: Value, basis: Basis) -> RNSTensor:
    """The value as an :class:`~rnstensor.RNSTensor` (its exponents as the scale's field, shared, not copied)."""
    active = basis.moduli if v.active is None else v.active
    exp = v.exp.total()
    if isinstance(exp, np.ndarray) and exp.dtype == np.int64 and exp.base is None and exp.flags.writeable:
        exp.setflags(write=False)  # nothing writes a value's exponents: the scale can keep this array
    return RNSTensor(v.planes, basis, active, v.bound, Scale(0, v.factor, (None,) * len(v.labels), exp))


def value_of(T: RNSTensor, labels: str, bound: int, xp=None) -> Value:
    """An encoded tensor as a value: its exponents with one dim per axis (``xp``: its residues' array module, where
    the caller has it)."""
    e = T.exponent(xp).astype(np.int64, copy=False)
    e = e.reshape(tuple(e.shape) + (1,) * (T.ndim - e.ndim))
    return Value(T.residues, e, T.scale.factor, bound, labels, None if T.active == T.basis.moduli else T.active)


def permuted(v: Value, labels: str):
    """``(planes, exp)`` of ``v`` with its axes in the order of ``labels``."""
    perm = [v.labels.index(c) for c in labels]
    return v.planes.transpose([0] + [p + 1 for p in perm]), v.exp.transpose(perm)


def _drop_axes(exp: Exps, axes: Sequence[int]) -> Exps:
    """The exponents without the (constant) axes ``axes``."""
    return exp.map(lambda t: t.reshape([n for i, n in enumerate(t.shape) if i not in axes]))


def _insert_axes(exp: Exps, at: int, count: int) -> Exps:
    """The exponents with ``count`` constant axes inserted before axis ``at``."""
    return exp.map(lambda t: t.reshape(tuple(t.shape[:at]) + (1,) * count + tuple(t.shape[at:])))


def _moduli(v: Value, basis: Basis) -> tuple:
    return basis.moduli if v.active is None else v.active


def _planes_on(planes, have: tuple, active: tuple):
    """Planes on the moduli ``have`` restricted to ``active`` (the other operand's, after its drops), in that order."""
    if have == active:
        return planes
    return planes[[have.index(p) for p in active]]


def _sum(v: Value, over: str, bound: int, basis: Basis, be, xp) -> Value:
    """The residues of the sum over the labels ``over``: a product with a row of ones (exact, any backend)."""
    axes = [v.labels.index(c) for c in over]
    keep = [a for a in range(len(v.labels)) if a not in axes]
    moved = v.planes.transpose([0] + [a + 1 for a in keep] + [a + 1 for a in axes])
    n = math.prod(v.planes.shape[a + 1] for a in axes)
    flat = xp.ascontiguousarray(moved).reshape(tuple(moved.shape[: 1 + len(keep)]) + (n,))
    moduli = _moduli(v, basis)
    out = be.product(xp.ones((len(moduli), 1, n), np.int8), flat, moduli, flat.ndim - 2)
    labels = "".join(v.labels[a] for a in keep)
    return Value(out.reshape(out.shape[:-1]), _drop_axes(v.exp, axes), v.factor, bound, labels, v.active)


def _contract(X: Value, Y: Value, st: Contract, basis: Basis, be, xp) -> Value:
    sides = st.gemm_sides()
    if sides is not None:
        rows, cols = ((X, st.x_keep), (Y, st.y_keep))[:: 1 if sides == "xy" else -1]
        product = _engine_product(rows, cols, st.contracted, st.bound, _moduli(X, basis), be, xp)
        if product is not None:  # (the operands' planes, where deferred, are never made)
            xs, ys = (tuple(v.source.shape[v.labels.index(c)] for c in keep) for v, keep in (rows, cols))
            L = len(_moduli(X, basis))
            exps = _product_exps(X, Y, st)
            if sides == "yx":  # (the exponents in the result's order)
                exps = exps.transpose([(st.x_keep + st.y_keep).index(c) for c in st.labels])
            return ProductValue(lambda: product.residues().reshape((L,) + xs + ys),
                                lambda: product.decoded().reshape(xs + ys), exps,
                                X.factor * Y.factor, st.bound, st.labels)
    C, Bt, Kx, Ky, kind = st.contracted, st.batch, st.x_keep, st.y_keep, st.kind
    if st.x_sum:
        X = _sum(X, st.x_sum, 0, basis, be, xp)
    if st.y_sum:
        Y = _sum(Y, st.y_sum, 0, basis, be, xp)
    factor = X.factor * Y.factor
    moduli = _moduli(X, basis)
    L = len(moduli)
    if kind in ("mode", "mode_rev"):
        T, op, kop = (X, Y, Ky) if kind == "mode" else (Y, X, Kx)
        moduli = _moduli(T, basis)
        ax = T.labels.index(C)
        op_planes, op_exp = permuted(op, kop + C)
        op_planes = _planes_on(op_planes, _moduli(op, basis), moduli)
        planes = be.product(xp.ascontiguousarray(op_planes), xp.ascontiguousarray(T.planes), moduli, ax)
        shape = [1] * len(T.labels)
        rows = op_exp.total()
        shape[ax] = rows.shape[0]
        return Value(planes, T.exp + Exps((rows.reshape(shape),)), factor, st.bound, st.labels, T.active)
    xp_, _ = permuted(X, Bt + Kx + C)
    yp, _ = permuted(Y, Bt + C + Ky)
    nb, nx, ny, nc = len(Bt), len(Kx), len(Ky), len(C)
    bs, xs, ys = xp_.shape[1 : 1 + nb], xp_.shape[1 + nb : 1 + nb + nx], yp.shape[1 + nb + nc :]
    if kind == "outer":
        full = (L,) + bs + xs + ys
        xb = xp.broadcast_to(xp_.reshape((L,) + bs + xs + (1,) * ny), full)
        yb = yp.reshape((L,) + bs + (1,) * nx + ys)
        planes = be.hadamard(xp.ascontiguousarray(xb), xp.ascontiguousarray(yb), moduli)
    else:
        k = math.prod(xp_.shape[1 + nb + nx :])
        # reshape copies only when the index order needs it; the backend takes strided operands
        xm = xp_.reshape(L, math.prod(bs), math.prod(xs), k)
        ym = yp.reshape(L, math.prod(bs), k, math.prod(ys))
        planes = be.matmul(xm, ym, moduli).reshape((L,) + bs + xs + ys)
    return Value(planes, _product_exps(X, Y, st), factor, st.bound, st.labels, X.active)


def _product_exps(X: Value, Y: Value, st: Contract) -> Exps:
    """The exponents of a contraction's result (batch, ``x_keep``, ``y_keep`` axes): each operand's, constant along
    the contracted indices (size-1 dims there: dropped), broadcast over the other's kept axes."""
    Bt, Kx, Ky, C = st.batch, st.x_keep, st.y_keep, st.contracted
    nb, nx, ny, nc = len(Bt), len(Kx), len(Ky), len(C)
    xe = X.exp.transpose([X.labels.index(c) for c in Bt + Kx + C])
    ye = Y.exp.transpose([Y.labels.index(c) for c in Bt + C + Ky])
    return (_insert_axes(_drop_axes(xe, range(nb + nx, nb + nx + nc)), nb + nx, ny)
            + _insert_axes(_drop_axes(ye, range(nb, nb + nc)), nb, nx))


def _engine_product(rows: tuple, cols: tuple, contracted: str, bound: int, moduli: tuple, be, xp):
    """A GEMM-shaped product of two encoded operands (``rows``, ``cols``: each ``(value, its kept labels)``, the
    result's axes the first's then the second's) taken by the backend's exact GEMM engine (``exact_product``: the
    CPU's wide moduli in float64 BLAS), from the floats they were encoded from: its residues (the INT8 product's
    bits) or its exact decode, made when asked; ``None`` where the backend has none or declines it, or the
    operands are not two fresh encodings (drops, a factor, no floats)."""
    (X, x_keep), (Y, y_keep) = rows, cols
    engine = getattr(be, "exact_product", None)
    if (engine is None or X.source is None or Y.source is None
            or X.active is not None or Y.active is not None or X.factor != 1 or Y.factor != 1
            or X.source.dtype != np.float64 or Y.source.dtype != np.float64):
        return None
    nc = len(contracted)
    xorder, yorder = x_keep + contracted, contracted + y_keep
    xs = X.source.transpose([X.labels.index(c) for c in xorder])
    ys = Y.source.transpose([Y.labels.index(c) for c in yorder])
    M, K = math.prod(xs.shape[: len(x_keep)]), math.prod(xs.shape[len(x_keep):])
    N = math.prod(ys.shape[nc:])
    # the encode exponents: constant along the contracted indices (one per row of the first, column of the second)
    ea = -xp.broadcast_to(X.exp.transpose([X.labels.index(c) for c in xorder]).total(),
                          xs.shape[: len(x_keep)] + (1,) * nc).reshape(M)
    eb = -xp.broadcast_to(Y.exp.transpose([Y.labels.index(c) for c in yorder]).total(),
                          (1,) * nc + ys.shape[nc:]).reshape(N)
    return engine(xs.reshape(M, K), ys.reshape(K, N), ea.astype(np.int64), eb.astype(np.int64), bound, moduli)


def _contract_3m(X: Value, Y: Value, st: Contract3M, basis: Basis, be, xp) -> Value:
    """The 3M complex mode product: the backend's fused kernel where it has one, else its composition (same bits)."""
    moduli = _moduli(X, basis)
    ax = X.labels.index(st.contracted) - 1  # within one part (the first axis is (re, im))
    kop = st.y_labels[1:].replace(st.contracted, "")
    op_planes, op_exp = permuted(Y, st.y_labels[0] + kop + st.contracted)
    ore, oim = (xp.ascontiguousarray(op_planes[:, p]) for p in (0, 1))
    xre, xim = (xp.ascontiguousarray(X.planes[:, p]) for p in (0, 1))
    fused = getattr(be, "product_3m", None)
    if fused is not None:
        re, im = fused(ore, oim, xre, xim, moduli, ax)
    else:
        P0 = be.product(ore, xre, moduli, ax)
        P1 = be.product(oim, xim, moduli, ax)
        P2 = be.product(be.add(ore, oim, moduli), be.add(xre, xim, moduli), moduli, ax)
        re = be.add(P0, P1, moduli, True)
        im = be.add(be.add(P2, P0, moduli, True), P1, moduli, True)
    shape = [1] * (len(X.labels) - 1)
    rows = op_exp.total()
    shape[ax] = rows.shape[1]
    exp = X.exp[0] + Exps((rows[0].reshape(shape),))
    return Value(xp.stack([re, im], axis=1), exp.map(lambda t: t[None]), X.factor * Y.factor, st.bound, st.labels,
                 X.active)


def combine_parts(z, i: int, j: int):
    """``part(a, b)`` of an array whose axes ``i`` and ``j`` are two operands' (re, im) axes.

    ``part(a, b)`` is part ``b`` of the first operand (axis ``i``) times part
    ``a`` of the second (axis ``j``).
    """

    def part(a: int, b: int):
        return z.take(a, axis=j).take(b, axis=i if i < j else i - 1)

    return part


def _combine(v: Value, st: Combine, basis: Basis, be, xp) -> Value:
    """(re, im) times (re, im): ``Re = P00 - P11``, ``Im = P01 + P10`` (the exact 4M form)."""
    moduli = _moduli(v, basis)
    i, j = v.labels.index(st.re_x), v.labels.index(st.re_y)
    part = combine_parts(v.planes, i + 1, j + 1)
    re = be.add(xp.ascontiguousarray(part(0, 0)), xp.ascontiguousarray(part(1, 1)), moduli, True)
    im = be.add(xp.ascontiguousarray(part(1, 0)), xp.ascontiguousarray(part(0, 1)), moduli, False)
    exp = _drop_axes(v.exp, (i, j)).map(lambda t: t[None])
    return Value(xp.stack([re, im], axis=1), exp, v.factor, v.bound, st.labels, v.active)


@lru_cache(maxsize=64)
def _pow2_cycles(moduli: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per modulus: the centered residues of ``2**k`` for ``k < a + t`` (``pow2_cycle``), padded; ``a``; ``t``."""
    cycles = [pow2_cycle(p) for p in moduli]
    width = max(a + t for a, t in cycles)
    tab = np.zeros((len(moduli), width), np.int8)
    for i, (p, (a, t)) in enumerate(zip(moduli, cycles)):
        for k in range(a + t):
            tab[i, k] = centered(pow(2, k, p), p)
    a = np.array([c[0] for c in cycles], np.int64)
    t = np.array([c[1] for c in cycles], np.int64)
    for arr in (tab, a, t):
        arr.setflags(write=False)
    return tab, a, t


def pow2_residues(d, moduli: tuple, xp, tables: Optional[Callable] = None):
    """Centered residues ``[2**d]_p`` (int8, ``(L, *d.shape)``) of non-negative int64 shifts ``d``, where ``d`` lives.

    ``[2**d]_p = [2**(a + (d - a) % t)]_p`` for ``d >= a`` (:func:`~rnstensor.basis.pow2_cycle`), so a table of
    ``a + t`` entries per modulus gives any power. ``tables`` turns host tables into device ones (a cache).
    """
    tab, a, t = _pow2_cycles(tuple(moduli))
    if tables is not None:
        tab, a, t = tables(("pow2", tuple(moduli)), lambda: (tab, a, t))
    shape = (len(moduli),) + (1,) * d.ndim
    a, t = a.reshape(shape), t.reshape(shape)
    k = xp.where(d[None] < a, d[None], a + (d[None] - a) % t)
    rows = xp.arange(len(moduli)).reshape(shape)
    return tab[rows, k]


def _align(T: RNSTensor, st: Operand, be, tables, xp) -> Value:
    """An RNSTensor operand on the full basis with exponents constant along ``shared`` (exact shifts)."""
    planes = T.residues
    if T.active != T.basis.moduli:
        planes, _ = be.drop_extend(planes, T.active, T.basis, 0, True)
    e = T.exponent().astype(np.int64, copy=False)
    if st.shared and e.size > 1:
        lo = e.min(axis=st.shared, keepdims=True)
        d = e - lo
        if int(d.max()) > 0:
            mods = T.basis.moduli
            pw = pow2_residues(d, mods, xp, tables)
            planes = be.hadamard(xp.ascontiguousarray(planes), xp.ascontiguousarray(pw), mods)
        e = lo
    return Value(planes, e, T.scale.factor, st.bound, st.labels)


def _decode_real(T: RNSTensor, mode: str, alpha: float, backend, xp):
    """``alpha * value(T)``: ``alpha``'s significand and exponent join the exact scale (correctly rounded for 'exact')."""
    if alpha == 1.0:
        return decode_tensor(T, mode, backend=backend)
    if alpha == 0:
        return xp.zeros(T.shape)
    if not math.isfinite(alpha):
        with np.errstate(invalid="ignore"):
            return alpha * decode_tensor(T, mode, backend=backend)
    ma, ea = alpha_parts(alpha)
    scaled = RNSTensor(T.residues, T.basis, T.active, T.bound,
                       T.scale.replace(factor=T.scale.factor * ma, exp2=T.scale.exp2 + ea))
    out = decode_tensor(scaled, mode, backend=backend)
    return -out if alpha < 0 else out


def _decode(v: Value, st: Decode, basis: Basis, backend, xp) -> Any:
    """The slot decoded, times ``alpha`` (a complex result from its (re, im) axis when ``st.complex``)."""
    if not st.complex:
        return _decode_real(tensor_of(v, basis), st.mode, complex(st.alpha).real, backend, xp)
    parts = [tensor_of(Value(v.planes[:, p], v.exp[0], v.factor, v.bound, v.labels[1:], v.active), basis)
             for p in (0, 1)]
    ar, ai = complex(st.alpha).real, complex(st.alpha).imag
    re, im = parts
    out = xp.empty(re.shape, np.complex128)
    # (ar + i ai)(Re + i Im): each term correctly rounded, one float64 sum where both parts are nonzero
    if ai:  # (two terms past the range give inf - inf: NaN, which the GEMM front end recomputes exactly)
        with np.errstate(invalid="ignore", over="ignore"):
            out.real[...] = _decode_real(re, st.mode, ar, backend, xp) - _decode_real(im, st.mode, ai, backend, xp)
            out.imag[...] = _decode_real(im, st.mode, ar, backend, xp) + _decode_real(re, st.mode, ai, backend, xp)
    else:
        out.real[...] = _decode_real(re, st.mode, ar, backend, xp)
        out.imag[...] = _decode_real(im, st.mode, ar, backend, xp)
    return out


def _named(v: Value, labels: str) -> Value:
    """``v`` with its axes called ``labels`` (a step names its operands' axes; the value is not changed)."""
    return v if v.labels == labels else Value(v.planes, v.exp, v.factor, v.bound, labels, v.active)


def encode_value(x, st: Encode, basis: Basis, be, xp) -> Value:
    """The value of an :class:`Encode` step for the float array ``x`` (as the builder prepared and checked it:
    finite, nonempty float64 on ``xp``), encoded by the backend ``be``."""
    T = encode_checked(x, as_basis(basis), st.bits, tuple(st.shared), be, xp)
    return value_of(T, st.labels, st.bound, xp)


def run_step(st, vals: dict, basis: Basis, be, backend_name, xp, *, encoded=None, operand=None, tables=None):
    """Execute one step on the slot values ``vals`` (updated in place); returns the new value.

    ``xp`` is the values' array module (``numpy`` or ``cupy``), which the
    front end found once from its operands (:func:`rnstensor.backends.dispatch`)
    and carries: no step asks for it again. ``encoded(step)`` gives an
    :class:`Encode` step's value (the builder encodes its argument, or takes a
    constant from its cache: see :func:`encode_value`), ``operand(step)`` an
    :class:`Operand` step's RNSTensor; ``tables(key, make)`` caches host tables
    on the backend's device.
    """
    if isinstance(st, Encode):
        v = encoded(st)
    elif isinstance(st, Operand):
        v = _align(operand(st), st, be, tables, xp)
    elif isinstance(st, Drop):
        x = vals[st.x]
        active = _moduli(x, basis)
        order = tuple(st.moduli)
        planes, after = be.drop_extend(x.planes, active, basis, drop_spec(active, order), st.extend)
        v = Value(planes, x.exp, x.factor * math.prod(order), st.bound, x.labels,
                  None if tuple(after) == basis.moduli else tuple(after))
    elif isinstance(st, Reencode):
        x = vals[st.x]
        y = decode_tensor(tensor_of(x, basis), "fp64", backend=backend_name)
        if not bool(xp.isfinite(y).all()):  # one flag back: the intermediate left float64's range, not the input
            raise RNSRangeError(
                f"the composed method decodes every intermediate to float64, and the one after this product "
                f"overflows it ({int((~xp.isfinite(y)).sum())} entries beyond 1.8e308) although the final result may "
                f"be finite; pass method='rescale_be' (the intermediates stay in residues), or leave method and "
                f"moduli unset (the certified default)")
        v = value_of(encode(y, basis, bits=st.bits, shared_axes=st.shared, backend=backend_name), st.labels, st.bound,
                     xp)
    elif isinstance(st, Fold):
        x = vals[st.x]
        v = Value(x.planes, x.exp.max(x.labels.index(st.label)), x.factor, x.bound, x.labels, x.active)
    elif isinstance(st, Sum):
        v = _sum(_named(vals[st.x], st.x_labels), st.over, st.bound, basis, be, xp)
    elif isinstance(st, Contract):
        v = _contract(_named(vals[st.x], st.x_labels), _named(vals[st.y], st.y_labels), st, basis, be, xp)
    elif isinstance(st, Contract3M):
        v = _contract_3m(_named(vals[st.x], st.x_labels), _named(vals[st.y], st.y_labels), st, basis, be, xp)
    elif isinstance(st, Combine):
        v = _combine(vals[st.x], st, basis, be, xp)
    elif isinstance(st, Add):
        x, y = vals[st.x], vals[st.y]
        planes = be.add(x.planes, y.planes, _moduli(x, basis), st.subtract)
        v = Value(planes, x.exp, x.factor, st.bound, x.labels, x.active)
    elif isinstance(st, Decode):
        v = _decode(vals[st.x], st, basis, backend_name, xp)
    else:  # pragma: no cover - a builder's bug
        raise TypeError(f"unknown program step {type(st).__name__}")
    vals[st.out] = v
    return v


def _reads(st) -> tuple:
    return tuple(k for k in (getattr(st, "x", None), getattr(st, "y", None)) if k is not None)


def last_reads(program: Program) -> dict:
    """``{slot: index of the last step that reads it}``: the executor frees a slot after it."""
    last: dict = {}
    for i, st in enumerate(program.steps):
        for k in _reads(st):
            last[k] = i
    return last


def execute(program: Program, be, backend_name, xp, *, encoded=None, operand=None, tables=None, observer=None,
            vals: Optional[dict] = None, start: int = 0) -> dict:
    """Run the steps of ``program`` on backend ``be``; returns the slot values (the result at ``program.out``).

    ``xp``: the values' array module (see :func:`run_step`). A slot is
    freed after the last step that reads it (the result is kept).
    ``observer(step, before, after, vals)`` is called after each step with
    the operand values it read (``before``) and its result. ``vals`` and
    ``start``: run from step ``start`` on values the caller has made (its
    first steps' results, e.g. an input encoded by the caller's own means).
    """
    vals = {} if vals is None else vals
    last = last_reads(program)
    for i, st in enumerate(program.steps[start:], start):
        reads = _reads(st)
        before = {k: vals[k] for k in reads} if observer is not None else None
        v = run_step(st, vals, program.basis, be, backend_name, xp, encoded=encoded, operand=operand, tables=tables)
        if observer is not None:
            observer(st, before, v, vals)
        for k in reads:
            if last.get(k) == i and k != st.out and k != program.out:
                vals.pop(k, None)
    return vals
