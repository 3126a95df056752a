"""Exact references: float64 tensors as scaled Python integers, exact chains, one correct rounding."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .arith import float_parts, round_scaled_int

__all__ = ["exact_ints", "exact_mode_chain", "round_exact"]


def exact_ints(x) -> tuple[np.ndarray, int]:
    """``x == ints * 2**k`` exactly: an object array of Python ints and one common exponent ``k``.

    Examples
    --------
    >>> ints, k = exact_ints(np.array([0.75, -2.0]))
    >>> ints.tolist(), k
    ([3, -8], -2)
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ValueError("exact_ints: x must be finite")
    m, k = float_parts(x)
    nz = m != 0
    k0 = int(k[nz].min()) if nz.any() else 0
    shift = np.where(nz, k - k0, 0)
    ints = m.astype(object) * (np.full(x.shape, 2, dtype=object) ** shift.astype(object))
    return ints, k0


def exact_mode_chain(x, operators: Sequence, axes: Sequence[int], ndim: int | None = None) -> tuple[np.ndarray, int]:
    """The exact value of ``A_d ×_{m_d} ( ... (A_1 ×_{m_1} x))`` as ``(ints, k)`` with value ``ints * 2**k``.

    ``axes`` count within the trailing ``ndim`` tensor axes (default
    ``max(axes) + 1``), as in :func:`rnstensor.plan_chain`; leading axes are a
    batch. Integer arithmetic throughout (object-dtype tensordot), so nothing
    is rounded.
    """
    v, k = exact_ints(x)
    batch = v.ndim - (max(axes) + 1 if ndim is None else ndim)
    for A, ax in zip(operators, axes):
        a_ints, ka = exact_ints(A)
        v = np.moveaxis(np.tensordot(a_ints, v, axes=([1], [batch + ax])), 0, batch + ax)
        k += ka
    return v, k


def round_exact(ints: np.ndarray, k: int) -> np.ndarray:
    """``ints * 2**k`` rounded once to nearest-even float64, entry by entry."""
    ints = np.asarray(ints, dtype=object)
    out = np.empty(ints.shape, dtype=np.float64)
    flat, o = ints.reshape(-1), out.reshape(-1)
    for i in range(flat.size):
        o[i] = round_scaled_int(flat[i], k)
    return out
