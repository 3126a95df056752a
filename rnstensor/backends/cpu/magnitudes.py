"""The classical certification's magnitudes on the CPU: |x| 2**-e, mode products of them, a chain's statistics."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .common import _launch
from .warm import warm

__all__ = ["mode_magnitudes", "encode_magnitudes", "chain_magnitude_stats", "chain_stats_warm"]


# ----- the classical certification's magnitudes ---------------------------------------------------


@njit(cache=True, nogil=True)
def _encode_magnitudes_kernel(X, e, out, stats, t0, t1):
    # row b: out[b] = |X[b]| * 2**-e[b] (correctly rounded: a product by an exact power of two, or ldexp beyond
    # the normal powers), the smallest out over the nonzero X (inf if none), and whether every out is an integer
    for b in range(t0, t1):
        x, o = X[b], out[b]
        eb = e[b]
        if -1000 < eb < 1000:
            s = math.ldexp(1.0, -eb)
            for i in range(x.size):
                o[i] = abs(x[i]) * s
        else:
            k = min(max(-eb, -(1 << 20)), 1 << 20)
            for i in range(x.size):
                o[i] = math.ldexp(abs(x[i]), k)
        least = np.inf
        whole = True
        for i in range(x.size):
            v = o[i]
            least = min(least, v) if x[i] != 0.0 else least
            whole = whole and v == np.floor(v)
        stats[b, 0] = least
        stats[b, 1] = 1.0 if whole else 0.0


def encode_magnitudes(X: np.ndarray, e: np.ndarray, per_row: bool = False) -> tuple:
    """The classical certification's leaf: ``(|X| * 2**-e, smallest of it over the nonzero X, all integers)``.

    ``X`` is ``(B, N)`` float64 and ``e`` one exponent per row (int64); one
    pass, threaded over rows. Each magnitude is the correctly rounded
    ``|x| 2**-e`` (exact while it is normal). ``per_row``: the two statistics
    per row (arrays of ``B``), each a function of its row alone.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    e = np.ascontiguousarray(e, dtype=np.int64).reshape(-1)
    out = np.empty_like(X)
    stats = np.empty((X.shape[0], 2), np.float64)
    if X.shape[1] == 0:
        stats[:, 0], stats[:, 1] = math.inf, 1.0
    elif X.size:
        _launch(_encode_magnitudes_kernel, X.shape[0], X.size, X, e, out, stats)
    if per_row:
        return out, stats[:, 0].copy(), stats[:, 1] == 1.0
    if X.size == 0:
        return out, math.inf, True
    return out, float(stats[:, 0].min()), bool(stats[:, 1].min() == 1.0)


@njit(cache=True, nogil=True)
def _ratio_stats(o, colb, alpha, base, W, q):
    # (smallest positive o[w], largest (alpha colb[w] + base) / o[w] over o[w] > 0) for w < W: the quotients
    # in a loop of their own (branch-free, so it vectorizes), the two reductions after
    for w in range(W):
        v = o[w]
        q[w] = (alpha * colb[w] + base) / v if v > 0.0 else 0.0
    least = np.inf
    worst = 0.0
    for w in range(W):
        v = o[w]
        least = min(least, v) if v > 0.0 else least
        worst = max(worst, q[w])
    return least, worst


