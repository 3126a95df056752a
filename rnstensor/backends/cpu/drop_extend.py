"""The CPU drop and base extension kernel: a group of drops and the restored moduli in one pass per block."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from ...basis import drop_extend_schedule
from .common import _BLOCK, _borrow, _dot_reduce, _mod_consts, _mrc_coeffs, _mrc_digits, _put_i8, _readonly

__all__ = ["_drop_extend_kernel", "_drop_extend_block", "_drop_plan"]


# ----- drop and base extension --------------------------------------------------------------


@njit(cache=True, nogil=True)
def _drop_extend_kernel(
    X, dperm, A, dpf, dip, dh, rsrc, Bc, E, rpf, ripf, rh, mperm, C, mpf, mip, mh, tsrc, Tw, tpf, tip, th,
    out, task0, task1,
):
    # g drops (Alg. 1 with q_1, ..., q_g in drop order) and the base extension,
    # one pass per block of entries, every step one _dot_reduce.
    #
    # g drops at once. Drop i replaces v_{i-1} by v_i = (v_{i-1} - r_i) / q_i with
    # r_i = [v_{i-1}]_{q_i}. By induction v_i = (v - sum_{k<=i} r_k W_k) / W_{i+1}
    # (W_k = q_1 ... q_{k-1}), so r_i = [(v - sum_{k<i} r_k W_k) W_i^{-1}]_{q_i}:
    # the r_i are exactly the centered mixed-radix digits of v over the dropped
    # moduli IN DROP ORDER (step 1, constants A), and with Q = q_1 ... q_g
    #   [v_g]_p = [ [Q^{-1}]_p x_p + sum_i [-W_i Q^{-1}]_p r_i ]_p
    # for every remaining modulus p (step 2, constants Bc and E): g + 1 terms
    # of <= 2**14, one reduction. The reference's per-drop steps compute the same
    # residues of the same integers, so the planes agree bit for bit.
    #
    # Extension: the centered digits d of v_g over the remaining moduli (even
    # modulus first, step 3), then [v_g]_t = [sum_i d_i [W'_i]_t]_t for every
    # restored modulus t (step 4, weights Tw, centered): the reference reduces
    # after every term, but the centered residue of the same sum is unique.
    # (All arrays borrowed: see _borrow.)
    X, dperm, A, dpf, dip = _borrow(X), _borrow(dperm), _borrow(A), _borrow(dpf), _borrow(dip)
    dh, rsrc, Bc, E, rpf = _borrow(dh), _borrow(rsrc), _borrow(Bc), _borrow(E), _borrow(rpf)
    ripf, rh, mperm, C, mpf = _borrow(ripf), _borrow(rh), _borrow(mperm), _borrow(C), _borrow(mpf)
    mip, mh, tsrc, Tw, tpf = _borrow(mip), _borrow(mh), _borrow(tsrc), _borrow(Tw), _borrow(tpf)
    tip, th, out = _borrow(tip), _borrow(th), _borrow(out)
    N = X.shape[1]
    g, m = dperm.size, mperm.size
    Dd = np.empty((max(g, 1), _BLOCK), np.float32)
    Dm = np.empty((max(m, 1), _BLOCK), np.float32)
    Y = np.empty((rsrc.size, _BLOCK), np.int8)
    acc = np.empty(_BLOCK, np.float32)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        _drop_extend_block(X, i0, min(_BLOCK, N - i0), dperm, A, dpf, dip, dh, rsrc, Bc, E, rpf, ripf, rh, mperm, C,
                           mpf, mip, mh, tsrc, Tw, tpf, tip, th, out, Dd, Dm, Y, acc)


@njit(cache=True, nogil=True, inline="always")
def _drop_extend_block(X, i0, W, dperm, A, dpf, dip, dh, rsrc, Bc, E, rpf, ripf, rh, mperm, C, mpf, mip, mh, tsrc, Tw,
                       tpf, tip, th, out, Dd, Dm, Y, acc):
    # columns i0 .. i0 + W of X to the same columns of out (W <= the scratch's width): the steps above, also run
    # by the fused interpreter (backends.cpu_fused)
    g = dperm.size
    nr = rsrc.size
    m = mperm.size
    T = tsrc.size
    # 1. digits r_i of v over the dropped moduli, drop order
    _mrc_digits(X, i0, W, dperm, A, dpf, dip, dh, Dd, acc)
    # 2. the remaining planes of v_g
    for j in range(nr):
        x = X[rsrc[j], i0 : i0 + W]
        Yj = Y[j]
        if g == 0:
            for b in range(W):
                Yj[b] = x[b]
        else:
            _dot_reduce(x, Bc[j], Dd, E[j], g, rpf[j], ripf[j], rh[j], acc, W)
            _put_i8(acc, Yj, W)
    # 3. digits of v_g over the remaining moduli (only when extending)
    if m > 0:
        # (Y typed read-only and a computed 0: the same specialization as step 1)
        _mrc_digits(_readonly(Y), W - W, W, mperm, C, mpf, mip, mh, Dm, acc)
    # 4. the output planes: kept ones copied, restored ones from the digits
    for t in range(T):
        o = out[t, i0 : i0 + W]
        s = tsrc[t]
        if s >= 0:
            Ys = Y[s]
            for b in range(W):
                o[b] = Ys[b]
        else:
            _dot_reduce(X[0, i0 : i0 + W], np.float32(0.0), Dm, Tw[t], m, tpf[t], tip[t], th[t], acc, W)
            _put_i8(acc, o, W)


def _padded(rows, n: int, width: int) -> np.ndarray:
    """Rows of exact small integers as a float32 ``(n, max(width, 1))`` table, zero-padded."""
    out = np.zeros((n, max(width, 1)), np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@lru_cache(maxsize=512)
def _drop_plan(active: tuple[int, ...], basis: tuple[int, ...], order: tuple[int, ...], extend: bool):
    """Host tables for one drop_extend call (see _drop_extend_kernel): all exact, centered, float32."""
    sc = drop_extend_schedule(active, basis, order, extend)
    dperm, alive, rem, morder, mperm, tsrc, targets = sc.dperm, sc.alive, sc.rem, sc.morder, sc.mperm, sc.tsrc, sc.targets
    out_active = sc.out_active
    Bc = np.array(sc.Bc, np.float32)
    E = _padded(sc.E, len(rem), len(order))
    Tw = _padded(sc.Tw, len(targets), len(morder))
    tabs = (np.array(dperm, np.int64), _mrc_coeffs(order), *_mod_consts(order)[:3],
            np.array(alive, np.int64), Bc, E, *_mod_consts(rem)[:3],
            np.array(mperm, np.int64), _mrc_coeffs(morder), *_mod_consts(morder)[:3],
            np.array(tsrc, np.int64), Tw, *_mod_consts(targets)[:3])
    for a in tabs:
        a.setflags(write=False)
    return tabs, out_active
