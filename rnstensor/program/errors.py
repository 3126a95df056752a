"""The running error analysis of a residue program: per entry, a magnitude bound ``M`` and an error bound ``D``.

An observer of :func:`~rnstensor.program.execute.execute`: every step maps
its operands' ``(M, D)`` (``|x̂| <= M``, ``|x̂ - x| <= D`` against the exact
value ``x``) to its result's. Encoding errs by half a unit of the entry's
exponent group, a drop by under one unit of the quotient, a product by
``|x̂ŷ - xy| <= D_x M_y + M_x D_y`` summed over the contracted indices, a
re-encoding by the fp64 decode's bound plus half a unit; the final decode
adds its own term (:func:`decoded`). The float64 arithmetic of the bounds
is inflated so that each stays an upper bound of its exact value.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..arrays import array_module
from ..planner.bounds import decode_factor, fraction_up
from .execute import Value, combine_parts, unit
from .ir import Combine, Contract, Drop, Encode, Operand, Reencode, Sum

__all__ = ["EntrywiseErrors", "inflate", "decoded"]


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


class EntrywiseErrors:
    """Propagates ``(M, D)`` per entry through a program (float64, rounded up), beside its execution.

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
            x = self.leaf(st)
            half = 0.5 * unit(v)
            err[st.out] = (xp.abs(x) + half, xp.broadcast_to(half, x.shape))
        elif isinstance(st, Operand):
            err[st.out] = (xp.broadcast_to(float(v.bound) * unit(v), v.planes.shape[1:]), 0.0)
        elif isinstance(st, Drop):
            M, D = err[st.x]
            u = unit(v)
            err[st.out] = (M + u, D + u)
        elif isinstance(st, Reencode):
            x = before[st.x]
            M, D = err[st.x]
            moduli = self.basis.moduli if x.active is None else x.active
            f = fraction_up(decode_factor("fp64", moduli, x.bound)) * float(x.bound) * unit(x) * (1 + 2.0**-40)
            half = 0.5 * unit(v)
            err[st.out] = (M + f + half, D + f + half)
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
            err[st.out] = (ein(Mx, My), ein(Dx, My) + ein(Mx, Dy))
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
    """The bound after the final decode of tensor ``T``: ``'fp64'`` adds the Horner bound, ``'exact'`` half an ulp."""
    xp = array_module(T.residues)
    e = T.exponent().astype(np.int64, copy=False)
    with np.errstate(over="ignore"):
        u = xp.ldexp(float(T.scale.factor), xp.clip(e, -1100, 1100).astype(np.int32))
        if mode == "fp64":
            f = fraction_up(decode_factor("fp64", T.active, T.bound))
            D = D + f * float(T.bound) * u * (1 + 2.0**-40)
        else:
            D = D + 2.0**-53 * (M + D)
    return inflate(xp.broadcast_to(D, T.shape) + 2.0**-1074, 4)
