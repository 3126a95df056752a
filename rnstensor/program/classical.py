"""The classical float64 bound of a residue program's result, certified per call before it runs.

A float64 evaluation of the same contractions in the same order obeys
``|ŷ - y| <= γ_m (|A| |B| ...)`` entrywise, ``γ_m = m u / (1 - m u)``,
where ``m`` counts the terms along the path (``k`` for a contraction of
``k`` terms, ``n`` for a sum of ``n``: at least the roundings a term meets). :class:`ClassicalErrors`
follows a program's steps and proves, for the operands at hand, that the
residue result meets that bound; the caller escalates (more moduli, wider
encodings) or evaluates otherwise where it cannot.

Per value it holds, in units of the value's own integer step:

* ``c`` and ``sc``, a float64 array and a scalar with
  ``c sc (1 - g) <= |A||B|... <= c sc (1 + g)`` (the exact magnitude product
  in those units; one scalar ``g`` per value; a drop divides ``sc`` only);
* scalars ``r`` and ``a`` with ``|x̂ - x| <= r |A||B|... + a`` on every
  entry whose magnitude product is nonzero; every other entry is exactly
  zero, computed and true (zeros encode exactly, and products, sums and
  drops of zeros are zero).

A product of ``x`` and ``y`` over ``k`` terms gives
``r = r_x + r_y + r_x r_y`` (relative errors of magnitude products add) plus,
for the absolute parts, ``max (a_y (1 + r_x) Σ|x| + a_x (1 + r_y) Σ|y| + k a_x a_y) / c``
over the entries: one reduction per operand instead of a second contraction
(on the CPU a mode product's magnitudes, their minimum and this ratio come
from one fused pass, :func:`rnstensor.backends.cpu.mode_magnitudes`). A drop
divides ``sc`` and ``a`` by its modulus product and adds one unit to ``a``;
an encoding sets ``a = 1/2`` (0 where every entry is encoded exactly); a
complex product's parts combine (:class:`~.ir.Combine`) by adding their
magnitudes. ``c`` is a plain float64 contraction of nonnegative numbers: its
rounding, a relative ``(k + 3) 2**-52`` at most with the scale's, is folded
into ``g``. So that ``c = 0`` means an exactly zero magnitude, every positive
entry must stay above :data:`TINY_UNIT` (in units, where the numbers are the
integers' size, this fails only for operands spanning about 550 binades in
one exponent slice, which the certification then refuses).

The final fp64 decode adds at most ``u (1 + 2**-40)`` of the decoded value
(:func:`~rnstensor.program.errors.decode_factor`); a result with ``r = a = 0``
is the exact integer, decoded ``'exact'`` (correctly rounded: ``u |y|``) where
the bound allows one rounding only (``m <= 1``). A complex result's parts are
each held to ``γ_m`` of the complex magnitudes, at least either part's
magnitude sum, so that ``|ŷ - y| <= sqrt(2) γ_m (|A| |B| ...)``.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from ..arrays import to_module
from ..backends.cpu import chain_magnitude_stats, chain_stats_warm, encode_magnitudes, mode_magnitudes
from .errors import _letters, _result_letters
from .execute import combine_parts
from ..ir import Combine, Contract, Drop, Encode, Fold, Sum

__all__ = ["ClassicalErrors", "ChainStatistics", "certify", "classical_terms", "gamma", "TINY_UNIT"]

#: The longest contraction whose magnitudes the fused CPU pass computes (longer ones: BLAS, through einsum).
_FUSED_TERMS = 64
#: The smallest positive magnitude (in units) the certification accepts: products of two such stay normal.
TINY_UNIT = 2.0**-500
_U = 2.0**-53
_DECODE = _U * (1 + 2.0**-40)


def gamma(m: int) -> float:
    """``γ_m = m u / (1 - m u)`` rounded down (0 for ``m = 0``)."""
    if m <= 0:
        return 0.0
    mu = m * _U
    return mu / (1 - mu) * (1 - 2.0**-50)


def _up(x, ops: int = 4):
    """``x`` (a sum or product of nonnegative numbers; or an array of them, one per tensor) inflated past the rounding
    of ``ops`` float64 operations that made it; an exact 0 stays 0 (every term was 0)."""
    # (x != 0) adds the tiny term to the nonzero entries only: an array's own arithmetic, on either side of the bus
    return x * (1 + ops * 2.0**-52) + (x != 0) * 2.0**-1070


def _nonzero(x) -> bool:
    """Whether a number, or any of an array of them (one per tensor), is nonzero."""
    return bool(x.any()) if _per_tensor(x) else bool(x)


def _per_tensor(x) -> bool:
    """Whether ``x`` is an array of one number per tensor (on the host or the device), not a number."""
    return getattr(x, "ndim", 0) > 0


class _Refused(Exception):
    """The program or its operands fall outside what the certification handles."""


class ClassicalErrors:
    """Certifies, before a program runs, that its result will meet ``γ_m (|A||B|...)`` on these operands.

    An interpreter of the program in its own right: it needs no residues,
    only each :class:`Encode` step's float operand as the builder prepared it
    (``leaf(step)``, the constant for constants) and the exponents the encode
    gives it (``exponents(step)``, broadcastable to the operand). After
    :meth:`run`, :meth:`certified` says whether the result meets the bound
    with the fp64 decode, :attr:`exact` whether it is the exact integer.
    Complex programs are followed part by part (the 4M products' parts
    combined by :class:`Combine`), each part certified against the complex
    magnitudes. A fold (a revisited chain axis) keeps the state, the next
    operator's leaf being the folded one. Steps it has no rule for
    (RNSTensor operands, re-encodings, 3M products) make it refuse
    (:attr:`reason`).

    Per tensor (``batch``, a label no step sums over, of ``size`` tensors):
    the values that carry it hold their scalars ``r``, ``a`` and the
    smallest magnitude as arrays along it, each reduced over that tensor's
    entries alone, and :meth:`verdicts` says per tensor whether it meets the
    bound. A tensor's verdict is then a function of that tensor alone,
    whatever batch it comes in: on the CPU's fused mode products exactly
    (the same sums in the same order for every batch); where a contraction
    goes through BLAS, up to how BLAS rounds the magnitudes' sums, which
    moves a verdict only within ``2**-40`` of the target. A tensor whose
    magnitudes leave the certified range is refused alone.
    """

    def __init__(self, leaf: Callable, exponents: Callable, magnitudes: Optional["ChainStatistics"] = None,
                 batch: Optional[str] = None, size: int = 1, xp=np):
        self.leaf, self.exponents = leaf, exponents
        self.xp = xp  # the operands' array module (the caller's, found once)
        self.batch, self.size = batch, size
        #: per tensor (``batch``): those refused (magnitudes out of the certified range), and why
        self.refused = None  # (an array once one is)
        self.refusal: Optional[str] = None
        #: where the input's and the mode products' magnitudes come from: computed here (None), or a
        #: :class:`ChainStatistics` (their statistics only, the ratios bounded from above)
        self.magnitudes = magnitudes
        self.state: dict = {}
        self.labels: dict = {}  # the axes of each slot's magnitudes
        self.reason: Optional[str] = None
        #: After a failed :meth:`certified`: how many times ``γ_m`` the bound came out (None where refused).
        self.excess: Optional[float] = None
        self.out: Optional[int] = None

    def run(self, program) -> "ClassicalErrors":
        """Follow every step of ``program``; returns ``self``."""
        self.complex = bool(program.complex)
        try:
            # a tensor's bound may overflow (inf, or inf times a zero part: NaN); verdicts() refuses that tensor
            with np.errstate(over="ignore", invalid="ignore"):
                self._steps(program)
            self.out = program.out
        except _Refused as e:
            self.reason = str(e)
            self.state.clear()
        return self

    def _steps(self, program) -> None:
        for st in program.steps:
            self._out_labels = _labels_after(st, self.labels)  # (a slot may be its own step's input)
            self.state[st.out] = self._rule(st)
            self.labels[st.out] = self._out_labels

    # ----- per step -------------------------------------------------------------------------------

    def _rule(self, st) -> tuple:
        if isinstance(st, Encode):
            return self._encode(st)
        if isinstance(st, Drop):
            # the quotient's units: the array stays, its scale shrinks (a scalar, no pass over the data)
            c, sc, g, r, a, lo = self.state[st.x]
            qf = float(math.prod(st.moduli))
            lo = self._floor(lo / qf * (1 - 2.0**-50), "a magnitude falls below the certified range after a drop")
            return self._normalized(c, sc / qf, st.bound) + (_up(g + 3 * _U, 2), r, _up(a / qf + 1.0), lo)
        if isinstance(st, Sum):
            c, sc, g, r, a, lo = self.state[st.x]
            axes = tuple(st.x_labels.index(ch) for ch in st.over)
            n = math.prod(c.shape[ax] for ax in axes)
            c = self.xp.sum(c, axis=axes)
            h = (n + 2) * 2.0**-52
            return c, sc, _up((g + h) / (1 - h)), r, _up(n * a), self._least(c, self._out_labels) * sc * (1 - 2.0**-50)
        if isinstance(st, Contract):
            return self._contract(st)
        if isinstance(st, Fold):
            # the integers stay and so do their magnitudes in units: the exponents' differences went into the
            # next operator's columns exactly (powers of two, checked when folded), so that operator's leaf,
            # the folded one, carries them and the products' magnitudes come out as the unfolded chain's
            return self.state[st.x]
        if isinstance(st, Combine):
            # (re, im) x (re, im), the parts' exact integer products combined: Re = P00 - P11, Im = P01 + P10; each
            # part's magnitude is the sum of its two products' (the relative error stays, the absolute doubles)
            c, sc, g, r, a, lo = self.state[st.x]
            lab = self.labels[st.x]
            part = combine_parts(c, lab.index(st.re_x), lab.index(st.re_y))
            c = self.xp.stack([part(0, 0) + part(1, 1), part(1, 0) + part(0, 1)])
            return c, sc, _up(g + 2 * _U, 2), r, _up(2 * a), self._least(c, self._out_labels) * sc * (1 - 2.0**-50)
        raise _Refused(f"no classical rule for step {type(st).__name__}")

    def _encode(self, st: Encode) -> tuple:
        x = self.leaf(st)  # complex operands: the parts stacked along the first axis, one exponent for both
        e = self.exponents(st)
        if self.magnitudes is not None:
            c, lo, exact = self.magnitudes.encode(st, x, e)
        else:
            c, lo, exact = _leaf_magnitudes(x, e, self.xp, self._axis(st.labels))
        lo = self._floor(lo, "an operand spans too many binades within one exponent slice")
        a = self.xp.where(exact, 0.0, 0.5) if _per_tensor(exact) else 0.0 if exact else 0.5
        return c, 1.0, 0.0, 0.0, a, lo

    def _contract(self, st: Contract) -> tuple:
        cx, scx, gx, rx, ax, lox = self.state[st.x]
        cy, scy, gy, ry, ay, loy = self.state[st.y]
        xp = self.xp
        size = lambda c, labels, of: math.prod(c.shape[labels.index(ch)] for ch in of)  # noqa: E731
        kx, kc, ky = size(cx, st.x_labels, st.x_sum), size(cx, st.x_labels, st.contracted), size(cy, st.y_labels, st.y_sum)
        k = kx * kc * ky
        self._floor(lox * loy, "a product of magnitudes falls below the certified range")
        out_labels = _result_letters(st)
        sc = scx * scy  # the product's scale (its rounding is one more 2**-53 in g)
        h = (k + 3) * 2.0**-52
        g = _up((gx + gy + gx * gy + h) / (1 - h))
        r = _up(rx + ry + rx * ry)
        if xp is np and st.kind in ("mode", "mode_rev") and not (st.x_sum or st.y_sum) and cx.size and cy.size \
                and 0 < kc <= _FUSED_TERMS and self._fusable(st):
            # one fused pass on the CPU: the magnitudes, their minimum and the absolute parts' ratio together
            T, O, tl, ol = (cx, cy, st.x_labels, st.y_labels) if st.kind == "mode" else (cy, cx, st.y_labels, st.x_labels)
            t_sc, t_g, o_sc, o_g = (scx, gx, scy, gy) if st.kind == "mode" else (scy, gy, scx, gx)
            a_t, r_t, a_o, r_o = (ax, rx, ay, ry) if st.kind == "mode" else (ay, ry, ax, rx)
            ax_t = tl.index(st.contracted)
            O2 = O if ol.index(st.contracted) == 1 else O.T
            K = T.shape[ax_t]
            sums = 1 + (K + 2) * 2.0**-52  # the kernel's column and row sums, rounded up
            alpha = _up(a_o * (1 + r_t)) * (1 + t_g) * t_sc * sums if _nonzero(a_o) else 0.0
            beta = _up(a_t * (1 + r_o)) * (1 + o_g) * o_sc * sums if _nonzero(a_t) else 0.0
            lead, tail = math.prod(T.shape[:ax_t]), math.prod(T.shape[ax_t + 1:])
            shape = T.shape[:ax_t] + (O2.shape[0],) + T.shape[ax_t + 1:]
            bt = self._axis(tl)
            if self.magnitudes is not None:
                c, lo_c, ratio = self.magnitudes.mode(shape, K, alpha, beta, k * ax * ay)
            elif bt is None:
                c, lo_c, ratio = mode_magnitudes(T.reshape(lead, K, tail), O2, alpha, beta, k * ax * ay)
                c = c.reshape(shape)
            else:  # per tensor: each lead row's weights its tensor's, its statistics reduced per tensor
                rows = lambda v: np.broadcast_to(  # noqa: E731
                    self._spread(v, T.ndim, bt), T.shape[:ax_t] + (1,) * (T.ndim - ax_t)).reshape(lead)
                c, lo_c, ratio = mode_magnitudes(T.reshape(lead, K, tail), O2, rows(alpha), rows(beta),
                                                 rows(k * ax * ay), per_row=True)
                c = c.reshape(shape)
                lo_c = self._reduce(lo_c.reshape(T.shape[:ax_t]), bt, "min")
                ratio = self._reduce(ratio.reshape(T.shape[:ax_t]), bt, "max")
            lo = lo_c * sc * (1 - 2.0**-50)
            if _nonzero(ax) or _nonzero(ay):
                r = _up(r + _up(ratio / sc, 12 + k.bit_length()) / (1 - g))
            return self._normalized(c, sc, st.bound) + (g, r, 0.0, lo)
        c = xp.einsum(_letters(st.x_labels, st.y_labels, out_labels), cx, cy, optimize=True)
        bt = self._axis(out_labels)
        if bt is not None:
            lo = self._least(c, out_labels) * sc * (1 - 2.0**-50)
        else:
            lo_c = float(c.min()) if c.size else math.inf
            lo = (lo_c if lo_c > 0 else _min_positive(c, xp)) * sc * (1 - 2.0**-50)
        if _nonzero(ax) or _nonzero(ay):
            # the absolute parts, per entry: a_y (1 + r_x) Σ|x| + a_x (1 + r_y) Σ|y| + k a_x a_y, over c (in units)
            spread = lambda v: self._spread(v, c.ndim, bt, xp)  # noqa: E731 - one weight per tensor, where per tensor
            A = spread(k * ax * ay)
            if _nonzero(ay):
                sx = _summed(cx, st.x_labels, st.x_sum + st.contracted, out_labels, xp) * (ky * (1 + gx) * scx)
                A = A + spread(_up(ay * (1 + rx))) * sx
            if _nonzero(ax):
                sy = _summed(cy, st.y_labels, st.y_sum + st.contracted, out_labels, xp) * (kx * (1 + gy) * scy)
                A = A + spread(_up(ax * (1 + ry))) * sy
            if bt is not None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratio = self._reduce(xp.where(c > 0, A / xp.where(c > 0, c, 1.0), 0.0), bt, "max") / sc
            elif not c.size:
                ratio = 0.0
            elif lo_c > 0 and math.isfinite(lo_c):  # no zero magnitudes: one broadcast division
                ratio = float((A / c).max()) / sc
            else:
                ratio = float(xp.where(c > 0, A / xp.where(c > 0, c, 1.0), 0.0).max()) / sc
            r = _up(r + _up(ratio, 10 + k.bit_length()) / (1 - g))
        return self._normalized(c, sc, st.bound) + (g, r, 0.0, lo)

    def _normalized(self, c, sc: float, bound: int) -> tuple:
        """:func:`_normalized`; the statistics (:class:`ChainStatistics`) hold magnitudes in unscaled units only."""
        if self.magnitudes is not None and _rescales(sc, bound):
            raise _Refused("the magnitudes change units (a chain far deeper than planned): the arrays' certificate")
        return _normalized(c, sc, bound)

    # ----- per tensor ----------------------------------------------------------------------------

    def _axis(self, labels: str) -> Optional[int]:
        """The batch axis among ``labels`` (None: not per tensor, or a value without it)."""
        return labels.index(self.batch) if self.batch is not None and self.batch in labels else None

    def _fusable(self, st: Contract) -> bool:
        """Whether a mode product's fused pass gives per-tensor statistics: the batch axis, where present, is on
        the tensor and ahead of the contracted axis (its lead rows), never on the operator."""
        if self.batch is None:
            return True
        tl, ol = (st.x_labels, st.y_labels) if st.kind == "mode" else (st.y_labels, st.x_labels)
        return self.batch not in ol and (self.batch not in tl or tl.index(self.batch) < tl.index(st.contracted))

    def _floor(self, lo, why: str):
        """``lo`` checked against :data:`TINY_UNIT`: a number below it refuses the whole program, a tensor's
        (an array's entry) refuses that tensor alone (its entry replaced by 1 so that the others go on)."""
        if _per_tensor(lo):
            low = ~(lo >= TINY_UNIT)
            if bool(low.any()):
                self.refused = low if self.refused is None else self.refused | low
                self.refusal = why
                return self.xp.where(low, 1.0, lo)
            return lo
        if lo < TINY_UNIT:
            raise _Refused(why)
        return lo

    def _reduce(self, v, axis: int, how: str) -> np.ndarray:
        """``v``'s smallest positive (``'min'``) or largest (``'max'``) entry per index of ``axis`` (where ``v`` lives)."""
        xp = self.xp
        v = xp.moveaxis(v, axis, 0).reshape(v.shape[axis], -1)
        if v.shape[1] == 0:
            return xp.full(v.shape[0], math.inf if how == "min" else 0.0)
        out = xp.where(v > 0, v, np.inf).min(axis=1) if how == "min" else v.max(axis=1)
        return out.astype(np.float64, copy=False)

    def _least(self, c, labels: str):
        """The smallest positive entry of ``c`` (axes ``labels``): per tensor where it carries the batch axis."""
        bt = self._axis(labels)
        return _min_positive(c, self.xp) if bt is None else self._reduce(c, bt, "min")

    @staticmethod
    def _spread(v, ndim: int, axis: Optional[int], xp=np):
        """A per-tensor array ``v`` shaped to broadcast along ``axis`` of an ``ndim``-axis array (a number as is)."""
        if not _per_tensor(v) or axis is None:
            return v
        shape = [1] * ndim
        shape[axis] = v.size
        return to_module(v.reshape(shape), xp) if xp is not np else v.reshape(shape)

    # ----- the verdict ------------------------------------------------------------------------------

    @property
    def exact(self) -> bool:
        """Whether the result is the exact integer (no rounding anywhere before the decode): decoded ``'exact'``
        where the bound is one rounding (``m <= 1``), which the fp64 decode's ``u (1 + 2**-40)`` exceeds. Per
        tensor: whether every tensor's is."""
        return bool(self.exacts().all())

    def exacts(self):
        """:attr:`exact` per tensor (``size`` of them, where the data lives; one alike for all without a batch)."""
        xp = self._module()
        if self.out is None:  # refused (a failed verdict's reason leaves the numbers as they are)
            return xp.zeros(self.size, bool)
        r, a = self.state[self.out][3:5]
        done = xp.broadcast_to(xp.asarray((r == 0.0) & (a == 0.0)), (self.size,))
        return done if self.refused is None else done & ~self.refused

    def certified(self, m: int, target: Optional[float] = None) -> bool:
        """Whether the result meets ``γ_m (|A||B|...)`` on every entry (with the fp64 decode, or exactly decoded
        where :attr:`exact`); ``m`` from :func:`classical_terms`. ``target``: ``rtol (|A||B|...)`` instead.
        Per tensor: whether every tensor's does (:meth:`verdicts`), :attr:`excess` the largest."""
        ok, excess = self.verdicts(m, target)
        if bool(ok.all()):
            return True
        self.excess = None if bool(self._module().isnan(excess).any()) else float(excess.max())
        if self.reason is None:
            self.reason = (self.refusal or "the residue error bound overflows") if self.excess is None else (
                f"the residue error bound is {self.excess} x " +
                (f"gamma_{m}" if target is None else f"rtol={target:g}") + " of the magnitudes")
        return False

    def verdicts(self, m: int, target: Optional[float] = None) -> tuple:
        """``(certified, excess)`` per tensor (arrays of ``size`` where the data lives; one alike for all without a
        batch): whether its result meets the bound of :meth:`certified`, and how many times the bound its residue
        error bound came out (NaN where refused, 0 where certified)."""
        xp = self._module()
        if self.out is None:  # refused
            return xp.zeros(self.size, bool), xp.full(self.size, np.nan)
        c, sc, g, r, a, lo = self.state[self.out]
        if self.complex:
            # each part within γ_m |x||y| (complex moduli) makes |err| <= sqrt(2) γ_m |x||y|, and |x||y| is at
            # least either part's magnitude sum (|xr||yr| + |xi||yi|, |xr||yi| + |xi||yr|)
            lo = self._least(self.xp.maximum(c[0], c[1]), self.labels[self.out][1:]) * sc * (1 - 2.0**-50)
        rho = (1 + g) / (1 - g)
        goal = gamma(m) if target is None else target
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            total = xp.asarray(_up((r + _DECODE * (1 + r)) * rho + a * (1 + _DECODE) / (lo * (1 - g)), 16))
            ok = xp.broadcast_to(total <= goal, (self.size,))
            if m <= 1:
                ok = ok | self.exacts()
            # a bound that overflowed (an inf or NaN total) says nothing of the width that would meet the target:
            # refused, as a floor refuses (a finite excess picks the next rung)
            over = total / goal if goal > 0 else xp.full_like(total, np.nan)
            excess = xp.where(ok, 0.0, xp.where(over < np.inf, over, np.nan))
        excess = xp.broadcast_to(excess, (self.size,))
        if self.refused is None:
            return ok, excess
        return ok & ~self.refused, xp.where(self.refused, np.nan, excess)

    def _module(self):
        """The array module of the per-tensor numbers (the data's; NumPy without a batch, or where they are numbers)."""
        if self.batch is None or self.out is None or self.out not in self.state:
            return np
        return self.xp if any(_per_tensor(v) for v in self.state[self.out][3:6]) else np


class ChainStatistics:
    """The statistics a chain's certification reads, from one blocked pass over its tensors
    (:func:`~rnstensor.backends.cpu.chain_magnitude_stats`), in place of its magnitude arrays.

    For :class:`ClassicalErrors` (``magnitudes=``): the input's smallest
    magnitude and exactness, and each mode product's smallest positive
    magnitude, are the values the arrays give; each product's ratio
    ``max (alpha colsum + beta rowsum + kappa) / c`` is bounded from above by
    ``alpha max(colsum / c) + beta max(rowsum / c) + kappa / min c``, inflated
    past every rounding of either side. A certificate from these statistics
    therefore certifies a program the arrays would certify too (every rule is
    monotone in the ratios); where it fails, the caller runs the arrays' one,
    so that the verdict, and with it every result, is theirs.
    A plain chain only: :meth:`of` says whether it applies.
    """

    def __init__(self, stats: np.ndarray, source: int):
        self.stats, self.source = stats, source
        self.step = 0

    @classmethod
    def of(cls, program, leaf: Callable, exponents: Callable, xp=np) -> Optional["ChainStatistics"]:
        """The statistics of a real chain program on the CPU, or None for any other: one tensor with one exponent
        per leading slice, mode products of it by matrices (constants or other operands) of at most
        :data:`_FUSED_TERMS` columns, drops. ``xp``: the operands' array module."""
        inputs = [st for st in program.steps if isinstance(st, Encode) and not st.constant]
        if not inputs or program.complex or xp is not np:
            return None
        main = max(inputs, key=lambda st: len(st.labels))
        mats, steps, shape, xin = {}, [], None, None
        for st in program.steps:
            if isinstance(st, Encode):
                x = leaf(st)
                if st.complex or not x.ndim or not x.size:
                    return None
                if st is not main:
                    if x.ndim != 2:
                        return None
                    mats[st.out] = _leaf_magnitudes(x, exponents(st), np)[0]
                    continue
                if tuple(st.shared) != tuple(range(1, x.ndim)):
                    return None
                xin, shape, e = x, list(x.shape[1:]), exponents(st)
            elif isinstance(st, Contract):
                if st.kind not in ("mode", "mode_rev") or st.x_sum or st.y_sum or not st.in_place():
                    return None
                t, tl, o, _ = st.operands()
                if o not in mats or t in mats or not 0 < mats[o].shape[1] <= _FUSED_TERMS:
                    return None
                O = mats[o]
                axis = tl.index(st.contracted) - 1
                steps.append((axis, O))
                shape[axis] = O.shape[0]
            elif not isinstance(st, Drop):
                return None
        if xin is None or not steps:
            return None
        e = np.asarray(e).reshape(-1)
        if e.shape != (xin.shape[0],) or not chain_stats_warm(xin.size * len(steps)):
            return None  # (a small call while the statistics' kernel is cold: the full certificate, same verdict)
        return cls(chain_magnitude_stats(xin, e, tuple(xin.shape[1:]), steps), main.source)

    def encode(self, st, x, e) -> tuple:
        """``(c, lo, exact)`` of an encode: the tensor's from the statistics (``c``: a stand-in of its shape), a
        matrix's computed."""
        if st.constant or st.source != self.source:
            return _leaf_magnitudes(x, e, np)
        return np.broadcast_to(np.float64(0.0), x.shape), float(self.stats[0, 0]), bool(self.stats[0, 1] == 1.0)

    def mode(self, shape: tuple, K: int, alpha: float, beta: float, kappa: float) -> tuple:
        """``(c, lo, ratio)`` of the next mode product: its smallest positive magnitude, and an upper bound of the
        ratio :func:`~rnstensor.backends.cpu.mode_magnitudes` would give with these weights."""
        self.step += 1
        lo, m1, m2 = (float(v) for v in self.stats[self.step])
        c = np.broadcast_to(np.float64(0.0), shape)
        if not lo < math.inf:  # no positive magnitude: no ratio
            return c, lo, 0.0
        # the arrays' quotient rounds five times and their column sums differ from these by 2K units at most; the
        # column maximum here is low by two roundings (a product by a rounded reciprocal), the row one by one, the
        # sum below by three more
        bound = alpha * m1 + beta * m2 + kappa / lo
        return c, lo, bound * (1 + (2 * K + 20) * 2.0**-52)


def certify(program, leaf: Callable, exponents: Callable, m: int, target: Optional[float] = None,
            batch: Optional[str] = None, size: int = 1, xp=np) -> ClassicalErrors:
    """The certification of ``program`` against ``γ_m`` (or ``target``): from its statistics where it is a plain chain
    on the CPU and that certificate holds (:class:`ChainStatistics`), else the full one, so that the verdict is always
    the full certificate's. ``exponents`` is read once per step. ``batch`` (a label of ``size`` tensors): verdicts per
    tensor (:meth:`ClassicalErrors.verdicts`); the statistics' certificate, where it holds, holds for each of them
    (every rule is monotone, and a tensor's entries are among the batch's). ``xp``: the operands' array module."""
    seen: dict = {}

    def once(st):
        if st not in seen:
            seen[st] = exponents(st)
        return seen[st]

    stats = ChainStatistics.of(program, leaf, once, xp) if batch is None or m > 1 else None
    if stats is not None:
        quick = ClassicalErrors(leaf, once, magnitudes=stats, size=size).run(program)
        if quick.certified(m, target):
            return quick
    return ClassicalErrors(leaf, once, batch=batch, size=size, xp=xp).run(program)


def _leaf_magnitudes(x, e, xp, batch: Optional[int] = None) -> tuple:
    """``(|x| 2**-e, its smallest entry over the nonzero x, whether all are integers)`` of an encoded operand; the two
    statistics per index of axis ``batch`` (arrays) where one is given."""
    if xp is np and x.ndim and x.size and e.shape == (x.shape[0],) + (1,) * (x.ndim - 1) \
            and batch in (None, 0):
        # one exponent per leading slice (a chain's tensors, an operator's rows): one pass on the CPU
        c, lo, exact = encode_magnitudes(x.reshape(x.shape[0], -1), e.reshape(-1), per_row=batch is not None)
        return c.reshape(x.shape), lo, exact
    return _magnitudes(x, e, xp, batch)


def _magnitudes(x, e, xp, batch: Optional[int] = None) -> tuple:
    """``(|x| 2**-e, its smallest entry over the nonzero x (0 where one underflows), whether all are integers)``
    on ``x``'s array module ``xp`` (:func:`~rnstensor.backends.cpu.encode_magnitudes` is the CPU's one-pass form); the
    two statistics per index of axis ``batch`` where one is given."""
    with np.errstate(under="ignore", over="ignore"):
        if e.size and -1000 < int(e.min()) and int(e.max()) < 1000:
            c = xp.abs(x) * xp.ldexp(1.0, -e)  # a power of two per slice: exact while normal
        else:  # exact while the result is normal (checked by the caller's smallest magnitude)
            c = xp.ldexp(xp.abs(x), -xp.clip(e, -(1 << 20), 1 << 20).astype(np.int32))
    c = xp.broadcast_to(c, x.shape)
    if batch is not None:  # per tensor, where the data lives
        rows = lambda v: xp.moveaxis(v, batch, 0).reshape(x.shape[batch], -1)  # noqa: E731
        if not x.size:
            return c, xp.full(x.shape[batch], np.inf), xp.ones(x.shape[batch], bool)
        return c, xp.where(rows(x) != 0, rows(c), np.inf).min(axis=1), xp.all(rows(c) == xp.rint(rows(c)), axis=1)
    lo = float(c.min()) if c.size else math.inf
    if lo == 0:
        lo = float(xp.min(xp.where(x != 0, c, np.inf)))
    head = c.reshape(-1)[:64]
    exact = bool(xp.all(head == xp.rint(head))) and bool(xp.all(c == xp.rint(c)))
    return c, lo, exact


def _labels_after(st, labels: dict) -> str:
    """The axes of a step's result, in the order the rules above hold its magnitudes."""
    if isinstance(st, Encode):
        return st.labels
    if isinstance(st, Contract):
        return st.labels  # the executor's names for its result's axes (_result_letters' order)
    if isinstance(st, Sum):
        return "".join(ch for ch in labels[st.x] if ch not in st.over)
    if isinstance(st, Combine):
        return st.labels
    return labels[st.x]


def classical_terms(program, sizes: dict) -> int:
    """``m`` of the classical bound along a program's path: the terms of every contraction (``k`` summed products,
    1 for an elementwise product) and of every sum, added up."""
    m = 0
    for st in program.steps:
        if isinstance(st, Contract):
            m += math.prod(sizes.get(ch, 1) for ch in st.x_sum + st.contracted + st.y_sum)
        elif isinstance(st, Sum):
            m += math.prod(sizes.get(ch, 1) for ch in st.over)
    return m


def _rescales(sc: float, bound: int) -> bool:
    """Whether :func:`_normalized` folds the scale ``sc`` into the array (values up to ``bound / sc``)."""
    return sc < 2.0**-600 or float(bound) / sc > 2.0**600


def _normalized(c, sc: float, bound: int) -> tuple:
    """``(c, sc)`` with the scale folded into the array where the array (at most ``bound / sc``) could leave the
    float range later; the fold rounds each entry by ``2**-53`` at most, which every caller's ``g`` allows."""
    if _rescales(sc, bound):
        return c * sc, 1.0  # pragma: no cover - chains far deeper than any planned here
    return c, sc


def _min_positive(c, xp) -> float:
    """The smallest positive entry of ``c`` (``inf`` if none; ``xp``: its array module)."""
    if c.size == 0:
        return math.inf
    least = float(c.min())
    return least if least > 0 else float(xp.min(xp.where(c > 0, c, np.inf)))


def _summed(c, labels: str, over: str, out_labels: str, xp):
    """``c`` summed over the labels ``over`` (rounded up), its other axes placed as in ``out_labels`` (size 1 where
    absent), so that it broadcasts against the result (``xp``: its array module)."""
    axes = tuple(labels.index(ch) for ch in over)
    s = xp.sum(c, axis=axes) if axes else c
    n = math.prod(c.shape[ax] for ax in axes) if axes else 1
    s = s * (1 + (n + 2) * 2.0**-52)
    kept = [ch for ch in labels if ch not in over]
    s = s.transpose([kept.index(ch) for ch in out_labels if ch in kept])
    sizes = iter(s.shape)
    return s.reshape([next(sizes) if ch in kept else 1 for ch in out_labels])