@njit(cache=True, nogil=True)
def _mode_magnitudes_kernel(X, A, col, rowsum, weights, own, nj, out, stats, t0, t1):
    # task t = (b, a block of nj-th of the rows j): out[b, j, r] = sum_k A[j, k] X[b, k, r] (nonnegative; each
    # product and sum rounded once), its smallest positive entry and its largest
    # (alpha col[b, r] + beta rowsum[j] + kappa) / out over out > 0, (alpha, beta, kappa) = weights[b] (or
    # weights[0] for every b); own: one task per b, its column sums here while X[b] is in cache
    B, K, R = X.shape
    J = A.shape[0]
    colb = np.zeros(R, np.float64)
    q = np.empty(R, np.float64)
    Z = np.zeros(R, np.float64)
    for t in range(t0, t1):
        b, jb = t // nj, t % nj
        wb = weights[b] if weights.shape[0] > 1 else weights[0]
        alpha, beta, kappa = wb[0], wb[1], wb[2]
        if own:
            for r in range(R):
                colb[r] = 0.0
            for k in range(K):
                for r in range(R):
                    colb[r] += X[b, k, r]
        elif col.shape[0]:
            for r in range(R):
                colb[r] = col[b, r]
        least = np.inf
        worst = 0.0
        for j in range(jb * J // nj, (jb + 1) * J // nj):
            o = out[b, j]
            base = beta * rowsum[j] + kappa
            if R >= 16:  # long rows: vectorize along r
                _dot_in_order(A[j], X[b], K, o, R, Z)
                lj, wj = _ratio_stats(o, colb, alpha, base, R, q)
                least = min(least, lj)
                worst = max(worst, wj)
            else:  # short rows (the last axis): one dot product over k per entry, its statistics at once
                for r in range(R):
                    acc = 0.0
                    for k in range(K):
                        acc += A[j, k] * X[b, k, r]
                    o[r] = acc
                    if acc > 0.0:
                        least = min(least, acc)
                        worst = max(worst, (alpha * colb[r] + base) / acc)
        stats[t, 0] = least
        stats[t, 1] = worst


@njit(cache=True, nogil=True)
def _dot_in_order(a, T, K, o, W, Z):
    # o[w] = (((0 + a0 T0[w]) + a1 T1[w]) + ...) over the K rows of T (nonnegative), each product and sum rounded
    # once, k ascending. Up to 8 terms in one pass with the sum in a register (the missing terms are 0 * Z = +0,
    # which leave a sum of nonnegative numbers unchanged); longer ones accumulate in o (a zero term skipped: +0)
    if K > 8:
        for w in range(W):
            o[w] = 0.0
        for k in range(K):
            ak = a[k]
            if ak != 0.0:
                Tk = T[k]
                for w in range(W):
                    o[w] += ak * Tk[w]
        return
    c = np.zeros(8, np.float64)
    for k in range(K):
        c[k] = a[k]
    T0 = T[0]
    T1 = T[1] if K > 1 else Z
    T2 = T[2] if K > 2 else Z
    T3 = T[3] if K > 3 else Z
    T4 = T[4] if K > 4 else Z
    T5 = T[5] if K > 5 else Z
    T6 = T[6] if K > 6 else Z
    T7 = T[7] if K > 7 else Z
    c0, c1, c2, c3, c4, c5, c6, c7 = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
    for w in range(W):
        s = c0 * T0[w]
        s = s + c1 * T1[w]
        s = s + c2 * T2[w]
        s = s + c3 * T3[w]
        s = s + c4 * T4[w]
        s = s + c5 * T5[w]
        s = s + c6 * T6[w]
        s = s + c7 * T7[w]
        o[w] = s


@njit(cache=True, nogil=True)
def _column_sums(T, K, W, colb):
    # colb[w] = sum over k ascending of T[k, w]
    for w in range(W):
        colb[w] = 0.0
    for k in range(K):
        Tk = T[k]
        for w in range(W):
            colb[w] += Tk[w]


@njit(cache=True, nogil=True)
def _mode_magnitudes_lanes_kernel(X, A, rowsum, alpha, beta, kappa, bpt, out, stats, t0, t1):
    # _mode_magnitudes_kernel for short rows (R < 16) and its own column sums: task t takes bpt tensors b, whose
    # (b, r) pairs are the lanes of every loop (R alone is too short to vectorize), gathered once. The same
    # sums in the same order (k ascending, each product and each sum rounded once; a zero term is +0), so the
    # same magnitudes and statistics bit for bit.
    B, K, R = X.shape
    J = A.shape[0]
    Wm = bpt * R
    T = np.empty((K, Wm), np.float64)
    colb = np.zeros(Wm, np.float64)
    o = np.empty(Wm, np.float64)
    q = np.empty(Wm, np.float64)
    Z = np.zeros(Wm, np.float64)
    for t in range(t0, t1):
        b0 = t * bpt
        b1 = min(B, b0 + bpt)
        W = (b1 - b0) * R
        for k in range(K):
            Tk = T[k]
            if R == 1:  # (a loop of one per tensor costs more than the copy)
                for b in range(b0, b1):
                    Tk[b - b0] = X[b, k, 0]
                continue
            for b in range(b0, b1):
                src = X[b, k]
                off = (b - b0) * R
                for r in range(R):
                    Tk[off + r] = src[r]
        if alpha != 0.0:
            _column_sums(T, K, W, colb)
        least = np.inf
        worst = 0.0
        for j in range(J):
            base = beta * rowsum[j] + kappa
            _dot_in_order(A[j], T, K, o, W, Z)
            lj, wj = _ratio_stats(o, colb, alpha, base, W, q)
            least = min(least, lj)
            worst = max(worst, wj)
            if R == 1:
                for b in range(b0, b1):
                    out[b, j, 0] = o[b - b0]
                continue
            for b in range(b0, b1):
                dst = out[b, j]
                off = (b - b0) * R
                for r in range(R):
                    dst[r] = o[off + r]
        stats[t, 0] = least
        stats[t, 1] = worst


def mode_magnitudes(X: np.ndarray, A: np.ndarray, alpha: float, beta: float, kappa: float, per_row: bool = False):
    """``A`` (``J x K``, nonnegative) applied along axis 1 of ``X`` (``B x K x R``, nonnegative), with the
    certification's two reductions fused into the same pass: ``(out, smallest positive out, largest
    (alpha colsum + beta rowsum + kappa) / out over the positive entries)``; threads over ``(b, j)``.

    Every product and sum is rounded once (no reassociation; a fused
    multiply-add only rounds less): each entry is within a relative
    ``(K + 1) 2**-53`` of the exact sum, and so are the column and row sums.
    Meant for short contractions (sum factorization, ``K`` up to a few
    dozen); long ones are BLAS's.

    ``per_row``: the two reductions per ``b`` (arrays of ``B``), each a
    function of ``X[b]`` and its own weights alone, whatever ``B`` is (the
    column sums in the same order on every path; the per-tensor
    certificate's verdicts); ``alpha``, ``beta`` and ``kappa`` may then be
    arrays of ``B``, one weight per ``b``.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    A = np.ascontiguousarray(A, dtype=np.float64)
    B, K, R = X.shape
    J = A.shape[0]
    out = np.empty((B, J, R), np.float64)
    nj = 1 if B >= 64 else max(J, 1)  # few tensors: the threads share out the rows instead
    rowsum = A.sum(axis=1)
    if per_row:
        # alpha, beta, kappa: a number each, or one per b
        weights = np.ascontiguousarray(np.stack(np.broadcast_arrays(
            np.asarray(alpha, np.float64), np.asarray(beta, np.float64), np.asarray(kappa, np.float64)), axis=-1))
        weights = weights.reshape(-1, 3)
        sums = bool(weights[:, 0].any())
        col = np.zeros((B, R) if sums and nj > 1 else (0, R), np.float64)
        for k in range(K if col.size else 0):  # k ascending, as each task sums its own b (not numpy's pairwise)
            col += X[:, k, :]
        stats = np.empty((B * nj, 2), np.float64)
        if B * J:
            _launch(_mode_magnitudes_kernel, B * nj, X.size * J + out.size, X, A, col, rowsum, weights,
                    sums and nj == 1, nj, out, stats)
        else:
            stats[:, 0], stats[:, 1] = np.inf, 0.0
        stats = stats.reshape(B, nj, 2)
        return out, stats[:, :, 0].min(axis=1), stats[:, :, 1].max(axis=1)
    if nj == 1 and R < 16 and B * J:
        bpt = max(1, 512 // max(R, 1))
        ntasks = -(-B // bpt)
        stats = np.empty((ntasks, 2), np.float64)
        _launch(_mode_magnitudes_lanes_kernel, ntasks, X.size * J + out.size, X, A, rowsum, float(alpha),
                float(beta), float(kappa), bpt, out, stats)
        return out, float(stats[:, 0].min()), float(stats[:, 1].max())
    stats = np.empty((B * nj, 2), np.float64)
    col = X.sum(axis=1) if alpha and nj > 1 else np.zeros((0, R))  # else each task sums its own b
    weights = np.array([[alpha, beta, kappa]], np.float64)
    _launch(_mode_magnitudes_kernel, B * nj, X.size * J + out.size, X, A, col, rowsum, weights,
            col.shape[0] == 0 and alpha != 0.0, nj, out, stats)
    if B * J == 0:
        return out, np.inf, 0.0
    return out, float(stats[:, 0].min()), float(stats[:, 1].max())


# ----- the classical certification of a chain, block by block ---------------------------------------------


@njit(cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "reassoc"})
def _extremes(key, v, q, W):
    # (smallest v[w] where key[w] != 0, largest q[w]) over W lanes: comparisons of finite numbers only, so their
    # order is free (the flags let the reductions vectorize; no value is rounded here)
    lo = np.inf
    m = 0.0
    for w in range(W):
        lo = min(lo, v[w] if key[w] != 0.0 else np.inf)
        m = max(m, q[w])
    return lo, m


@njit(cache=True, nogil=True)
def _row_stats(a, T, K, colb, r, o, q, W, Z):
    # o = the row a of the operator times T (mode_magnitudes' sums); (smallest positive o, largest colb / o over
    # it with a rounded reciprocal, the row sum r over the smallest)
    _dot_in_order(a, T, K, o, W, Z)
    for w in range(W):
        v = o[w]
        q[w] = colb[w] * (1.0 / v) if v > 0.0 else 0.0
    lo, m = _extremes(o, o, q, W)
    return lo, m, (r / lo if lo < np.inf else 0.0)


@njit(cache=True, nogil=True)
def _chain_magnitude_stats_kernel(X, e, steps, ops, rowsums, shape0, nb, stats, t0, t1):
    # Tensors of X (B, N) in blocks of nb, their magnitudes |x| 2**-e (as encode_magnitudes) through every mode
    # product of steps (rows: axis, J, K, offset of the J x K magnitudes in ops and of the row sums in rowsums), each
    # entry the in-order sum of mode_magnitudes (_dot_in_order: k ascending, each product and sum rounded once), in
    # cache: the block's (tensor, row, column) triples are the lanes. Per task (block) and step s, stats[task, s]:
    # the smallest positive magnitude, the largest column sum times the magnitude's reciprocal, and the largest row
    # sum over the magnitude (column sums along the contracted axis of the step's input magnitudes, row sums of the
    # operator's; a row's largest is at its least magnitude);
    # for the encode (s = 0) the smallest magnitude over the nonzero x and whether all are integers (1.0 / 0.0).
    B, N = X.shape
    nsteps = steps.shape[0]
    ndim = shape0.size
    shp = np.empty(ndim, np.int64)
    cap = N  # the largest tensor along the chain, and the longest contraction
    kmax = 1
    for a in range(ndim):
        shp[a] = shape0[a]
    for s in range(nsteps):
        kmax = max(kmax, steps[s, 2])
        shp[steps[s, 0]] = steps[s, 1]
        size = 1
        for a in range(ndim):
            size *= shp[a]
        cap = max(cap, size)
    cur = np.empty(nb * cap, np.float64)
    nxt = np.empty(nb * cap, np.float64)
    T = np.empty((kmax, nb * cap), np.float64)
    colb = np.empty(nb * cap, np.float64)
    o = np.empty(nb * cap, np.float64)
    q1 = np.empty(nb * cap, np.float64)
    Z = np.zeros(nb * cap, np.float64)
    for t in range(t0, t1):
        b0 = t * nb
        nt = min(nb, B - b0)
        least = np.inf
        frac = 0.0
        for i in range(nt):
            x = X[b0 + i]
            c = cur[i * N: (i + 1) * N]
            eb = e[b0 + i]
            if -1000 < eb < 1000:
                sc = math.ldexp(1.0, -eb)
                for q in range(N):
                    c[q] = abs(x[q]) * sc
            else:
                k = min(max(-eb, -(1 << 20)), 1 << 20)
                for q in range(N):
                    c[q] = math.ldexp(abs(x[q]), k)
            for q in range(N):
                q1[q] = c[q] - np.floor(c[q])  # exact: whether the magnitude is an integer
            lo_i, frac_i = _extremes(x, c, q1, N)
            least = min(least, lo_i)
            frac = max(frac, frac_i)
        whole = frac == 0.0
        stats[t, 0, 0] = least
        stats[t, 0, 1] = 1.0 if whole else 0.0
        stats[t, 0, 2] = 0.0
        for a in range(ndim):
            shp[a] = shape0[a]
        for s in range(nsteps):
            ax, J, K, off, roff = steps[s, 0], steps[s, 1], steps[s, 2], steps[s, 3], steps[s, 4]
            pre = nt
            for a in range(ax):
                pre *= shp[a]
            post = 1
            for a in range(ax + 1, ndim):
                post *= shp[a]
            W = pre * post
            A = ops[off: off + J * K].reshape(J, K)
            src = cur[: pre * K * post].reshape(pre, K, post)
            dst = nxt[: pre * J * post].reshape(pre, J, post)
            lo = np.inf
            m1 = 0.0
            m2 = 0.0
            if post >= 16:  # long rows: each tensor row's dots along them, in place
                for p in range(pre):
                    Sp = src[p]
                    _column_sums(Sp, K, post, colb)
                    for j in range(J):
                        lj, a1, a2 = _row_stats(A[j], Sp, K, colb, rowsums[roff + j], dst[p, j], q1, post, Z)
                        lo, m1, m2 = min(lo, lj), max(m1, a1), max(m2, a2)
            else:  # short rows: the block's (tensor, row, column) triples as lanes, gathered
                for k in range(K):
                    Tk = T[k]
                    for p in range(pre):
                        for q in range(post):
                            Tk[p * post + q] = src[p, k, q]
                _column_sums(T, K, W, colb)
                for j in range(J):
                    lj, a1, a2 = _row_stats(A[j], T, K, colb, rowsums[roff + j], o, q1, W, Z)
                    lo, m1, m2 = min(lo, lj), max(m1, a1), max(m2, a2)
                    if s + 1 < nsteps:  # (the last step's magnitudes are not read)
                        for p in range(pre):
                            for q in range(post):
                                dst[p, j, q] = o[p * post + q]
            stats[t, s + 1, 0] = lo
            stats[t, s + 1, 1] = m1
            stats[t, s + 1, 2] = m2
            shp[ax] = J
            cur, nxt = nxt, cur


def chain_stats_warm(work: int) -> bool:
    """Whether :func:`chain_magnitude_stats` should run for ``work`` entries (:func:`~rnstensor.backends.cpu.warm.warm`:
    a small call while its kernel is cold skips the statistics, which only shortcut the full certificate)."""
    return warm(_chain_magnitude_stats_kernel, work)


def chain_magnitude_stats(X: np.ndarray, e: np.ndarray, shape: tuple, steps: list) -> np.ndarray:
    """The classical certification's data statistics of a chain in one blocked pass (no magnitude array is stored).

    ``X`` ``(B, *shape)`` float64 tensors encoded with exponents ``e`` ``(B,)``,
    ``steps`` the chain's mode products ``(axis, O)`` with ``O`` the ``J x K``
    operator magnitudes as :func:`mode_magnitudes` takes them. Returns
    ``(1 + len(steps), 3)``: row 0 the encode's smallest magnitude over the
    nonzero ``x`` and whether all are integers (as :func:`encode_magnitudes`);
    row ``s + 1`` the product's smallest positive magnitude (the value
    :func:`mode_magnitudes` gives: the same sums in the same order), and the
    largest column sum and row sum over the magnitude among the positive ones,
    from which an upper bound of its ratio follows for any weights.
    """
    X = np.ascontiguousarray(X, dtype=np.float64).reshape(X.shape[0], -1)
    e = np.ascontiguousarray(e, dtype=np.int64).reshape(-1)
    table = np.zeros((len(steps), 5), np.int64)
    ops, rows = [], []
    off = roff = 0
    for i, (axis, O) in enumerate(steps):
        O = np.ascontiguousarray(O, dtype=np.float64)
        table[i] = (axis, O.shape[0], O.shape[1], off, roff)
        ops.append(O.reshape(-1))
        rows.append(O.sum(axis=1))
        off += O.size
        roff += O.shape[0]
    cur, biggest = list(shape), X.shape[1]
    for axis, O in steps:
        cur[axis] = O.shape[0]
        biggest = max(biggest, math.prod(cur))
    nb = max(1, 2048 // max(1, biggest))  # a block's magnitudes (three arrays of nb tensors) stay in L2
    ntasks = -(-X.shape[0] // nb)
    stats = np.empty((ntasks, len(steps) + 1, 3), np.float64)
    _launch(_chain_magnitude_stats_kernel, ntasks, X.size * (len(steps) + 1), X, e, table,
            np.concatenate(ops) if ops else np.zeros(1), np.concatenate(rows) if rows else np.zeros(1),
            np.array(shape, np.int64), nb, stats)
    out = np.empty((len(steps) + 1, 3))
    out[:, 0] = stats[:, :, 0].min(axis=0)
    out[:, 1:] = stats[:, :, 1:].max(axis=0)
    out[0, 1] = stats[:, 0, 1].min()
    return out
