"""The CPU product kernels: mode products (direct, or BLAS sums reduced) and elementwise products and sums."""

from __future__ import annotations

import numpy as np
from numba import njit

from .common import _CHUNK, _FM, _borrow, _cr32, _cr64, _flat_as

__all__ = ["_product_tasks", "_product_direct", "_reduce_swap", "_elementwise"]


# ----- products -----------------------------------------------------------------------------


@njit(cache=True, nogil=True, fastmath=_FM)
def _mac_reduce(Af, T, acc, R, p, ip, h, W):
    # R[j] = [sum_k Af[j, k] T[k]]_p over W lanes. The operator is zero-padded to
    # n4 (a multiple of 4) columns and T to n4 rows, so the terms come in chains of
    # four multiply-adds; up to 8 terms need no accumulator pass, and the last
    # pass is fused with the reduction. All sums are exact integers
    # (< 2**22 - 2**8), so the grouping does not matter. What keeps it fast
    # (each measured; LLVM's choices here are fragile, so change it measuring):
    # - no loop touches more than 9 arrays: LLVM checks every pair of a written
    #   and another accessed array at run time, at most 8 checks, and otherwise
    #   leaves the loop scalar (acc + 8 rows of T + R[j] would be 9);
    # - every loop works on two independent lanes per iteration, v and v + H: one
    #   lane's chain (multiply-adds, reduction, conversion) is ~40 cycles long and
    #   the out-of-order window did not overlap enough iterations to hide it;
    # - the n4 <= 8 loops (the common operators) sit here, with their loads in
    #   their own branch: as helper functions, or with the loads hoisted, they ran
    #   ~25% slower; longer contractions go through the helpers below.
    n_out, n4 = Af.shape
    H = W // 2
    for j in range(n_out):
        Rj = R[j]
        a = Af[j]
        if n4 == 4:
            c0, c1, c2, c3 = a[0], a[1], a[2], a[3]
            T0, T1, T2, T3 = T[0], T[1], T[2], T[3]
            for v in range(H):
                w = v + H
                s = c0 * T0[v]
                s += c1 * T1[v]
                s += c2 * T2[v]
                s += c3 * T3[v]
                t = c0 * T0[w]
                t += c1 * T1[w]
                t += c2 * T2[w]
                t += c3 * T3[w]
                Rj[v] = np.int8(_cr32(s, p, ip, h))
                Rj[w] = np.int8(_cr32(t, p, ip, h))
            for w in range(2 * H, W):
                t = c0 * T0[w]
                t += c1 * T1[w]
                t += c2 * T2[w]
                t += c3 * T3[w]
                Rj[w] = np.int8(_cr32(t, p, ip, h))
        elif n4 == 8:
            T0 = T[0]; T1 = T[1]; T2 = T[2]; T3 = T[3]; T4 = T[4]; T5 = T[5]; T6 = T[6]; T7 = T[7]
            c0 = a[0]; c1 = a[1]; c2 = a[2]; c3 = a[3]; c4 = a[4]; c5 = a[5]; c6 = a[6]; c7 = a[7]
            for v in range(H):
                w = v + H
                s = c0 * T0[v]
                s += c1 * T1[v]
                s += c2 * T2[v]
                s += c3 * T3[v]
                u = c4 * T4[v]
                u += c5 * T5[v]
                u += c6 * T6[v]
                u += c7 * T7[v]
                s2 = c0 * T0[w]
                s2 += c1 * T1[w]
                s2 += c2 * T2[w]
                s2 += c3 * T3[w]
                u2 = c4 * T4[w]
                u2 += c5 * T5[w]
                u2 += c6 * T6[w]
                u2 += c7 * T7[w]
                Rj[v] = np.int8(_cr32(s + u, p, ip, h))
                Rj[w] = np.int8(_cr32(s2 + u2, p, ip, h))
            for v in range(2 * H, W):
                s = c0 * T0[v] + c1 * T1[v] + c2 * T2[v] + c3 * T3[v] + c4 * T4[v] + c5 * T5[v] + c6 * T6[v] + c7 * T7[v]
                Rj[v] = np.int8(_cr32(s, p, ip, h))
        else:
            # longer contractions: four terms per pass, summed as a tree, through acc
            k = n4 - n4  # (a computed 0: a literal would compile another specialization)
            while n4 - k > 4:
                _mac4_acc(a, T, k, acc, W)
                k += 4
            _mac4_acc_reduce(a, T, k, acc, Rj, p, ip, h, W)


