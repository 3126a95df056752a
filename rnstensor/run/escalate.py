"""The certified default's escalation, once for chain plans and expressions: each element to its narrowest rung."""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..arrays import array_module
from .groups import groups_by_key

__all__ = ["certified_groups"]


def certified_groups(first: tuple, certify: Callable, next_keys: Callable, rung_of: Callable, n: int,
                     merge_fallback: bool = False) -> list:
    """``[(rung, exact, idx)]``: the ``n`` elements of a call grouped by the rung each runs on, the narrowest
    certified for that element alone; ``rung`` None for the elements no rung certifies (the front end's fallback),
    ``exact`` where the element's result is the exact integer (decoded ``'exact'``), ``idx`` the elements' indices
    (None: all of them).

    Starting from ``first`` (``(rung, key)``), ``certify(rung, idx)`` gives ``(ok, excess, exact)`` per element of
    ``idx`` (arrays where the data lives; ``excess`` NaN where refused: no wider rung helps); the elements that
    failed go on to the rungs ``next_keys(key, excess, failed)`` asks for (one key per element, ``inf`` where it
    did not fail), each group of equal keys certified again on ``rung_of(key)`` (``(rung, key)``: the rung
    that key leads to, and its own key; ``rung`` None where there is none). Each element's path and result
    depend on that element alone, so a batch's bits do not depend on how it is split. ``merge_fallback``: the
    elements of every fallback group in one.

    Examples
    --------
    >>> import numpy as np
    >>> need = np.array([53, 61, 53, 200])  # the width each of four elements needs
    >>> def certify(cap, idx):
    ...     mine = need if idx is None else need[idx]
    ...     return mine <= cap, np.where(mine > 160, np.nan, np.where(mine <= cap, 0.0, 2.0)), mine < 0
    >>> groups = certified_groups((53, 53), certify, lambda cap, ex, failed: np.where(failed, cap + 8, np.inf),
    ...                           lambda cap: (cap if cap <= 160 else None, cap), 4)
    >>> [(rung, None if idx is None else idx.tolist()) for rung, _, idx in groups]
    [(53, [0, 2]), (None, [3]), (61, [1])]
    """
    groups, queue = [], [first + (None,)]
    while queue:
        rung, key, idx = queue.pop(0)
        if rung is None:
            groups.append((None, False, idx))
            continue
        ok, excess, exact = certify(rung, idx)
        # (the verdicts' own module: the data's per element, host numbers for a call without elements)
        xp = array_module(ok)

        def pick(sel):  # (one flag read back)
            return idx if bool(sel.all()) else xp.nonzero(sel)[0] if idx is None else idx[sel]

        for flag in (False, True):
            sel = ok & (exact == flag)
            if bool(sel.any()):
                groups.append((rung, flag, pick(sel)))
        refused = xp.isnan(excess)
        if bool(refused.any()):  # refused: wider encodings do not help
            groups.append((None, False, pick(refused)))
        failed = ~ok & ~refused
        if not bool(failed.any()):
            continue
        with np.errstate(invalid="ignore", divide="ignore"):  # (the excess of the elements that did not fail)
            nxt = next_keys(key, excess, failed)
        for k, at in groups_by_key(nxt, xp):
            whole = idx is None and int(at.shape[0]) == n  # every element, one rung: the call as it is
            queue.append(rung_of(k) + (None if whole else at if idx is None else idx[at],))
    if merge_fallback:
        fallback = [idx for rung, _, idx in groups if rung is None]
        if len(fallback) > 1:  # the elements no rung certified, however they got there: one fallback call
            groups = [g for g in groups if g[0] is not None] + [(None, False, xp.concatenate(fallback))]
    return groups
