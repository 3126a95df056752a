"""``moduli='auto'`` for expressions: the fewest moduli on which a plan is exact, and exact sums of exact parts."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..arith import round_scaled_int, to_int_ref
from ..arrays import array_module, to_host
from ..basis import int8_pool

__all__ = ["least_moduli", "split_exact", "exact_value", "round_exact_sum", "half_spacing", "MAX_MODULI"]

#: the INT8 pool: 49 moduli, log2 P about 342
MAX_MODULI = len(int8_pool())


def least_moduli(fits: Callable[[int], bool], start: int = 2) -> Optional[int]:
    """The least ``s`` in ``start..49`` with ``fits(s)`` (``fits`` must only improve with ``s``), or ``None``.

    Galloping from ``start`` (the answer is usually near an estimate), then a
    bisection: a few plans, each bounds only.
    """
    lo, step = max(2, start) - 1, 1  # fits(lo) is false or lo below the range
    hi = None
    while hi is None:
        cand = min(lo + step, MAX_MODULI)
        if fits(cand):
            hi = cand
        elif cand == MAX_MODULI:
            return None
        else:
            lo, step = cand, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def split_exact(x, shared: tuple, parts: int) -> list:
    """``x`` as ``parts`` arrays that sum to it exactly, each encoding exactly in about ``1/parts`` of its width.

    Per group (the entries sharing one encoding exponent: equal indices off
    the ``shared`` axes; a complex array's two parts together) with largest
    exponent ``E`` (``2**(E-1) <= max|x| < 2**E``), the first part keeps the
    bits of every entry at or above ``2**(E - W)`` (truncation toward zero at
    that power of two: exact), the rest goes on, and is cut again against its
    own largest entry. ``W = ceil(t / parts)`` with ``t`` the group's exact
    width, so each part's width is at most ``W`` (Ozaki's scheme I split,
    here to make an exact evaluation fit the basis). Where ``x`` lives.
    """
    from ..encode import exact_bits_needed  # noqa: PLC0415 - encode imports the backends

    if parts <= 1:
        return [x]
    xp = array_module(x)
    if x.dtype.kind == "c":  # both parts share their group's exponent
        t = exact_bits_needed(xp.stack([x.real, x.imag]), (0,) + tuple(a + 1 for a in shared))
    else:
        t = exact_bits_needed(x, shared)
    W = -(-t // parts)
    out, rest = [], x
    for _ in range(parts - 1):
        mag = xp.maximum(xp.abs(rest.real), xp.abs(rest.imag)) if rest.dtype.kind == "c" else xp.abs(rest)
        top = mag.max(axis=shared, keepdims=True) if shared else mag
        E = xp.frexp(xp.where(top > 0, top, 1.0))[1].astype(np.int64)
        up = xp.broadcast_to(W - E, rest.shape).astype(np.int32)  # |x| < 2**E: scaled below 2**W, no overflow

        def trunc(v):  # v's bits at or above 2**(E - W), exactly (ldexp scales without a factor that could overflow)
            return xp.ldexp(xp.trunc(xp.ldexp(v, up)), -up)

        head = trunc(rest.real) + 1j * trunc(rest.imag) if rest.dtype.kind == "c" else trunc(rest)
        out.append(head)
        rest = rest - head  # exact: head holds some of rest's own bits
    out.append(rest)
    return out


def exact_value(T) -> tuple:
    """``(S, e)``: an RNSTensor's exact integers as Python ints (its dropped-moduli factor included) and their
    exponents, on the host."""
    S = np.asarray(to_int_ref(to_host(T.residues), T.active) * int(T.scale.factor), dtype=object)  # (0-d stays)
    e = np.broadcast_to(to_host(T.exponent()).astype(np.int64), S.shape)
    return S, e


def round_exact_sum(terms) -> np.ndarray:
    """``sum(S * 2**e for S, e in terms)`` rounded once per entry (float64; the exact sum of Python ints)."""
    (S0, e0), *rest = terms
    lo = np.minimum.reduce([np.asarray(e) for _, e in terms]) if rest else np.asarray(e0)
    total = np.zeros(np.shape(S0), dtype=object)
    for S, e in terms:
        total = np.asarray(total + S * np.power(2, np.asarray(e - lo).astype(object)), dtype=object)
    out = np.empty(total.shape, np.float64)
    flat_t, flat_lo, flat_o = total.reshape(-1), np.broadcast_to(lo, total.shape).reshape(-1), out.reshape(-1)
    for i in range(flat_t.size):
        flat_o[i] = round_scaled_int(flat_t[i], int(flat_lo[i]))
    return out


def half_spacing(y):
    """The error bound of a correctly rounded result ``y``: half the float64 spacing at every entry (per part for a
    complex one, added), ``inf`` where ``y`` is not finite. Where ``y`` lives."""
    xp = array_module(y)
    with np.errstate(over="ignore", invalid="ignore"):
        # half the spacing, but at least the least subnormal: half of it (at zero) is not a float64
        half = lambda v: xp.where(xp.isfinite(v), xp.maximum(xp.spacing(xp.abs(v)) / 2, 5e-324), np.inf)  # noqa: E731
        return half(y.real) + half(y.imag) if xp.iscomplexobj(y) else half(y)