@njit(cache=True, nogil=True, fastmath=_FM)
def _mac4_acc(a, T, k, acc, W):
    # acc (+)= terms k .. k+3 (= for k == 0). One lane per iteration and a tree of four
    # products: with acc both read and written, LLVM cannot tell two lane
    # streams apart, and this form measured fastest for long contractions.
    c0, c1, c2, c3 = a[k], a[k + 1], a[k + 2], a[k + 3]
    T0, T1, T2, T3 = T[k], T[k + 1], T[k + 2], T[k + 3]
    if k > 0:
        for v in range(W):
            acc[v] += (c0 * T0[v] + c1 * T1[v]) + (c2 * T2[v] + c3 * T3[v])
    else:
        for v in range(W):
            acc[v] = (c0 * T0[v] + c1 * T1[v]) + (c2 * T2[v] + c3 * T3[v])


@njit(cache=True, nogil=True, fastmath=_FM)
def _mac4_acc_reduce(a, T, k, acc, Rj, p, ip, h, W):
    # Rj = [acc + terms k .. k+3]_p
    c0, c1, c2, c3 = a[k], a[k + 1], a[k + 2], a[k + 3]
    T0, T1, T2, T3 = T[k], T[k + 1], T[k + 2], T[k + 3]
    for v in range(W):
        Rj[v] = np.int8(_cr32(acc[v] + ((c0 * T0[v] + c1 * T1[v]) + (c2 * T2[v] + c3 * T3[v])), p, ip, h))


# Layout moves of the direct product. A task's block is rows a0 .. a1 of `pre`
# times a tile [t0, t1) of `post`; the MAC wants it as n_in rows T[k] of W
# float32 lanes (lane = (a - a0) * tl + t) and writes n_out rows R[j] of W int8
# lanes. When the contracted axis is the last one (post == 1) those are
# transposes with runs of one byte: strided byte loops, scalar and several
# times the cost of the MAC. There, if n_in is a multiple of 8, every row's
# residues k = 8g .. 8g+7 are one int64 word (Xw: the tensor as words, see
# _flat_as), and T[8g + i] is byte i of the rows' words g: a shift, a
# truncation to int8 and a conversion, one vectorized loop per byte
# (_unpack_rows; the words are made contiguous first when a row has several).
# The scatter packs 8 rows R[j] into words the same way (_pack_rows). Other
# shapes convert straight into T and copy bytes straight out.
# (Word moves for other small shapes, e.g. post = 8 runs or several rows per
# word, measured faster still but cost ~4 s of cold compile time.)


@njit(cache=True, nogil=True)
def _unpack_rows(src, T, k0, W):
    # T[k0 + i, b] = byte i of the word src[b], sign-extended
    for i in range(8):
        Ti = T[k0 + i]
        s = 8 * i
        for b in range(W):
            Ti[b] = np.float32(np.int8(src[b] >> s))


@njit(cache=True, nogil=True)
def _pack_rows(R, j0, dst, W):
    # dst[b] = the int64 word of bytes R[j0 .. j0 + 7, b]
    R0 = R[j0]
    R1 = R[j0 + 1]
    R2 = R[j0 + 2]
    R3 = R[j0 + 3]
    R4 = R[j0 + 4]
    R5 = R[j0 + 5]
    R6 = R[j0 + 6]
    R7 = R[j0 + 7]
    for b in range(W):
        lo = (np.int64(np.uint8(R0[b])) | (np.int64(np.uint8(R1[b])) << 8)
              | (np.int64(np.uint8(R2[b])) << 16) | (np.int64(np.uint8(R3[b])) << 24))
        hi = (np.int64(np.uint8(R4[b])) | (np.int64(np.uint8(R5[b])) << 8)
              | (np.int64(np.uint8(R6[b])) << 16) | (np.int64(np.uint8(R7[b])) << 24))
        dst[b] = lo | (hi << 32)


