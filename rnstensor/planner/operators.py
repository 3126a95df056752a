"""Effective integer operators at a candidate precision, and their row-sum bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..encode import encode_integers
from ..errors import PlanError
from ..primitives import fold_exponents

__all__ = ["PreparedOperator", "prepare_operators"]


@dataclass(frozen=True, eq=False)
class PreparedOperator:
    """One step of a chain as it will execute: the float operator actually encoded and its integers.

    Attributes
    ----------
    axis : int
        The contracted axis of the (non-batch) tensor.
    effective : ndarray
        ``A * 2**(pending - c)`` column by column (``A`` itself on a first visit).
    ints : ndarray
        The row-encoded integers of ``effective`` (int64, or Python ints above 53 bits).
    row_exponents : ndarray
        ``e`` per row: ``effective ~= ints * 2**-e``.
    column_exponents : ndarray
        ``r`` per column (all ``<= 0``): ``effective = A * 2**r`` column by
        column, the folded pending scale relative to its maximum (zeros on a
        first visit).
    rho : int
        ``max_j sum_k |ints[j, k]|``: the bound growth of this product (Eq. 21).
    """

    axis: int
    effective: np.ndarray
    ints: np.ndarray
    row_exponents: np.ndarray
    column_exponents: np.ndarray
    rho: int


def _row_sum_max(ints: np.ndarray) -> int:
    if ints.size == 0:
        return 0
    a = np.abs(ints)
    if ints.dtype != object and int(a.max()) * ints.shape[1] < 2**63:
        return int(a.sum(axis=1).max())
    return max(sum(int(x) for x in row) for row in a)


def prepare_operators(operators: Sequence[np.ndarray], axes: Sequence[int], bits: int) -> tuple[PreparedOperator, ...]:
    """Encode every operator of a chain at ``bits`` as it will execute ([2610.05059] Sec. 5.2).

    Operator rows get their own exponents; when an axis is contracted again,
    the pending row scales of the previous product on it are first folded
    into the new operator's columns, so no scale is applied twice. Depends on
    the operators and axes only, never on a tensor.
    """
    pending: dict[int, np.ndarray] = {}
    out = []
    for i, (A, ax) in enumerate(zip(operators, axes)):
        pend = pending.get(ax)
        try:
            eff, c = fold_exponents(A, pend)
        except ValueError as exc:
            # the least k that keeps every nonzero entry normal after the fold (then every scaling is exact)
            tiny = float(np.abs(A[A != 0]).min())
            k = max(1, math.ceil(-1022 - math.log2(tiny) - int((pend - pend.max()).min())))
            raise PlanError(
                f"operator {i} contracts axis {ax} again, and its columns take the previous product's row scales "
                f"in residues: {exc}: pass operators[{i}] * 2.0**{k} and multiply the result by 2.0**-{k}, or plan "
                f"method='composed' (which decodes between products, so nothing is folded)"
            ) from None
        rel = np.zeros(eff.shape[1], np.int64) if pend is None else pend - c
        ints, e = encode_integers(eff, bits, shared_axes=(1,))
        e = e.reshape(-1).copy()
        # an all-zero row yields exact zeros whatever its exponent; Alg. 5's exponent 0 would make its
        # pending scale the largest of the axis and, folded into a later operator on the axis, push every
        # other column ~b bits down (the rows that matter lose their precision): give it the smallest scale
        zero = ~np.any(eff != 0, axis=1)
        if zero.any() and not zero.all():
            e[zero] = e[~zero].max()
        pending[ax] = -e
        out.append(PreparedOperator(ax, eff, ints, e, rel, _row_sum_max(ints)))
    return tuple(out)
