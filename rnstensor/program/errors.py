"""The error analysis of residue programs: one set of rules per step, interpreted in two domains.

Every quantity bounds an exact one from above. :class:`EntrywiseErrors`
follows a program per entry, beside its execution (einsum): a magnitude bound
``M`` and an error bound ``D`` (``|x̂| <= M``, ``|x̂ - x| <= D``); encoding errs
by half a unit of the entry's exponent group, a drop by under one unit of the
quotient, a product by ``|x̂ŷ - xy| <= D_x M_y + M_x D_y`` summed over the
contracted indices, a re-encoding by the fp64 decode's bound plus half a unit;
the final decode adds its own term (:func:`decoded`). :class:`NormErrors`
follows it per tensor (chain plans, FEM operators), a priori: a max-norm
``|x|``, an error ``|x̂ - x|`` and the value of one integer step, through
products with operators (``||A|| |x|``, ``||Â|| err + ||Â - A|| |x|``),
Hadamard products with fields, sums, drops (``floor(q/2)`` units each) and
the decode (``decode_factor * bound * unit``). Its numbers are exact linear
forms in the input's norms (:class:`Linear`, the chain planner's scores and
bounds, rounded up once) or float64 arrays inflated after every operation
(per element, the FEM operators). The bounds' own float64 arithmetic is
rounded upward so that each stays an upper bound of its exact value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Optional, Sequence

import numpy as np

from ..arrays import array_module
from .. import ir
from .execute import Value, combine_parts
from ..ir import Combine, Contract, Drop, Encode, Operand, Reencode, Sum

__all__ = ["EntrywiseErrors", "NormErrors", "Linear", "OperatorBounds", "FieldErrors", "inflate", "decoded", "decode_factor", "fraction_up",
           "OperatorNorms", "operator_norms", "Coefficients", "persistent_coefficients", "composed_bound",
           "UNIT_ROUNDOFF", "SUBNORMAL"]

UNIT_ROUNDOFF = Fraction(1, 2**53)
SUBNORMAL = Fraction(1, 2**1074)


def fraction_up(x) -> float:
    """The smallest float64 not below the Fraction or integer ``x`` (``inf`` above the largest float)."""
    try:
        f = float(x)
    except OverflowError:  # beyond the float range: inf above it, the most negative float below
        return math.inf if x > 0 else -float(np.finfo(np.float64).max)
    return f if Fraction(f) >= x else math.nextafter(f, math.inf)


def decode_factor(mode: str) -> Fraction:
    """Decode error per unit of ``|v| s``: ``u`` for ``'exact'``, ``u (1 + 2**-40)`` for ``'fp64'``.

    ``'exact'`` rounds ``v s`` once. ``'fp64'`` carries ``v`` and the factor
    as double-doubles (relative error below ``(3k + 6) u**2`` for ``k``
    digits, amplified at most fourfold by Horner's growing prefixes) and
    rounds once: within ``u (1 + 2**-40) |v s|`` for ``k`` below ``2**33``
    moduli. A subnormal result's last rounding adds at most ``2**-1075``,
    which every caller adds as its ``2**-1074`` term.
    """
    if mode == "exact":
        return UNIT_ROUNDOFF
    return UNIT_ROUNDOFF * (1 + Fraction(1, 2**40))


def _pow2(k: int) -> Fraction:
    return Fraction(2) ** int(k)


@dataclass(frozen=True)
class OperatorNorms:
    """Exact norms of one step: executed ``||Â||``, true ``||A||``, ``||Â - A||``, and the unit shift.

    ``unit_shift`` is ``max_j(-f_j)``: after the product one integer step is
    worth at most ``2**unit_shift`` times what it was worth before.
    """

    executed: Fraction
    true: Fraction
    diff: Fraction
    unit_shift: int


def operator_norms(op, A: np.ndarray) -> OperatorNorms:
    """Norms of the executed operator ``Â[j, k] = ints[j, k] * 2**(-f_j - r_k)`` against the true ``A``."""
    ints, f, r = op.ints, op.row_exponents, op.column_exponents
    col = [_pow2(-int(rk)) for rk in r]
    executed = true = diff = Fraction(0)
    for j in range(ints.shape[0]):
        rs = _pow2(-int(f[j]))
        e_row = a_row = d_row = Fraction(0)
        for k in range(ints.shape[1]):
            ahat = int(ints[j, k]) * rs * col[k]
            a = Fraction(float(A[j, k]))
            e_row += abs(ahat)
            a_row += abs(a)
            d_row += abs(ahat - a)
        executed, true, diff = max(executed, e_row), max(true, a_row), max(diff, d_row)
    shift = int(max(-f)) if f.size else 0
    return OperatorNorms(executed, true, diff, shift)



@dataclass(frozen=True)
class Coefficients:
    """``bound = enc * ||X̂ - X|| + x * ||X|| + unit * 2**-e + 2**-1074`` for an input with exponent ``e``."""

    enc: Fraction
    x: Fraction
    unit: Fraction

    def evaluate(self, enc_error: Fraction, x_norm: Fraction, unit: Fraction) -> Fraction:
        return self.enc * enc_error + self.x * x_norm + self.unit * unit + SUBNORMAL


def composed_bound(
    norms: Sequence[OperatorNorms],
    rhos: Sequence[int],
    bits: int,
    moduli: Sequence[int],
    x_norm: Fraction,
    mode: str,
) -> Fraction:
    """Error bound of the composed method (encode per fiber, decode after every product).

    Product ``i`` holds integers below ``2**bits * rhos[i]`` on the whole basis ``moduli``.
    """
    err = Fraction(0)
    size = x_norm  # bound on the exact intermediate
    tiny = _pow2(-bits)
    last = len(norms) - 1
    for i, nm in enumerate(norms):
        computed = size + err  # bound on the computed intermediate
        encoded = computed * (1 + tiny)
        factor = decode_factor(mode if i == last else "fp64")
        dec = factor * nm.executed * encoded + SUBNORMAL
        err = nm.executed * (err + computed * tiny) + nm.diff * size + dec
        size *= nm.true
    return err




# ----- per-tensor norms, a priori -----------------------------------------------------------------


class Linear:
    """An exact linear form ``a * enc + b * x + c * unit`` in a tensor's encoding error, norm and unit.

    The numbers of :class:`NormErrors` for a bound known before the data
    (a plan's): evaluated on a tensor's measured norms it is that tensor's
    bound, exactly.
    """

    __slots__ = ("a", "b", "c")

    def __init__(self, a=0, b=0, c=0):
        self.a, self.b, self.c = Fraction(a), Fraction(b), Fraction(c)

    def __add__(self, o: "Linear") -> "Linear":
        return Linear(self.a + o.a, self.b + o.b, self.c + o.c)

    def __mul__(self, k) -> "Linear":
        k = Fraction(k)
        return Linear(self.a * k, self.b * k, self.c * k)

    __rmul__ = __mul__


@dataclass(frozen=True)
class OperatorBounds:
    """An operator's norms ``||Â||``, ``||A||``, ``||Â - A||`` as floats rounded up, and the factor one integer
    step of its product's result is worth (the per-element numbers of the FEM operators)."""

    executed: float
    true: float
    diff: float
    unit: float


@dataclass(frozen=True)
class FieldErrors:
    """A Hadamard factor's bounds per tensor: ``max |F|``, ``max |F̂|``, ``max |F̂ - F|`` and its unit."""

    mag: object
    executed: object
    diff: object
    unit: object


class NormErrors:
    """Propagates ``(|x|, |x̂ - x|, unit)`` per tensor through a program's steps (products with operators,
    Hadamard products with fields, sums, drops), a priori.

    ``operands[source]`` is, for every constant of the program, an
    :class:`OperatorNorms` (exact; its ``unit_shift``: one integer step of the
    result is worth ``2**unit_shift`` of the input's), an
    :class:`OperatorBounds` (floats) or a :class:`FieldErrors`. ``up`` rounds a
    sum or product upward (identity for exact numbers).
    """

    def __init__(self, operands: dict, up: Callable = lambda x: x):
        self.operands, self.up = operands, up

    def run(self, program: "ir.Program", start) -> tuple:
        """``(|x|, err, unit)`` of the result for the input's ``start = (|x|, err, unit)``."""
        up = self.up
        state: dict = {}
        consts: dict = {}
        for st in program.steps:
            if isinstance(st, Encode):
                if st.constant:
                    consts[st.out] = self.operands[st.source]
                else:
                    state[st.out] = start
            elif isinstance(st, ir.Fold):
                state[st.out] = state[st.x]
            elif isinstance(st, Drop):
                mag, err, u = state[st.x]
                for q in st.moduli:
                    err = up(err + u * (q // 2))
                    u = u * q
                state[st.out] = (mag, err, u)
            elif isinstance(st, Contract):
                mag, err, u = state[st.x]
                c = consts[st.y]
                if isinstance(c, FieldErrors):
                    state[st.out] = (mag * c.mag, up(c.executed * err + c.diff * mag), u * c.unit)
                else:
                    step = _pow2(c.unit_shift) if isinstance(c, OperatorNorms) else c.unit
                    state[st.out] = (up(mag * c.true), up(c.executed * err + c.diff * mag), u * step)
            elif isinstance(st, ir.Add):
                a, b = state[st.x], state[st.y]
                state[st.out] = (up(a[0] + b[0]), up(a[1] + b[1]), a[2])
            else:
                raise TypeError(f"no a-priori error rule for step {type(st).__name__}")
        return state[program.out]


def _skeleton(n: int, dropped: Sequence[Sequence[int]]) -> "ir.Program":
    """The steps of a persistent chain of ``n`` products with the given drops (what :class:`NormErrors` reads)."""
    steps = [ir.Encode(0, 0, 0, (), "", 0)]
    for k in range(n):
        steps += [ir.Encode(1, k, 0, (), "", 0, constant=True),
                  ir.Contract(0, 0, 1, "", "", "", "", "", "", "", "", "mode", "", 0)]
        if k < len(dropped) and dropped[k]:
            steps.append(ir.Drop(0, 0, tuple(dropped[k]), True, 0))
    return ir.Program(None, tuple(steps), 0, "")


def persistent_coefficients(
    norms: Sequence[OperatorNorms],
    dropped: Sequence[Sequence[int]],
    final_bound: int,
    final_moduli: Sequence[int],
    mode: str,
    program: Optional["ir.Program"] = None,
) -> Coefficients:
    """The error-bound coefficients of a persistent plan (rescale_be, rescale, norescale).

    :class:`NormErrors` over the plan's ``program`` (or the chain of
    ``norms`` with the drops ``dropped``) on exact linear forms, plus the
    decode: ``bound = enc * ||X̂ - X|| + x * ||X|| + unit * 2**-e + 2**-1074``.
    """
    program = program if program is not None else _skeleton(len(norms), dropped)
    mag, err, u = NormErrors(dict(enumerate(norms))).run(program, (Linear(0, 1, 0), Linear(1, 0, 0), Linear(0, 0, 1)))
    err = err + u * (decode_factor(mode) * final_bound)
    return Coefficients(err.a, err.b, err.c)


# ----- per entry, beside execution ----------------------------------------------------------------


def inflate(x, n: int):
    """Inflate a float64 sum of ``n`` nonnegative terms so it stays an upper bound of the exact sum."""
    return x * (1.0 + (n + 2) * 2.0**-52)


def _letters(xl: str, yl: str, zl: str) -> str:
    """An einsum string over ASCII letters for labels that may hold any character."""
    chars = list(dict.fromkeys(xl + yl + zl))
    free = iter(c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in chars)
    m = {c: (c if c.isalpha() and c.isascii() else next(free)) for c in chars}
    tr = lambda s: "".join(m[c] for c in s)  # noqa: E731
    return f"{tr(xl)},{tr(yl)}->{tr(zl)}"


def _result_letters(st: Contract) -> str:
    """The result's axes of a contraction in terms of its operands' labels (the executor's axis order)."""
    if st.kind == "mode":
        return "".join(c for c in st.x_labels if c not in st.x_sum).replace(st.contracted, st.y_keep)
    if st.kind == "mode_rev":
        return "".join(c for c in st.y_labels if c not in st.y_sum).replace(st.contracted, st.x_keep)
    return st.batch + st.x_keep + st.y_keep


def float_down(n) -> float:
    """The largest float64 not above the positive integer (or Fraction) ``n``."""
    f = float(Fraction(n))
    return f if Fraction(f) <= Fraction(n) else math.nextafter(f, 0.0)


def _exponents(v: Value):
    """Every entry's exponent, clipped far outside the float range (ldexp saturates there either way)."""
    e = v.exp.total()
    xp = array_module(e)
    return xp.clip(e, -(1 << 20), 1 << 20).astype(np.int32)


def in_units_of(a, x: Value, v: Value):
    """The nonnegative array ``a`` (in units of ``x``) in units of ``v``, rounded up: ``a fx 2**ex / (fv 2**ev)``.

    A result below the subnormal range rounds down by at most ``2**-1075``;
    callers add at least that much.
    """
    xp = array_module(a)
    scale = fraction_up(Fraction(int(x.factor), int(v.factor)))
    with np.errstate(over="ignore", under="ignore"):
        return inflate(xp.ldexp(a * scale, _exponents(x) - _exponents(v)), 2)


class EntrywiseErrors:
    """Propagates ``(M, D)`` per entry through a program, in units of each value's own integer step, beside its execution.

    ``M`` bounds the magnitude of the exact and the computed integer (in
    units), ``D`` their difference. Held in units, the numbers are those of
    the integers (below the basis' range), so no product of the analysis
    overflows or underflows, whatever the operands' exponents: a contraction's
    units multiply exactly (its exponents are constant along the contracted
    and summed indices). Every float64 operation is rounded upward
    (:func:`inflate`); :func:`decoded` turns the final units into float64.
    ``leaf(step)`` gives an :class:`Encode` step's float operand as it was
    encoded (the constant itself for constants). RNSTensor operands count as
    exact.
    """

    def __init__(self, basis, leaf: Callable):
        self.basis, self.leaf = basis, leaf
        self.err: dict = {}

    def __call__(self, st, before: dict, v: Value, vals: dict) -> None:
        err = self.err
        for k in [k for k in err if k not in vals]:  # slots the executor has freed
            del err[k]
        xp = array_module(v.planes) if isinstance(v, Value) else array_module(v)
        if isinstance(st, Encode):
            x = xp.abs(self.leaf(st))
            f = float_down(int(v.factor))
            with np.errstate(under="ignore"):
                mag = xp.ldexp(x, -_exponents(v)) / f  # at most 2**bits: no overflow
            err[st.out] = (inflate(mag + 0.5, 2), xp.broadcast_to(0.5, x.shape))
        elif isinstance(st, Operand):
            err[st.out] = (xp.broadcast_to(fraction_up(v.bound), v.planes.shape[1:]), 0.0)
        elif isinstance(st, Drop):
            M, D = err[st.x]
            q = float_down(int(v.factor) // int(before[st.x].factor))
            err[st.out] = (inflate(M / q + 1.0, 2), inflate(D / q + 1.0, 2))
        elif isinstance(st, Reencode):
            x = before[st.x]
            M, D = err[st.x]
            f = fraction_up(decode_factor("fp64")) * fraction_up(x.bound) * (1 + 2.0**-40)
            # the fp64 decode's subnormal rounding (2**-1075 absolute), in the new units
            f_v = float_down(int(v.factor))
            with np.errstate(over="ignore"):
                tiny = xp.ldexp(2.0**-1074 / f_v, -_exponents(v))
            out = []
            for z in (M, D):
                out.append(inflate(in_units_of(inflate(z + f, 2), x, v) + tiny + 0.5, 2))
            err[st.out] = tuple(out)
        elif isinstance(st, Sum):
            x = before[st.x]
            M, D = err[st.x]
            axes = tuple(st.x_labels.index(c) for c in st.over)
            n = math.prod(x.planes.shape[ax + 1] for ax in axes)
            shape = x.planes.shape[1:]
            err[st.out] = tuple(inflate(xp.sum(xp.broadcast_to(z, shape), axis=axes), n) for z in (M, D))
        elif isinstance(st, Contract):
            X, Y = before[st.x], before[st.y]
            (Mx, Dx), (My, Dy) = err[st.x], err[st.y]
            Mx, Dx = (xp.broadcast_to(z, X.planes.shape[1:]) for z in (Mx, Dx))
            My, Dy = (xp.broadcast_to(z, Y.planes.shape[1:]) for z in (My, Dy))
            eq = _letters(st.x_labels, st.y_labels, _result_letters(st))
            k = math.prod(X.planes.shape[1 + st.x_labels.index(c)] for c in st.x_sum + st.contracted) * max(
                1, math.prod(Y.planes.shape[1 + st.y_labels.index(c)] for c in st.y_sum))
            ein = lambda p, q: inflate(xp.einsum(eq, p, q), k)  # noqa: E731
            err[st.out] = (ein(Mx, My), inflate(ein(Dx, My) + ein(Mx, Dy), 2))
        elif isinstance(st, Combine):
            x = before[st.x]
            i, j = x.labels.index(st.re_x), x.labels.index(st.re_y)
            shape = x.planes.shape[1:]
            out = []
            for z in err[st.x]:
                part = combine_parts(xp.broadcast_to(z, shape), i, j)
                out.append(xp.stack([inflate(part(0, 0) + part(1, 1), 2), inflate(part(1, 0) + part(0, 1), 2)]))
            err[st.out] = tuple(out)
        else:  # pragma: no cover - the analysis has a rule for every step a builder emits here
            raise TypeError(f"no error rule for step {type(st).__name__}")


def decoded(M, D, T, mode: str):
    """The absolute bound after the final decode of ``T``, from ``(M, D)`` in its units.

    ``'fp64'`` adds its faithful rounding (``u (1 + 2**-40)`` of the range
    bound), ``'exact'`` half an ulp of the result; both ``2**-1074`` for a
    subnormal result. Entries whose result may overflow get an infinite bound.
    """
    xp = array_module(T.residues)
    e = xp.clip(T.exponent().astype(np.int64, copy=False), -(1 << 20), 1 << 20).astype(np.int32)
    if mode == "fp64":
        D = inflate(D + fraction_up(decode_factor("fp64")) * fraction_up(T.bound) * (1 + 2.0**-40), 2)
    else:
        D = inflate(D + 2.0**-53 * inflate(M + D, 2), 3)
    f = fraction_up(int(T.scale.factor))
    with np.errstate(over="ignore", under="ignore"):
        out = xp.ldexp(xp.broadcast_to(D, T.shape) * f, e)
        reach = xp.ldexp(xp.broadcast_to(inflate(M + D, 2), T.shape) * f, e)
    out = inflate(out + 2.0**-1074, 4)
    # a result that may round to +-inf has an infinite error (reported, never a NaN)
    return xp.where(reach >= np.finfo(np.float64).max, np.inf, out)
