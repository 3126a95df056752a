"""The wide-moduli passes of the exact GEMM engine: modular sums, the reduction of the GEMM sums, encode and decode."""

from __future__ import annotations

from typing import Optional

import numpy as np
from numba import njit

from ...arith import alpha_parts
from . import common, decoding, encoding

__all__ = ["_LIMB", "_mod_sum", "_decode", "_residues", "_wide_encode", "_reduce_into", "_rounded_entries",
           "_lift_into"]

_LIMB = 28  # limbs of the decode's Horner: 28 bits times a modulus below 2**24 stays below 2**53


def _mod_sum(x: np.ndarray, y: np.ndarray, p: np.ndarray, h: np.ndarray, sign: float = 1.0,
             out: Optional[np.ndarray] = None) -> np.ndarray:
    """``[x + sign * y]_p`` centered, plane by plane, in one threaded pass (``|x| + |y| < 2**24``: exact), into
    ``out`` (C-ordered like ``x``, overlapping neither)."""
    L = x.shape[0]
    out = np.empty_like(x) if out is None else out
    xs, ys, os_ = (np.ascontiguousarray(v).reshape(L, -1) for v in (x, y, out))
    per = -(-xs.shape[1] // _SUM_CHUNK)
    common._launch(_mod_sum_kernel, L * per, xs.size, common._ro(xs), common._ro(ys), float(sign), p, h, os_)
    return out


_SUM_CHUNK = 1 << 15


@njit(cache=True, nogil=True)
def _mod_sum_kernel(x, y, sign, p, h, out, task0, task1):
    N = x.shape[1]
    per = (N + _SUM_CHUNK - 1) // _SUM_CHUNK
    for t in range(task0, task1):
        l = t // per
        j0 = (t - l * per) * _SUM_CHUNK
        j1 = min(j0 + _SUM_CHUNK, N)
        P = p[l]
        H = h[l]
        xl, yl, ol = x[l], y[l], out[l]
        for j in range(j0, j1):
            v = np.float64(xl[j]) + sign * np.float64(yl[j])
            v = v - P if v > H - 1 else v
            ol[j] = v + P if v < H - P else v


def _residues(acc: np.ndarray, tabs, moduli: tuple) -> np.ndarray:
    """The residues ``(len(moduli), m, n)`` int8 on the INT8 ``moduli`` (centered, as the INT8 encode gives them) of
    the product with wide residues ``acc``: its integers, for the INT8 program's own decode."""
    m, n = acc.shape[1:]
    p, ip, h, _, _, perm, C, qd = tabs
    pq, ipq, hq = common._mod_consts(tuple(moduli))[3:]
    out = np.empty((len(moduli), m, n), np.int8)
    owner = [next((g for g, w in enumerate(p) if int(w) % q == 0), -1) for q in moduli]
    if min(owner) >= 0:  # wide moduli grouped from these (gemm.onto_plan): each residue one reduction
        common._launch(_group_residues, m, m * n * len(moduli), common._ro(acc), np.asarray(owner, np.int64), pq,
                       ipq, hq, out)
        return out
    order = [int(v) for v in qd]
    Wq = np.empty((len(moduli), len(order)), np.float64)
    for j, q in enumerate(moduli):
        w = 1
        for d, r in enumerate(order):
            Wq[j, d] = (w % q) - q if w % q > q // 2 else w % q
            w *= r
    common._launch(_wide_residues, m, m * n * (perm.size + len(moduli)) * 4, common._ro(acc), perm, C, p, ip, h,
                   Wq, pq, ipq, hq, out)
    return out


def _decode(acc: np.ndarray, ea: np.ndarray, eb: np.ndarray, alpha: float, tabs, nl: int) -> np.ndarray:
    """``alpha`` times the product with residues ``acc``, correctly rounded (the program's real decode)."""
    m, n = acc.shape[1:]
    if alpha == 0:
        return np.zeros((m, n))
    p, ip, h, _, _, perm, C, qd = tabs
    ma, ex = alpha_parts(alpha)
    flimbs, t2, _ = decoding._factor_limbs(ma)
    out = np.empty((m, n), np.float64)
    common._launch(_wide_decode, m, m * n * p.size * 4, common._ro(acc), ea, eb, int(t2 + ex), flimbs, perm, C, p, ip,
                   h, qd, nl, common._P2, out)
    return np.negative(out, out=out) if alpha < 0 else out


@njit(cache=True, nogil=True)
def _wide_encode(xi, e, rows, p, ip, h, c24, pw, out, task0, task1):
    # out[l, r, :] <- [round_half_even(x * 2**e)]_p for row r of xi (IEEE bits), e per row (rows) or per column:
    # the INT8 encode's split (cpu._enc_split: v = hi * 2**24 + lo, times 2**kb), reduced in float64:
    # |hi| < 2**29 and |[hi]_p * [2^24]_p|, |r * [2^kb]_p| < 2**47, all inside _cr64's exact range
    ncol = xi.shape[1]
    L = p.size
    TW = pw.shape[1]
    hi = np.empty(common._BLOCK, np.float64)
    lo = np.empty(common._BLOCK, np.float64)
    kb = np.empty(common._BLOCK, np.int64)
    eb = np.empty(common._BLOCK, np.int64)
    mult = np.empty(common._BLOCK, np.float64)
    for r in range(task0, task1):
        row = xi[r]
        for j0 in range(0, ncol, common._BLOCK):
            W = min(common._BLOCK, ncol - j0)
            for b in range(W):
                eb[b] = e[r] if rows else e[j0 + b]
            nbig = encoding._enc_split(row[j0:j0 + W], eb, hi, lo, kb, W)
            for l in range(L):
                o = out[l, r, j0:j0 + W]
                pl, il, hl, cl = p[l], ip[l], h[l], c24[l]
                for b in range(W):
                    o[b] = common._cr64(common._cr64(hi[b], pl, il, hl) * cl + lo[b], pl, il, hl)
                if nbig == 0:
                    continue
                for b in range(W):
                    mult[b] = pw[l, min(kb[b], TW - 1)]
                for b in range(W):
                    if kb[b] >= TW:
                        mult[b] = _pow2_mod(kb[b], pl, il, hl)
                for b in range(W):
                    o[b] = common._cr64(o[b] * mult[b], pl, il, hl)


_ABS = 0x7FFFFFFFFFFFFFFF


@njit(cache=True, nogil=True)
def _rounded_entries(xi, e0):
    # the entries of xi (k x n, IEEE bits) that round_half_even(x * 2**e0_j) may round, column by column: those
    # whose last significand bit lies below 2**0 once scaled (the others are integers there, so their integer at
    # e0_j + d is the one at e0_j times 2**d exactly). Returns (colptr (n + 1), rows, bits)
    k, n = xi.shape
    count = np.zeros(n + 1, np.int64)
    for r in range(k):
        row = xi[r]
        for j in range(n):
            bits = row[j]
            if max((bits >> 52) & 2047, 1) - 1075 + e0[j] < 0 and (bits & _ABS) != 0:
                count[j + 1] += 1
    for j in range(n):
        count[j + 1] += count[j]
    rows = np.empty(count[n], np.int64)
    vals = np.empty(count[n], np.int64)
    fill = count[:n].copy()
    for r in range(k):
        row = xi[r]
        for j in range(n):
            bits = row[j]
            if max((bits >> 52) & 2047, 1) - 1075 + e0[j] < 0 and (bits & _ABS) != 0:
                rows[fill[j]] = r
                vals[fill[j]] = bits
                fill[j] += 1
    return count, rows, vals


@njit(cache=True, nogil=True)
def _lift_into(acc, A, colptr, rows, V0, Vd, m2d, p, ip, h, task0, task1):
    # acc[l, i, j] <- [[2^d]_p acc[l, i, j] + sum_s A[l, i, rows_s] D[l, s]]_p over the entries s of column j
    # (colptr), one modulus l a task: the product of A with the operand at e0 + d from its product with the operand
    # at e0. D = [Vd - 2^d V0]_p: an entry's integer at e0 + d less 2**d times the one at e0 (residues below 2**23
    # times [2^d]_p below 2**24: inside _cr64's exact range). A block of _LIFT_COLS columns at a time, held
    # transposed (a column's terms then run over all rows at once, A's plane transposed: a row of it per entry s);
    # terms below 2**46, at most 63 summed before a reduction: below 2**52, exact, and reduced as _reduce_into does
    m, n = A.shape[1], acc.shape[2]
    T = np.empty((_LIFT_COLS, m), np.float64)
    for l in range(task0, task1):
        pl, il, hl, ml = p[l], ip[l], h[l], m2d[l]
        At = np.ascontiguousarray(A[l].T)
        Dl = np.empty(V0.shape[1], np.float64)
        for s in range(Dl.size):
            Dl[s] = common._cr64(Vd[l, s] - common._cr64(V0[l, s] * ml, pl, il, hl), pl, il, hl)
        out = acc[l]
        for j0 in range(0, n, _LIFT_COLS):
            jb = min(_LIFT_COLS, n - j0)
            for i in range(m):
                for jj in range(jb):
                    T[jj, i] = np.float64(out[i, j0 + jj]) * ml
            for jj in range(jb):
                t = T[jj]
                c = 1
                for s in range(colptr[j0 + jj], colptr[j0 + jj + 1]):
                    a = At[rows[s]]
                    dv = Dl[s]
                    for i in range(m):
                        t[i] += a[i] * dv
                    c += 1
                    if c == 64:
                        for i in range(m):
                            t[i] = _reduce53(t[i], pl, il, hl)
                        c = 1
                for i in range(m):
                    t[i] = _reduce53(t[i], pl, il, hl)
            for i in range(m):
                for jj in range(jb):
                    out[i, j0 + jj] = np.float32(T[jj, i])


_LIFT_COLS = 16


@njit(inline="always", nogil=True)
def _reduce53(t, p, ip, h):
    # [t]_p centered for an integer |t| < 2**53 (see _reduce_into: the float quotient within one, the FMA remainder)
    q = np.floor(t * ip + 0.5)  # floor vectorizes (rint became a libm call)
    r = decoding._fma(-q, p, t)
    r = r - p if r > h - 1 else r
    return r + p if r < h - p else r


@njit(cache=True, nogil=True)
def _pow2_mod(e, p, ip, h):
    # [2^e]_p by squaring (products of residues below 2**46: exact in _cr64)
    r = 1.0
    base = 2.0
    while e > 0:
        if e & 1:
            r = common._cr64(r * base, p, ip, h)
        base = common._cr64(base * base, p, ip, h)
        e >>= 1
    return r


@njit(cache=True, nogil=True)
def _reduce_into(Y, acc, p, ip, h, first, task0, task1):
    # acc <- [acc + Y]_p centered (acc <- [Y]_p when first): |acc + Y| < 2**53 is an exact integer, the
    # quotient q = floor(t / p + 1/2) in floats is within one of the true one (relative error 2**-52 on
    # t / p < 2**31), and the remainder t - q p is exact through the FMA (a small integer); one step each way
    # centers it in [h - p, h - 1]. acc is float32 (exact: |r| < 2**23)
    n = Y.shape[1]
    for i in range(task0, task1):
        y = Y[i]
        a = acc[i]
        for j in range(n):
            a[j] = np.float32(_reduce53(y[j] if first else y[j] + np.float64(a[j]), p, ip, h))


@njit(cache=True, nogil=True, inline="always")
def _digits(acc, i, j0, W, perm, C, p, ip, h, D):
    # D[:, :W] <- the centered mixed-radix digits of the residues acc[:, i, j0:j0 + W], in float64 (sums of at most
    # 31 products below 2**46, one _cr64 each)
    for d in range(perm.size):
        x = acc[perm[d], i, j0:j0 + W]
        cd = C[d]
        Dd = D[d]
        pl, il, hl = p[perm[d]], ip[perm[d]], h[perm[d]]
        for b in range(W):
            Dd[b] = x[b] * cd[d]
        for q in range(d):
            cq = cd[q]
            Dq = D[q]
            for b in range(W):
                Dd[b] += cq * Dq[b]
        for b in range(W):
            Dd[b] = common._cr64(Dd[b], pl, il, hl)


@njit(cache=True, nogil=True)
def _wide_residues(acc, perm, C, p, ip, h, Wq, q, iq, hq, out, task0, task1):
    # out[:, i, :] <- the residues on the moduli q (int8, centered) of the integers with wide residues acc[:, i, :]:
    # X = sum_d D_d W_d over its centered digits, so [X]_q = [sum_d D_d [W_d]_q]_q, terms below 2**23 * 64
    L = perm.size
    n = acc.shape[2]
    D = np.empty((L, common._BLOCK), np.float64)
    for i in range(task0, task1):
        for j0 in range(0, n, common._BLOCK):
            W = min(common._BLOCK, n - j0)
            _digits(acc, i, j0, W, perm, C, p, ip, h, D)
            for j in range(q.size):
                o = out[j, i, j0:j0 + W]
                wj = Wq[j]
                qj, ij, hj = q[j], iq[j], hq[j]
                for b in range(W):
                    t = 0.0
                    for d in range(L):
                        t += D[d, b] * wj[d]
                    o[b] = np.int8(common._cr64(t, qj, ij, hj))


@njit(cache=True, nogil=True)
def _group_residues(acc, owner, q, iq, hq, out, task0, task1):
    # out[j, i, :] <- [acc[owner_j, i, :]]_q_j centered: the residues on q_j of wide residues on a multiple of q_j
    n = acc.shape[2]
    for i in range(task0, task1):
        for j in range(q.size):
            a = acc[owner[j], i]
            o = out[j, i]
            qj, ij, hj = q[j], iq[j], hq[j]
            for b in range(n):
                o[b] = np.int8(common._cr64(np.float64(a[b]), qj, ij, hj))


@njit(cache=True, nogil=True)
def _wide_decode(acc, ea, eb, eadd, flimbs, perm, C, p, ip, h, qd, nl, p2, out, task0, task1):
    # out[i, :] <- the correctly rounded decode of the residues acc[:, i, :] with exponents -(ea_i + eb_j): the
    # mixed-radix digits (_digits), the signed Horner in 28-bit limbs, the lane rounding and its scalar remainder
    # (cpu._round_exact)
    L = perm.size
    n = acc.shape[2]
    D = np.empty((L, common._BLOCK), np.float64)
    sgn = np.empty(common._BLOCK, np.float64)
    carry = np.empty(common._BLOCK, np.float64)
    Vf = np.empty((nl, common._BLOCK), np.float64)
    R = np.empty((decoding.ROUND_ROWS, common._BLOCK), np.int64)
    n30 = (_LIMB * nl + 29) // 30
    V = np.zeros(n30, np.int64)
    P = np.zeros(n30 + flimbs.size + 1, np.int64)
    e = np.empty(common._BLOCK, np.int64)
    for i in range(task0, task1):
        for j0 in range(0, n, common._BLOCK):
            W = min(common._BLOCK, n - j0)
            for b in range(W):
                e[b] = -(ea[i] + eb[j0 + b])
            _digits(acc, i, j0, W, perm, C, p, ip, h, D)
            decoding._signed_horner(D, qd, sgn, Vf, carry, W, _LIMB)
            decoding._round_exact(Vf, _LIMB, sgn, e, eadd, flimbs, 1, p2, out[i, j0:j0 + W], V, P, R, W)