@njit(cache=True, nogil=True)
def _gather_rows(Xl, Xw, l, a0, a1, t0, t1, S, T):
    # T[k, (a - a0) * tl + t] = Xl[a, k, t0 + t] as float32 (tl = t1 - t0); Xl is
    # plane l, Xw the whole tensor as words, S word scratch
    pre, n_in, post = Xl.shape
    tl = t1 - t0
    nr = a1 - a0
    if post == 1 and n_in % 8 == 0:
        nw = n_in // 8
        w0 = (l * pre + a0) * nw
        for g in range(nw):
            if nw == 1:
                src = Xw[w0 : w0 + nr]
            else:
                src = S[:nr]
                for b in range(nr):
                    src[b] = Xw[w0 + g + b * nw]
            _unpack_rows(src, T, 8 * g, nr)
        return
    if tl == 1:
        for k in range(n_in):
            Tk = T[k]
            Xk = Xl[a0:a1, k, t0]
            for b in range(nr):
                Tk[b] = np.float32(Xk[b])
        return
    if tl == 8 and post % 8 == 0 and t0 % 8 == 0:
        # rows of one word (post = 8): the words of T[k] gathered by a plain strided int64 copy, then converted
        # as one run (longer rows convert fastest straight, below)
        pw = post // 8
        stride = n_in * pw
        Sb = _flat_as(S, np.int8)
        for k in range(n_in):
            src0 = ((l * pre + a0) * n_in + k) * pw + t0 // 8
            for a in range(nr):
                S[a] = Xw[src0 + a * stride]
            Tk = T[k]
            for b in range(nr * 8):
                Tk[b] = np.float32(Sb[b])
        return
    for a in range(a0, a1):
        o = (a - a0) * tl
        Xa = Xl[a]
        for k in range(n_in):
            Tk = T[k, o : o + tl]
            Xak = Xa[k, t0:t1]
            for t in range(tl):
                Tk[t] = np.float32(Xak[t])


@njit(cache=True, nogil=True)
def _scatter_rows(R, Ol, Ow, l, a0, a1, t0, t1, S):
    # Ol[a, j, t0 + t] = R[j, (a - a0) * tl + t], the inverse of _gather_rows
    pre, n_out, post = Ol.shape
    tl = t1 - t0
    nr = a1 - a0
    if post == 1 and n_out % 8 == 0:
        nw = n_out // 8
        w0 = (l * pre + a0) * nw
        for g in range(nw):
            dst = Ow[w0 : w0 + nr] if nw == 1 else S[:nr]
            _pack_rows(R, 8 * g, dst, nr)
            if nw > 1:
                for b in range(nr):
                    Ow[w0 + g + b * nw] = dst[b]
        return
    if tl == 1:
        for j in range(n_out):
            Oj = Ol[a0:a1, j, t0]
            Rj = R[j]
            for b in range(nr):
                Oj[b] = Rj[b]
        return
    if tl == 8 and post % 8 == 0 and t0 % 8 == 0:
        # rows of one word: each row of R as words, copied to their strided places
        pw = post // 8
        stride = n_out * pw
        for j in range(n_out):
            Rw = _flat_as(R[j], np.int64)
            dst0 = ((l * pre + a0) * n_out + j) * pw + t0 // 8
            for a in range(nr):
                Ow[dst0 + a * stride] = Rw[a]
        return
    for a in range(a0, a1):
        o = (a - a0) * tl
        Oa = Ol[a]
        for j in range(n_out):
            Rj = R[j, o : o + tl]
            Oaj = Oa[j, t0:t1]
            for t in range(tl):
                Oaj[t] = Rj[t]


