"""The exponent scan of a GEMM's operands and the scale it gives (in memory and :mod:`rnstensor.dask` alike)."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..arrays import array_module, to_host
from ..encode import _NONE, entry_stats
from ..errors import RNSRangeError
from ..planner.methods import MIN_BITS, check_kept_bits
from .width import (_MAX_MODULI, _RANGE_FACTOR, SplitNeeded, classical_moduli, classical_moduli_stack, gemm_width,
                    moduli_for_bits, one_matrix)

__all__ = ["frexp_exponent", "group_stats", "group_lsb", "exact_widths", "stack_moduli", "gemm_scale"]

# ----- the exponent scan (in memory and Dask alike) -----------------------------------------------

def _magnitude(x, xp):
    """``|x|``, or ``max(|re|, |im|)`` of complex entries: the magnitude an exponent per group is read from."""
    return xp.abs(x) if x.dtype.kind != "c" else xp.maximum(xp.abs(x.real), xp.abs(x.imag))


def frexp_exponent(a, xp=None):
    """The frexp exponent of every positive entry, ``NONE`` for zeros (int64), where ``a`` lives (``xp``: its array
    module, where the caller has it; a Dask block's is its own)."""
    xp = array_module(a) if xp is None else xp
    return xp.where(a > 0, xp.frexp(a)[1].astype(np.int64), _NONE)


def group_stats(x, axis: int, need_lsb: bool, xp=None):
    """``(finite, Emax, lsb_min, Emin)`` per row (``axis=1``) or column (``axis=0``) of a matrix, where it lives.

    ``finite``: the group holds no inf / NaN; ``Emax``: the frexp exponent of
    its largest finite magnitude (``max(|re|, |im|)`` for complex data;
    ``NONE`` for an all-zero group); ``lsb_min`` (``need_lsb`` only, else
    ``None``): the lowest set bit of any of its significands; ``Emin``: the
    frexp exponent of its smallest nonzero finite part (real or imaginary),
    ``NONE`` for an all-zero group. NumPy matrices: one threaded pass over
    the IEEE bits (:func:`rnstensor.backends.cpu_gemm.group_stats`); other
    arrays: two passes over ``|x|`` for the exponents, and the lowest bits
    need every significand. ``xp``: ``x``'s array module, where the caller has it.
    """
    xp = array_module(x) if xp is None else xp
    if _cpu_scannable(x, xp):
        from ..backends.cpu.gemm import group_stats as scan  # noqa: PLC0415 - numba, loaded on first use

        return scan(x, axis, need_lsb)
    return _group_stats_array(x, axis, need_lsb, xp)


def _cpu_scannable(x, xp) -> bool:
    """Whether the CPU's one-pass scan takes ``x``: a 2-D float64 or complex128 NumPy matrix."""
    return xp is np and x.ndim == 2 and x.dtype in (np.float64, np.complex128)


def _group_stats_array(x, axis: int, need_lsb: bool, xp):
    """:func:`group_stats` in array operations, where ``x`` lives (CuPy, and the reference of the CPU scan)."""
    mag = _magnitude(x, xp)
    finite = xp.isfinite(x)
    fin = finite.all(axis=axis)
    all_finite = bool(fin.all())
    amax = mag.max(axis=axis) if all_finite else xp.where(finite, mag, 0.0).max(axis=axis)
    parts = (mag,) if x.dtype.kind != "c" else (xp.abs(x.real), xp.abs(x.imag))
    amin = None
    for p in parts:
        keep = p != 0 if all_finite else (p != 0) & xp.isfinite(p)
        low = xp.where(keep, p, np.inf).min(axis=axis)
        amin = low if amin is None else xp.minimum(amin, low)
    lsb = group_lsb(x, axis, xp) if need_lsb else None
    return fin, frexp_exponent(amax, xp), lsb, frexp_exponent(xp.where(xp.isfinite(amin), amin, 0.0), xp)


def group_lsb(x, axis: int, xp=None):
    """The ``lsb_min`` of :func:`group_stats` alone (the lowest set bit of any significand per group)."""
    xp = array_module(x) if xp is None else xp
    if _cpu_scannable(x, xp):
        return group_stats(x, axis, True, xp)[2]
    return entry_stats(x)[2].min(axis=axis)


def exact_widths(a_stats, b_stats, xp):
    """The least width that encodes every finite row of ``op(a)`` and column of ``op(b)`` exactly (at least 1), from
    the :func:`group_stats` with the lowest bits: one number, or one per matrix where the statistics carry a leading
    matrix axis; where they live (``xp``)."""
    need = None
    for f, E, lo in ((a_stats[0], a_stats[1], a_stats[2]), (b_stats[0], b_stats[1], b_stats[2])):
        if E.shape[-1]:
            v = xp.where(f & (E != _NONE), E - lo, 1).max(axis=-1)
            need = v if need is None else xp.maximum(need, v)
    return xp.maximum(need, 1) if need is not None else xp.ones(E.shape[:-1], np.int64)


def stack_moduli(moduli, k: int, cplx: bool, a_stats, b_stats, lsb_of: Optional[Callable] = None,
                 magnitudes_of: Optional[Callable] = None, rtol: Optional[float] = None, xp=None) -> list:
    """The moduli count ``s`` of every matrix of a stack (statistics with a leading matrix axis), each as alone:
    an integer ``moduli`` as is, ``'fast'`` the 53-bit width's count, ``None`` :func:`classical_moduli_stack`,
    ``'auto'`` the least count whose width holds every row and column exactly (:func:`exact_widths`); ``None``
    where the rows / columns need more than 49 moduli (the in-memory GEMM's split product). ``lsb_of()`` and
    ``magnitudes_of(which)`` as :func:`classical_moduli_stack` takes them; ``xp``: the statistics' array module,
    where the caller has it."""
    kind = "complex" if cplx else "real"
    nb = a_stats[0].shape[0]
    if isinstance(moduli, (int, np.integer)):
        return [int(moduli)] * nb
    if moduli == "fast":
        return [moduli_for_bits(k, 53, kind=kind)] * nb
    xp = array_module(a_stats[1], b_stats[1]) if xp is None else xp
    if moduli is None:
        return classical_moduli_stack(k, cplx, a_stats, b_stats, lsb_of, magnitudes_of, rtol, xp)
    top = gemm_width(_MAX_MODULI, k, kind)
    return [moduli_for_bits(k, bits, kind=kind) if bits <= top else None
            for bits in to_host(exact_widths(a_stats, b_stats, xp)).reshape(-1).tolist()]


def gemm_scale(moduli, k: int, cplx: bool, a_stats, b_stats, fn: str = "dgemm", min_bits: int = MIN_BITS,
               lsb_of: Optional[Callable] = None, magnitudes_of: Optional[Callable] = None,
               rtol: Optional[float] = None, xp=None):
    """``(s, t, ea, eb)``: moduli, width, and the encoding exponent of every row of ``op(a)`` / column of ``op(b)``.

    From the :func:`group_stats` of both operands (host or device vectors;
    the moduli choice reads scalars back). ``moduli=None``:
    :func:`classical_moduli` (the classical componentwise bound; ``lsb_of``
    and ``magnitudes_of`` supply its refinements on demand); ``'fast'``:
    ``moduli_for_bits(k, 53)``; ``'auto'``: the smallest ``s`` whose width
    holds every finite row and column exactly. ``ea = t - Emax`` for finite
    nonzero rows, 0 for the rest (their results come from float64). ``xp``:
    the statistics' array module, where the caller has it.

    Raises
    ------
    SplitNeeded
        ``moduli=None`` or ``'auto'`` on a row / column wider than 49 moduli
        hold (the in-memory GEMM then splits it, see :func:`dgemm`).
    RNSRangeError
        ``s`` moduli cannot hold a product of length ``k`` (no width ``t >= 1``).
    PlanError
        An explicit ``moduli`` gives a width ``t`` below ``min_bits``
        (:func:`rnstensor.planner.methods.check_kept_bits`, the rule of einsum and chains).
    """
    kind = "complex" if cplx else "real"
    (fa, Ea, _, _), (fb, Eb, _, _) = a_stats, b_stats
    xp = array_module(fa, fb, Ea, Eb) if xp is None else xp
    if moduli is None:  # (raises SplitNeeded past 49 moduli)
        s = classical_moduli(k, cplx, a_stats, b_stats, lsb_of, magnitudes_of, rtol, xp)
    else:
        s = stack_moduli(moduli, k, cplx, one_matrix(a_stats), one_matrix(b_stats), xp=xp)[0]
    if s is None:  # 'auto': the in-memory GEMM takes the exact product in integers (split._exact_auto)
        raise SplitNeeded(
            f"{fn}: moduli='auto' needs a width of {int(exact_widths(a_stats, b_stats, xp))} bits to encode every row "
            f"of op(a) and column of op(b) exactly (from the largest entry's leading bit to the smallest nonzero "
            f"one's lowest), but {_MAX_MODULI} INT8 moduli hold t={gemm_width(_MAX_MODULI, k, kind)} at k={k}"
        )
    t = gemm_width(s, k, kind)
    if t < 1:
        least = moduli_for_bits(k, 1, kind=kind)
        try:  # (the count whose width also keeps min_bits: the one that runs as the call stands)
            keeps = moduli_for_bits(k, max(int(min_bits), 1), kind=kind)
        except ValueError:
            keeps = None
        raise RNSRangeError(
            f"{fn}: moduli={s} cannot hold a product of length k={k} (even width 1 needs "
            f"{_RANGE_FACTOR[kind]}*k*4 < P); " + (f"use moduli >= {keeps} (width >= min_bits={min_bits}), or "
                                                   if keeps is not None and keeps != least else "use ")
            + f"moduli >= {least} with min_bits=0 (any width), or moduli='fast'"
        )
    if isinstance(moduli, int):
        check_kept_bits(f"{fn}: moduli={s} at k={k} (width t={t})", float(t), min_bits, None,
                        f"use more moduli (moduli='fast' keeps 53 bits: {moduli_for_bits(k, 53, kind=kind)} at this k)")
    ea = xp.where(fa & (Ea != _NONE), t - Ea, 0).astype(np.int64)
    eb = xp.where(fb & (Eb != _NONE), t - Eb, 0).astype(np.int64)
    return s, t, ea, eb
