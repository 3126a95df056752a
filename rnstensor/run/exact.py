"""``moduli='auto'`` for expressions: the fewest moduli on which a plan is exact, exact values, one rounding."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..arith import round_scaled_int
from ..arrays import array_module
from ..basis import int8_pool

__all__ = ["least_moduli", "round_exact_sum", "half_spacing", "MAX_MODULI"]

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