@njit(cache=True, nogil=True)
def _product_tasks(L, pre, n_in, post):
    # (Ba, tw, tasks) of _product_direct: Ba rows of `pre` times a tile of tw columns of `post` per task. Lanes per
    # task enough to amortize loop overhead, T kept within 16-32 KiB (L1), a multiple of 8 so that tiles of a long
    # `post` are whole int64 words. Short rows (1 < post < 8, a FEM operator's middle axes) go one column at a
    # time, their rows as the lanes: runs of 5 or 6 bytes per row cost 1.5-2x more to gather and scatter
    V = min(512, max(256, 8192 // n_in)) // 8 * 8
    if 1 < post < 8:
        Ba, tw = V, 1
    elif post <= V:
        Ba, tw = max(1, V // post), post
    else:
        Ba, tw = 1, V
    return Ba, tw, L * ((pre + Ba - 1) // Ba) * ((post + tw - 1) // tw)


@njit(cache=True, nogil=True)
def _product_direct(A, X, pf, ipf, hf, out, Ba, tw, task0, task1):
    # X (L, pre, n_in, post) -> out (L, pre, n_out, post). A task takes Ba rows of
    # `pre` (or one row and a tile of `post`) and lays them out as T (n_in, W) so
    # every inner loop runs over many contiguous float32 lanes; float32 sums
    # of <= 192 products of <= 2**14 are exact (< 2**22 - 2**8, _cr32's range). The loops live in
    # separate functions: inlined into one body LLVM leaves some of them scalar.
    A, X, pf, ipf, hf, out = _borrow(A), _borrow(X), _borrow(pf), _borrow(ipf), _borrow(hf), _borrow(out)
    _, pre, n_in, post = X.shape
    n_out = A.shape[1]
    nt = (post + tw - 1) // tw
    nb = (pre + Ba - 1) // Ba
    Wmax = Ba * tw
    # the operator and T zero-padded to a multiple of 4 terms (see _mac_reduce)
    n4 = (n_in + 3) // 4 * 4
    Af = np.zeros((n_out, n4), np.float32)
    # rows of whole int64 words for the word moves of _gather_rows/_scatter_rows
    Wb = (Wmax + 7) // 8 * 8
    T = np.zeros((n4, Wb), np.float32)
    acc = np.empty(Wb, np.float32)
    R = np.empty((n_out, Wb), np.int8)
    S = np.empty(Wb, np.int64)
    Xw = _flat_as(X, np.int64)
    Ow = _flat_as(out, np.int64)
    lcur = -1
    for idx in range(task0, task1):
        l = idx // (nb * nt)
        r = idx - l * nb * nt
        ib = r // nt
        t0 = (r - ib * nt) * tw
        t1 = min(t0 + tw, post)
        a0 = ib * Ba
        a1 = min(a0 + Ba, pre)
        W = (a1 - a0) * (t1 - t0)
        if l != lcur:
            for j in range(n_out):
                for k in range(n_in):
                    Af[j, k] = A[l, j, k]
            lcur = l
        _gather_rows(X[l], Xw, l, a0, a1, t0, t1, S, T)
        _mac_reduce(Af, T, acc, R, pf[l], ipf[l], hf[l], W)
        _scatter_rows(R, out[l], Ow, l, a0, a1, t0, t1, S)


@njit(cache=True, nogil=True)
def _reduce_swap(Y, O, p, ip, h, task0, task1):
    # O[a, j, t] = [Y[j, a, t]]_p: the exact BLAS sums (float32 or float64,
    # |Y| < 2**48) reduced and put back in tensor order
    Y, O = _borrow(Y), _borrow(O)
    J, _, T = Y.shape
    for idx in range(task0, task1):
        a = idx // J
        j = idx - a * J
        src = Y[j, a]
        dst = O[a, j]
        for t in range(T):
            dst[t] = np.int8(_cr64(np.float64(src[t]), p, ip, h))


# ----- elementwise --------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _elementwise(A, B, pf, ipf, hf, mode, out, task0, task1):
    # A, out (L, outer, inner), B (L, inner): mode 0 product, 1 sum, 2 difference.
    # |t| <= 2**14, well inside _cr32's exact range; chunks of `inner` keep the
    # tasks even when outer is 1
    A, B, pf, ipf, hf, out = _borrow(A), _borrow(B), _borrow(pf), _borrow(ipf), _borrow(hf), _borrow(out)
    _, outer, inner = A.shape
    nch = (inner + _CHUNK - 1) // _CHUNK
    for idx in range(task0, task1):
        l = idx // (outer * nch)
        r = idx - l * outer * nch
        o = r // nch
        c0 = (r - o * nch) * _CHUNK
        c1 = min(c0 + _CHUNK, inner)
        p = pf[l]
        ip = ipf[l]
        h = hf[l]
        a = A[l, o, c0:c1]
        bb = B[l, c0:c1]
        d = out[l, o, c0:c1]
        if mode == 0:
            for i in range(c1 - c0):
                d[i] = np.int8(_cr32(np.float32(a[i]) * np.float32(bb[i]), p, ip, h))
        elif mode == 1:
            for i in range(c1 - c0):
                d[i] = np.int8(_cr32(np.float32(a[i]) + np.float32(bb[i]), p, ip, h))
        else:
            for i in range(c1 - c0):
                d[i] = np.int8(_cr32(np.float32(a[i]) - np.float32(bb[i]), p, ip, h))
