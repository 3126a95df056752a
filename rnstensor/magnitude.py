"""The measured lower bound of ``|A||B|`` that the classical GEMM width reads, and its device-independent value.

The default GEMM (``moduli=None``) takes the fewest moduli whose width keeps
the classical bound, entry by entry, from one float32 GEMM of the scaled
magnitudes (:func:`measure_ratio`). That GEMM sums in whatever order the
device's BLAS takes (OpenBLAS by thread count, cuBLAS by its kernel, Dask by
its chunks) and may flush subnormal results, so the measured ratio differs
between devices in its last bits. The bound absorbs that; the *choice* must
not: a ratio that falls near a threshold between two widths could pick
different moduli, so different bits, on the CPU and the GPU.
:class:`MeasuredRatio` therefore carries the spread any device's measurement
may have, and :meth:`MeasuredRatio.settle` the value every device agrees on:
the least ratio over the entries near the measured minimum, each summed
exactly on the host from the same float32 inputs (which every device forms
alike: exact scalings, one rounding, subnormals flushed explicitly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .arrays import array_module, to_host
from .encode import _NONE

__all__ = ["MeasuredRatio", "measure_ratio", "measure_ratios", "magnitude_ratio", "SETTLE_MAX_ENTRIES"]

#: the most near-minimal entries :meth:`MeasuredRatio.settle` sums exactly (their rows and columns come to the host)
SETTLE_MAX_ENTRIES = 64

_TINY32 = float(np.finfo(np.float32).tiny)  # 2**-126: below it float32 values are flushed, on every device alike


@dataclass(frozen=True)
class MeasuredRatio:
    """A measured lower bound of the classical width's ratio (see :func:`measure_ratio`).

    ``value`` is this device's lower bound; any device's measurement of the
    same data lies within the relative ``spread`` of the exact ratio of the
    shared float32 inputs, so within about ``2 spread`` of ``value``.
    ``settle()`` returns the device-independent lower bound (``None`` where
    more than :data:`SETTLE_MAX_ENTRIES` entries are near the minimum).
    """

    value: float
    spread: float
    settle: Callable[[], Optional[float]]


def _scaled(x, e, axis: int, k: int, xp):
    """``(low32, total)``: ``|x|`` scaled by ``2**-e`` per row (``axis=1``) or column, as float32 rounded down with
    subnormals flushed to zero, and the sums of the scaled magnitudes in float64 rounded up."""
    e = -xp.where(e == _NONE, 0, e)
    # 2**-e as two factors within the float range (|e| <= 1075) where one would overflow: exact products,
    # or an underflow below 2**-1074 that the float32 step down and the sums' slack cover
    halves = [e - e // 2, e // 2] if int(abs(e).max()) > 1000 else [e]
    factors = [xp.ldexp(1.0, h.astype(np.int32)) for h in halves]
    factors = [f[:, None] if axis == 1 else f[None, :] for f in factors]
    if x.dtype.kind == "c":
        re, im = xp.abs(x.real), xp.abs(x.imag)
        low, up = xp.maximum(re, im), re + im
    else:
        low = up = xp.abs(x)
    for f in factors:
        low *= f  # in place: a fresh temporary per step costs page faults as large as the product
        if up is not low:
            up *= f
    # rounded to nearest, then one float32 step down: below the float64 value; subnormals (which some devices
    # flush and others keep) flushed here on every device, so every device holds the same float32 inputs
    low32 = xp.nextafter(low.astype(np.float32), np.float32(0))
    low32 = xp.where(low32 < np.float32(_TINY32), np.float32(0), low32)
    total = up.sum(axis=axis) * (1 + (k + 2) * 2.0**-52) + k * 2.0**-1070
    return low32, up, total


def _scalar(x) -> float:
    x = x.compute() if hasattr(x, "compute") else x
    return float(x)


def measure_ratio(A, Ea, Bm, Eb, xp=None) -> Optional[MeasuredRatio]:
    """A lower bound of ``min_ij (|A||B|)_ij / (2**Eb_j sum_p |a_ip| + 2**Ea_i sum_p |b_pj|)`` over nonzero rows / columns.

    The ratio is what the encoding error of a width needs: an inexact row
    moves each entry by at most ``2**(Ea_i - t - 1)``, so the product's error
    is at most ``2**(-t-1)`` times the denominator (plus ``k 4**(-t-1)``
    times ``2**(Ea_i + Eb_j)``). Every row ``i`` of ``op(a)`` is scaled by
    ``2**-Ea_i`` and every column ``j`` of ``op(b)`` by ``2**-Eb_j`` (largest
    magnitude in ``[1/2, 1)``), so nothing overflows whatever the exponents:
    ``|A||B|`` from one float32 GEMM of the scaled magnitudes rounded down
    (``max(|re|, |im|)`` for complex entries) and lowered by its rounding and
    underflow error (a BLAS that flushes subnormal products and sums
    included), the sums in float64 rounded up (``|re| + |im|``). One scalar
    read back, where the data lives (``xp``: the array namespace, for Dask).
    ``None`` when ``k`` is too long for a float32 bound; a value of 0 where
    some such ``|A||B|`` entry is (or underflows to) zero.
    """
    xp = xp or array_module(A, Bm)
    return measure_ratios(A[None], Ea[None], Bm[None], Eb[None], xp)[0]


def measure_ratios(A, Ea, Bm, Eb, xp=None) -> list:
    """:func:`measure_ratio` of every matrix of a stack: ``A`` ``(nb, m, k)`` with ``Ea`` ``(nb, m)``, ``Bm``
    ``(nb, k, n)`` with ``Eb`` ``(nb, n)``, or one ``Bm`` ``(k, n)`` with ``Eb`` ``(n,)`` that every matrix of ``A``
    multiplies (the elements of a GEMM-shaped einsum: one GEMM of all their rows, ``Bm`` scaled once); one
    (batched) float32 GEMM and one vector read back for all (``[None] * nb`` when ``k`` is too long for a float32
    bound)."""
    xp = xp or array_module(A, Bm)
    nb, m, k = A.shape
    shared = Bm.ndim == 2
    n = Bm.shape[-1]
    if (k + 2) * 2.0**-23 > 0.25:
        return [None] * nb
    # the rows of every matrix of A, and the columns of every matrix of Bm (as rows of its transpose), scaled
    a32, a_up, rA = _scaled(A.reshape(nb * m, k), Ea.reshape(nb * m), 1, k, xp)
    nbb = 1 if shared else nb
    b32, b_up, cB = _scaled(xp.swapaxes(Bm.reshape(nbb, k, n), 1, 2).reshape(nbb * n, k), Eb.reshape(nbb * n), 1, k,
                            xp)
    a32, a_up, b32, b_up = a32.reshape(nb, m, k), a_up.reshape(nb, m, k), b32.reshape(nbb, n, k), b_up.reshape(nbb, n, k)
    rA, cB = rA.reshape(nb, m), cB.reshape(nbb, n)
    b32, b_up = xp.swapaxes(b32, 1, 2), xp.swapaxes(b_up, 1, 2)  # (nbb, k, n) views
    # float32 sums in any order: relative error below (k + 1) 2**-24; products and partial sums flushed or
    # underflowing lose at most 2**-126 each, 2k of them (on the CPU one single-threaded GEMM per thread, as the
    # product that follows runs them; a stack, numpy's batched GEMM; a shared Bm, one GEMM of every row)
    if xp is np and nb == 1:
        from .backends.cpu.gemm import threaded_matmul  # noqa: PLC0415 - numba, loaded on first use

        P = threaded_matmul(a32[0], b32[0])[None]
    elif nb == 1:
        P = (a32[0] @ b32[0])[None]
    elif shared:
        P = (a32.reshape(nb * m, k) @ b32[0]).reshape(nb, m, n)
    else:
        P = xp.matmul(a32, b32)
    ratio = (P.astype(np.float64) * (1 - (k + 2) * 2.0**-23) - k * 2.0**-125) / (rA[:, :, None] + cB[:, None, :])
    # zero rows / columns (and those zeroed for inf / NaN, passed with exponent NONE) have no encoding error: their
    # entries ask for no ratio
    Eb = Eb.reshape(nbb, n)
    ratio = xp.where((Ea == _NONE)[:, :, None] | (Eb == _NONE)[:, None, :], np.inf, ratio)
    if m and n:
        lows = ratio.reshape(nb, m * n).min(axis=1)
        lows = lows.compute() if hasattr(lows, "compute") else lows
        lows = [float(v) for v in to_host(lows)]
    else:
        lows = [math.inf] * nb
    # two devices' P differ by at most 2 (k + 1) 2**-24 relatively, their float64 sums and quotients by (k + 8) 2**-52
    spread = 2 * (k + 2) * 2.0**-24 + (k + 8) * 2.0**-52 + 2.0**-48

    def measured(i: int) -> MeasuredRatio:
        def settle() -> Optional[float]:
            j = 0 if shared else i
            return _settled_minimum(ratio[i], lows[i], spread, a32[i], a_up[i], b32[j], b_up[j], Ea[i], Eb[j], k, xp)

        return MeasuredRatio(max(lows[i], 0.0) * (1 - 2.0**-50), spread, settle)  # (the quotient's rounding)

    return [measured(i) for i in range(nb)]


def _settled_minimum(ratio, low: float, spread: float, a32, a_up, b32, b_up, Ea, Eb, k: int, xp) -> Optional[float]:
    """The least ratio over the entries whose measured ratio is within ``4 spread`` of the measured minimum, each from
    an exact sum on the host of the shared float32 inputs: the same on every device (the true minimum among them)."""
    if not ratio.size or not math.isfinite(low):
        return max(low, 0.0) * (1 - 2.0**-50) if math.isfinite(low) else low
    near = ratio <= max(low, 0.0) * (1 + 4 * spread) + 2.0**-1000
    count = int(_scalar(near.sum()))
    if count > SETTLE_MAX_ENTRIES:
        return None
    where = xp.nonzero(near)
    rows, cols = (to_host(v.compute() if hasattr(v, "compute") else v).astype(np.int64) for v in where)

    def fetch(x):  # the few rows / columns named, to the host
        x = x.compute() if hasattr(x, "compute") else x
        return to_host(x)

    ia, jb = np.unique(rows), np.unique(cols)
    A32, Aup = fetch(a32[ia]), fetch(a_up[ia])
    B32, Bup = fetch(b32[:, jb]), fetch(b_up[:, jb])
    EaH, EbH = fetch(Ea[ia]), fetch(Eb[jb])
    best = math.inf
    for i, j in zip(rows.tolist(), cols.tolist()):
        r, c = int(np.searchsorted(ia, i)), int(np.searchsorted(jb, j))
        if EaH[r] == _NONE or EbH[c] == _NONE:
            continue
        # float32 x float32 products are exact in float64; fsum rounds their sum once: a lower bound one step down
        num = math.fsum((A32[r].astype(np.float64) * B32[:, c].astype(np.float64)).tolist()) * (1 - 2.0**-52)
        den = (math.fsum(Aup[r].tolist()) + math.fsum(Bup[:, c].tolist())) * (1 + 2.0**-51) + 2.0**-1070
        best = min(best, max(num, 0.0) / den)
    return best * (1 - 2.0**-50) if math.isfinite(best) else best


def magnitude_ratio(A, Ea, Bm, Eb, xp=None) -> Optional[float]:
    """:func:`measure_ratio`'s value on this device (``None`` where ``k`` is too long for a float32 bound)."""
    m = measure_ratio(A, Ea, Bm, Eb, xp)
    return None if m is None else m.value
