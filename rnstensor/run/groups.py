"""Elements of a call run in groups (each element on the path its own certificate picks): grouping, results, message."""

from __future__ import annotations

import math

__all__ = ["groups_by_key", "put_back", "evaluation"]


def groups_by_key(keys, xp) -> list:
    """``[(key, indices)]``: the elements grouped by their ``keys`` (one number each, where the data lives: ``xp``),
    the least key first; elements keyed ``inf`` are left out. One number read back per group.

    Examples
    --------
    >>> import numpy as np
    >>> [(k, i.tolist()) for k, i in groups_by_key(np.array([16.0, 15.0, np.inf, 16.0]), np)]
    [(15, [1]), (16, [0, 3])]
    """
    out, left = [], keys
    while True:
        least = float(left.min()) if left.size else math.inf
        if least == math.inf:
            return out
        out.append((int(least), xp.nonzero(left == least)[0]))
        left = xp.where(left == least, math.inf, left)


def put_back(parts: list, n: int, xp, axis: int = 0):
    """The results ``[(indices, part)]`` of groups of ``n`` elements as one array on ``xp``, element ``i`` of the
    call at position ``i`` of ``axis`` (the parts' own shape elsewhere); ``indices`` None: the part is the whole
    call's."""
    if parts[0][0] is None:
        return parts[0][1]
    first = parts[0][1]
    shape = list(first.shape)
    shape[axis] = n
    y = xp.empty(tuple(shape), dtype=first.dtype)
    for idx, part in parts:
        index = [slice(None)] * y.ndim
        index[axis] = idx
        y[tuple(index)] = part
    return y


def evaluation(counts: dict, n: int, what: str) -> str:
    """How a call ran: the one evaluation of all its elements, or each with its count (``counts``: evaluation ->
    elements, in the order met; ``what``: the elements' name).

    Examples
    --------
    >>> evaluation({"residues on 15 moduli": 3}, 3, "tensors")
    'residues on 15 moduli'
    >>> evaluation({"residues on 15 moduli": 2, "composed classical GEMMs": 1}, 3, "tensors")
    'residues on 15 moduli (2 of 3 tensors); composed classical GEMMs (1 of 3 tensors)'
    """
    if len(counts) == 1:
        return next(iter(counts))
    return "; ".join(f"{how} ({k} of {n} {what})" for how, k in counts.items())
