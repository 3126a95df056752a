"""One product or a split one (the in-memory GEMM's choice): exact slices of rows / columns too wide for 49 moduli,
or the exact product in integers."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..arrays import array_module
from ..encode import _NONE
from ..magnitude import measure_ratio
from ..planner.methods import MIN_BITS
from ..run.epilogue import exact_combination
from ..reference import exact_ints
from ..run.exact_path import exact_int_matmul, limb_moduli
from .scan import _magnitude, frexp_exponent, gemm_scale, group_lsb, group_stats
from .width import _MAX_MODULI, SplitNeeded, gemm_width, moduli_for_bits

__all__ = ["row_slices", "split_width"]


def _choose(moduli, opa, opb, k: int, cplx: bool, fn: str = "dgemm", min_bits: int = MIN_BITS,
            rtol: Optional[float] = None):
    """The scan and moduli choice of one in-memory GEMM: ``(mode, s, t, ea, eb, A, Bm, fa, fb)``.

    ``A`` / ``Bm`` are ``op(a)`` / ``op(b)`` with their non-finite rows /
    columns zeroed (``fa`` / ``fb`` mark the finite ones). ``mode``:
    ``'whole'`` (one product at ``s`` moduli, width ``t``, exponents ``ea``,
    ``eb``), ``'pairs'`` (``moduli=None`` beyond 49 moduli: :func:`row_slices`
    at :func:`split_width`'s ``s``) or ``'exact'`` (``'auto'`` beyond: the
    exact product in integers, :func:`_exact_auto`, its residue GEMM of limbs
    on ``s`` moduli); the split modes leave ``t``, ``ea``, ``eb`` to them.
    """
    xp = array_module(opa, opb)
    auto = moduli == "auto"
    sa, sb = group_stats(opa, 1, auto, xp), group_stats(opb, 0, auto, xp)
    fa, fb = sa[0], sb[0]
    A = opa if bool(fa.all()) else xp.where(fa[:, None], opa, 0)
    Bm = opb if bool(fb.all()) else xp.where(fb[None, :], opb, 0)
    try:
        # (the rows and columns zeroed for their inf / NaN have no encoding error: exponent NONE, as zero ones)
        s, t, ea, eb = gemm_scale(moduli, k, cplx, sa, sb, fn, min_bits,
                                  lambda: (group_lsb(A, 1, xp), group_lsb(Bm, 0, xp)),
                                  lambda: measure_ratio(A, xp.where(fa, sa[1], _NONE), Bm, xp.where(fb, sb[1], _NONE),
                                                        xp), rtol, xp)
        return "whole", s, t, ea, eb, A, Bm, fa, fb
    except SplitNeeded:
        # the split product meets the classical bound, not an arbitrary target: a target takes moduli='auto''s exact
        # split, correctly rounded (so within any target), as the einsum and chain defaults do
        if auto or rtol is not None:
            return "exact", len(limb_moduli(2 * k if cplx else k)), None, None, None, A, Bm, fa, fb
        return "pairs", split_width(k, cplx, A, Bm), None, None, None, A, Bm, fa, fb


def _resolve_moduli(moduli, opa, opb, k: int, cplx: bool, rtol: Optional[float] = None) -> int:
    """The number of moduli a GEMM of ``op(a) @ op(b)`` uses (finite rows / columns only)."""
    return _choose(moduli, opa, opb, k, cplx, min_bits=0, rtol=rtol)[1]


# ----- exact slices of wide rows / columns (moduli=None beyond 49 moduli) -------------------------


def row_slices(x, t: int):
    """Split every row of ``x`` into slices each within ``t - 53`` binades of its own largest entry.

    Entry ``x_ik`` of exponent ``E`` goes to slice ``(Emax_i - E) // (t - 52)``
    of its row, whole, so the slices of a row sum to it exactly and each is
    encoded at width ``t`` with an exact leading part (real: exactly; complex:
    the smaller part of an entry loses at most ``u`` of its modulus).

    Returns
    -------
    (xs, owner, rank)
        ``xs`` (rows x k): the nonempty slices, row-major by ``(owner, slice)``;
        ``owner[r]``: the row of ``x`` slice ``r`` belongs to; ``rank[r]``:
        its position among that row's slices.

    Examples
    --------
    >>> xs, owner, rank = row_slices(np.array([[1.0, 1e-300, 0.5]]), 60)
    >>> xs, owner, rank
    (array([[1.e+000, 0.e+000, 5.e-001],
           [0.e+000, 1.e-300, 0.e+000]]), array([0, 0]), array([0, 1]))
    """
    xp = array_module(x)
    q, keys, span = _slice_keys(x, t)
    owner, slot = keys // span, keys % span
    rank = xp.arange(keys.size, dtype=np.int64) - xp.searchsorted(owner, owner, side="left")
    xs = xp.where(q[owner] == slot[:, None], x[owner], 0)
    return xs, owner, rank


def _slice_keys(x, t: int):
    """``(q, keys, span)``: every entry's slice (``-1`` for zeros) and the sorted ``row * span + slice`` in use."""
    xp = array_module(x)
    m, k = x.shape
    E = frexp_exponent(_magnitude(x, xp), xp)
    nz = E != _NONE
    Emax = xp.max(xp.where(nz, E, _NONE), axis=1) if k else xp.full(m, _NONE, np.int64)
    q = xp.where(nz, (Emax[:, None] - E) // (t - 52), -1)
    span = int(q.max()) + 2 if q.size else 1
    keys = xp.unique((xp.arange(m, dtype=np.int64)[:, None] * span + q)[nz])
    return q, keys, span


def _sum_slices(part, owner, rank, rows: int):
    """``sum`` of the slice rows of ``part`` into ``rows`` rows, slice 0 first: the same order on every backend."""
    xp = array_module(part)
    out = xp.zeros((rows,) + tuple(part.shape[1:]), part.dtype)
    for r in range(int(rank.max()) + 1 if rank.size else 0):
        sel = rank == r  # each owner at most once per rank: a plain indexed add
        out[owner[sel]] += part[sel]
    return out


def _slice_exponent(x, axis: int):
    """frexp exponent of each slice's largest magnitude (every slice is nonempty)."""
    xp = array_module(x)
    return frexp_exponent(_magnitude(x, xp).max(axis=axis), xp)


def split_width(k: int, cplx: bool, A, Bm) -> int:
    """The moduli count of a split GEMM: the cheapest of a few widths by ``s * rows' * columns'`` (slices counted)."""
    kind = "complex" if cplx else "real"
    s0 = moduli_for_bits(k, 53, kind=kind)
    best = None
    for s in sorted({s0, (s0 + _MAX_MODULI) // 2, (3 * s0 + _MAX_MODULI) // 4, _MAX_MODULI}):
        t = gemm_width(s, k, kind)
        rows, cols = _slice_keys(A, t)[1].size, _slice_keys(Bm.T, t)[1].size
        cost = s * max(rows, 1) * max(cols, 1)
        if best is None or cost < best[0]:
            best = (cost, s)
    return best[1]


def _auto_operands(A, Bm, cplx: bool):
    """The real products whose exact sums give ``op(a) @ op(b)``: itself, or (Re, Im) of the complex one.

    ``Re = [Ar, -Ai] [Br; Bi]`` and ``Im = [Ar, Ai] [Bi; Br]``: real slices
    encode every part exactly (a complex entry's two parts may be far apart).
    """
    if not cplx:
        return [(A, Bm)]
    xp = array_module(A, Bm)
    re = (xp.hstack([A.real, -A.imag]), xp.vstack([Bm.real, Bm.imag]))
    im = (xp.hstack([A.real, A.imag]), xp.vstack([Bm.imag, Bm.real]))
    return [re, im]


def _exact_auto(A, Bm, cplx: bool, alpha, beta, c, be) -> np.ndarray:
    """``alpha * A @ Bm + beta * c`` rounded once (each part): the exact real products of :func:`_auto_operands` in
    Python integers (:func:`rnstensor.run.exact_path.exact_int_matmul`: limbs of every row and column, one residue
    GEMM on backend ``be``: a complex product's two real ones as one batch), combined by
    :func:`~rnstensor.run.epilogue.exact_combination`. Host arrays."""
    ops = _auto_operands(A, Bm, cplx)
    xi, ex = exact_ints(np.stack([x for x, _ in ops]))
    yi, ey = exact_ints(np.stack([y for _, y in ops]))
    z, ez = exact_int_matmul(xi, yi, be)
    e = np.full(z.shape[1:], ex + ey + ez, np.int64)
    return exact_combination([(part, e) for part in z], alpha, beta, c, cplx)
