"""The CPU backend: numpy for layout and BLAS, numba for fused exact residue kernels."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numba
import numpy as np
from numba import njit

from .. import arith
from ..basis import Basis, mrc_order

__all__ = ["CpuBackend"]

# Exactness of the modular reductions below (p <= 256 throughout):
#
# _cr32(t) for an integer-valued float32 |t| <= 2**22: ip = fl(1/p) and the
# product t*ip carry relative errors below 2**-24 each, so |t*ip - t/p| <= 1/6
# for p >= 3 (and 0 for p = 2, where ip is exact). Adding and subtracting
# 1.5*2**23 rounds that to an integer q (valid while |q| < 2**22) with
# |q - t/p| < 2/3, so c = t - q*p is exact (|q*p| < 2**24) and lies in
# (-2p/3, 2p/3); one conditional +-p lands it in [h - p, h - 1], h = ceil(p/2).
# _cr64 is the same in float64, exact for |t| <= 2**48.
_R32 = np.float32(12582912.0)
_R64 = 6755399441055744.0
# Contraction (FMA) only ever removes a rounding from the bounds above, so the
# product kernels may use it; decode's Horner must not (the reference rounds twice).
_FM = {"contract"}
_MASK30 = (1 << 30) - 1
_TWO_40 = 2.0**40
_TWO_M40 = 2.0**-40
_MASK52 = (1 << 52) - 1
_HIDDEN = 1 << 52
# entries per block in the per-entry kernels (encode, drop/extend, decode):
# small enough that every plane of a block stays in L1/L2 between passes
_BLOCK = 512
# entries per task in hadamard/add (one plane at a time, so longer runs pay)
_CHUNK = 2048
# below this many entries per thread, threads cost more than they save
_MIN_WORK = 1 << 16
# largest contraction the direct kernel takes (it wins over BLAS up to ~128-192
# terms); past 256 terms its float32 sums would exceed _cr32's exact range
_DIRECT_MAX_K = 192
# float32 BLAS is exact while partial sums stay <= 2**24: 1024 terms of <= 2**14
_BLAS_CHUNK = 1024


_POOL: list = []
# a forked child inherits the pool object but not its threads: start afresh
os.register_at_fork(after_in_child=_POOL.clear)


def _nthreads() -> int:
    return max(1, int(numba.config.NUMBA_NUM_THREADS))


def _launch(kernel, ntasks: int, work: int, *args) -> None:
    """Run ``kernel(*args, t0, t1)`` over tasks ``[0, ntasks)``, split across threads.

    The kernels are serial and release the GIL, so plain threads give the
    parallelism; numba's own parallel=True would triple the compile time.
    ``work`` (entries touched) keeps small calls on the calling thread.
    """
    nth = min(_nthreads(), ntasks, max(1, work // _MIN_WORK))
    if nth <= 1:
        kernel(*args, 0, ntasks)
        return
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=_nthreads(), thread_name_prefix="rnstensor-cpu"))
    cuts = [ntasks * i // nth for i in range(nth + 1)]
    futures = [_POOL[0].submit(kernel, *args, cuts[i], cuts[i + 1]) for i in range(1, nth)]
    kernel(*args, cuts[0], cuts[1])
    for f in futures:
        f.result()


# ----- scalar helpers -----------------------------------------------------------------------


@njit(inline="always", nogil=True)
def _cr32(t, p, ip, h):
    q = (t * ip + _R32) - _R32
    c = t - q * p
    if c >= h:
        c -= p
    elif c < h - p:
        c += p
    return c


@njit(inline="always", nogil=True)
def _cr64(t, p, ip, h):
    q = (t * ip + _R64) - _R64
    c = t - q * p
    if c >= h:
        c -= p
    elif c < h - p:
        c += p
    return c


@njit(nogil=True, cache=True)
def _ldexp(y, e, p2):
    # y * 2**e rounds once, exactly like ldexp, whenever 2**e is representable
    # (e >= -1074, subnormal powers included); the table lookup beats a libm call
    if -1074 <= e <= 1023:
        return y * p2[e + 1074]
    if e > 4000:
        e = 4000
    elif e < -4000:
        e = -4000
    return math.ldexp(y, e)


@njit(nogil=True, cache=True)
def _bitlen(x):
    # bit length of 0 <= x < 2**32 by halving steps
    n = 0
    if x >= 65536:
        x >>= 16
        n += 16
    if x >= 256:
        x >>= 8
        n += 8
    if x >= 16:
        x >>= 4
        n += 4
    if x >= 4:
        x >>= 2
        n += 2
    if x >= 2:
        x >>= 1
        n += 1
    return n + x


@njit(nogil=True, cache=True)
def _bits(limbs, n, lo, cnt):
    # bits [lo, lo + cnt) (cnt <= 53) of the non-negative integer in 30-bit limbs[:n]
    res = np.int64(0)
    hi = lo + cnt
    li = lo // 30
    while li < n and 30 * li < hi:
        base = 30 * li
        v = limbs[li]
        if base < lo:
            v >>= lo - base
            pos = 0
            nbit = min(base + 30, hi) - lo
        else:
            pos = base - lo
            nbit = min(base + 30, hi) - base
        v &= (np.int64(1) << nbit) - 1
        res |= v << pos
        li += 1
    return res


@njit(nogil=True, cache=True)
def _any_below(limbs, n, hi):
    # whether any of bits [0, hi) is set
    li = 0
    while li < n and 30 * li < hi:
        v = limbs[li]
        top = hi - 30 * li
        if top < 30:
            v &= (np.int64(1) << top) - 1
        if v != 0:
            return True
        li += 1
    return False


@njit(inline="always", nogil=True)
def _mrc_block(R, perm, minv, qf, qip, qh, U, tmp, W):
    # centered mixed-radix digits of a block: U[i] <- digit i in conversion order.
    # |U_j - U_i| <= 255 and the inverse < 256, so every product is < 2**16 (exact).
    # Digit i is read from a separate buffer: two rows of one array defeat
    # LLVM's alias analysis and the loop would stay scalar (4x slower)
    m = perm.size
    for i in range(m):
        src = R[perm[i]]
        Ui = U[i]
        for b in range(W):
            Ui[b] = src[b]
    for i in range(m):
        Ui = U[i]
        for b in range(W):
            tmp[b] = Ui[b]
        for j in range(i + 1, m):
            c = minv[i, j]
            p = qf[j]
            ip = qip[j]
            h = qh[j]
            Uj = U[j]
            for b in range(W):
                Uj[b] = _cr32((Uj[b] - tmp[b]) * c, p, ip, h)


@njit(inline="always", nogil=True)
def _load_block(X, i0, W, R):
    for l in range(X.shape[0]):
        src = X[l, i0 : i0 + W]
        dst = R[l]
        for b in range(W):
            dst[b] = np.float32(src[b])


# ----- encode -------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _enc_split(xi, e, hi, lo, sg, kb, W):
    # x * 2**e = m * 2**k from the IEEE fields. k > 0: an integer already,
    # residues [m]_p [2^k]_p; k <= 0: v = round_half_even(m / 2**-k) by integer
    # shifts. Either way the residues of round_half_even(x * 2**e) come out, as
    # in the reference (whose split point differs for subnormal x, but both of
    # its paths are exact too). Branch-free so that the loop vectorizes.
    nbig = 0
    for b in range(W):
        bits = xi[b]
        ef = (bits >> 52) & 2047
        m = (bits & _MASK52) | (_HIDDEN if ef != 0 else 0)
        k = max(ef, 1) - 1075 + e[b]
        # shifts past 62 leave 0 (m < 2**53), as would the exact rounding
        sh = min(max(-k, 0), 62)
        v = m >> sh
        rem = m - (v << sh)
        half = (np.int64(1) << sh) >> 1
        up = sh > 0 and (rem > half or (rem == half and (v & 1) == 1))
        v += 1 if up else 0
        big = k > 0
        nbig += 1 if big else 0
        kb[b] = k if big else 0
        # v < 2**53 in int32-sized halves (AVX2 converts those to float64):
        # hi*[2^24]_p + lo < 2**38, well inside _cr64's range
        hi[b] = np.float64(np.int32(v >> 24))
        lo[b] = np.float64(np.int32(v & 16777215))
        sg[b] = -1.0 if bits < 0 else 1.0
    return nbig


@njit(cache=True, nogil=True)
def _enc_small(hi, lo, sg, o, p, ip, h, c, W):
    for b in range(W):
        r = _cr64(hi[b] * c + lo[b], p, ip, h) * sg[b]
        if r >= h:
            r -= p
        o[b] = np.int8(r)


@njit(cache=True, nogil=True)
def _enc_big(hi, lo, sg, kb, pwl, o, p, ip, h, c, W):
    # [2^0]_p = 1 and _cr64 is idempotent, so entries with k <= 0 pass through
    TW = pwl.size
    for b in range(W):
        r = _cr64(hi[b] * c + lo[b], p, ip, h)
        r = _cr64(r * pwl[min(kb[b], TW - 1)], p, ip, h) * sg[b]
        if r >= h:
            r -= p
        o[b] = np.int8(r)


@njit(cache=True, nogil=True)
def _encode_kernel(xi, ev, pf, ipf, hf, c24, pw, pa, pper, out, task0, task1):
    # The hot loops live in separate small functions: inside one large body
    # LLVM left them scalar (4-5x slower)
    N = xi.size
    L = pf.size
    TW = pw.shape[1]
    hi = np.empty(_BLOCK, np.float64)
    lo = np.empty(_BLOCK, np.float64)
    sg = np.empty(_BLOCK, np.float64)
    kb = np.empty(_BLOCK, np.int64)
    eb = np.empty(_BLOCK, np.int64)
    if ev.size == 1:
        eb[:] = ev[0]
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        e = eb if ev.size == 1 else ev[i0 : i0 + W]
        nbig = _enc_split(xi[i0 : i0 + W], e, hi, lo, sg, kb, W)
        huge = False
        if nbig > 0:
            for b in range(W):
                if kb[b] >= TW:
                    huge = True
        for l in range(L):
            o = out[l, i0 : i0 + W]
            if nbig == 0:
                _enc_small(hi, lo, sg, o, pf[l], ipf[l], hf[l], c24[l], W)
                continue
            _enc_big(hi, lo, sg, kb, pw[l], o, pf[l], ipf[l], hf[l], c24[l], W)
            if huge:
                # beyond the table: 2^k is periodic mod p once k passes its 2-adic part
                a = pa[l]
                per = pper[l]
                p = pf[l]
                ip = ipf[l]
                h = hf[l]
                for b in range(W):
                    k = kb[b]
                    if k >= TW:
                        r = _cr64(hi[b] * c24[l] + lo[b], p, ip, h)
                        r = _cr64(r * pw[l, a + (k - a) % per], p, ip, h) * sg[b]
                        if r >= h:
                            r -= p
                        o[b] = np.int8(r)


@lru_cache(maxsize=64)
def _pow2_tables(moduli: tuple[int, ...], width: int):
    """``[2^k]_p`` for ``k < width`` (float64), with the 2-adic offset and period for larger ``k``."""
    L = len(moduli)
    pa = np.zeros(L, np.int64)
    per = np.ones(L, np.int64)
    base = 1
    for i, p in enumerate(moduli):
        a = (p & -p).bit_length() - 1
        o = p >> a
        t = 1
        if o > 1:
            x = 2 % o
            while x != 1:
                x = (x * 2) % o
                t += 1
        pa[i] = a
        per[i] = t
        base = max(base, a + t)
    width = max(width, base)
    tab = np.empty((L, width), np.float64)
    for i, p in enumerate(moduli):
        v = 1 % p
        for k in range(width):
            tab[i, k] = v
            v = (v * 2) % p
    c24 = np.array([pow(2, 24, p) for p in moduli], np.float64)
    for a in (tab, pa, per, c24):
        a.setflags(write=False)
    return tab, pa, per, c24


@lru_cache(maxsize=256)
def _mod_consts(moduli: tuple[int, ...]):
    """Per-modulus ``p``, ``fl(1/p)`` and ``ceil(p/2)`` in float32 and float64."""
    p = np.array(moduli, np.float64)
    h = np.array([(q + 1) // 2 for q in moduli], np.float64)
    out = (p.astype(np.float32), (np.float32(1.0) / p.astype(np.float32)), h.astype(np.float32), p, 1.0 / p, h)
    for a in out:
        a.setflags(write=False)
    return out


def _exponent_vector(exponent, shape) -> np.ndarray:
    e = np.asarray(exponent, dtype=np.int64)
    if np.broadcast_shapes(e.shape, shape) != tuple(shape):
        raise ValueError(f"exponent of shape {e.shape} does not broadcast to the tensor shape {tuple(shape)}")
    if e.size == 1:
        return _ro(e.reshape(1).copy())
    return _ro(np.ascontiguousarray(np.broadcast_to(e, shape)).reshape(-1))


# ----- products -----------------------------------------------------------------------------


@njit(cache=True, nogil=True, fastmath=_FM)
def _mac_reduce(Af, T, acc, R, p, ip, h, W):
    # R[j] = [sum_k Af[j, k] T[k]]_p over W lanes; four terms per pass, so one
    # accumulator load/store per 32 multiply-adds
    n_out, n_in = Af.shape
    for j in range(n_out):
        k = 0
        if n_in % 2 == 1:
            c0 = Af[j, 0]
            T0 = T[0]
            for v in range(W):
                acc[v] = c0 * T0[v]
            k = 1
        else:
            for v in range(W):
                acc[v] = 0
        while k + 4 <= n_in:
            c0 = Af[j, k]
            c1 = Af[j, k + 1]
            c2 = Af[j, k + 2]
            c3 = Af[j, k + 3]
            T0 = T[k]
            T1 = T[k + 1]
            T2 = T[k + 2]
            T3 = T[k + 3]
            for v in range(W):
                acc[v] += (c0 * T0[v] + c1 * T1[v]) + (c2 * T2[v] + c3 * T3[v])
            k += 4
        Rj = R[j]
        if k < n_in:
            # the last two terms fused with the reduction
            c0 = Af[j, k]
            c1 = Af[j, k + 1]
            T0 = T[k]
            T1 = T[k + 1]
            for v in range(W):
                Rj[v] = np.int8(_cr32(acc[v] + (c0 * T0[v] + c1 * T1[v]), p, ip, h))
        else:
            for v in range(W):
                Rj[v] = np.int8(_cr32(acc[v], p, ip, h))


@njit(cache=True, nogil=True)
def _gather_rows(Xl, a0, a1, t0, t1, T):
    # T[k, (a - a0) * tl + t] = Xl[a, k, t0 + t] as float32
    n_in = Xl.shape[1]
    tl = t1 - t0
    if tl == 1:
        for k in range(n_in):
            Tk = T[k]
            Xk = Xl[a0:a1, k, t0]
            for b in range(a1 - a0):
                Tk[b] = np.float32(Xk[b])
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
def _scatter_rows(R, Ol, a0, a1, t0, t1):
    # Ol[a, j, t0 + t] = R[j, (a - a0) * tl + t]
    n_out = Ol.shape[1]
    tl = t1 - t0
    if tl == 1:
        for j in range(n_out):
            Oj = Ol[a0:a1, j, t0]
            Rj = R[j]
            for b in range(a1 - a0):
                Oj[b] = Rj[b]
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
def _product_direct(A, X, pf, ipf, hf, out, Ba, tw, task0, task1):
    # X (L, pre, n_in, post) -> out (L, pre, n_out, post). A task takes Ba rows of
    # `pre` (or one row and a tile of `post`) and lays them out as T (n_in, W) so
    # every inner loop runs over many contiguous float32 lanes; float32 sums
    # of <= 256 products of <= 2**14 are exact (< 2**22). The loops live in
    # separate functions: inlined into one body LLVM leaves some of them scalar.
    _, pre, n_in, post = X.shape
    n_out = A.shape[1]
    nt = (post + tw - 1) // tw
    nb = (pre + Ba - 1) // Ba
    Wmax = Ba * tw
    Af = np.empty((n_out, n_in), np.float32)
    T = np.empty((n_in, Wmax), np.float32)
    acc = np.empty(Wmax, np.float32)
    R = np.empty((n_out, Wmax), np.int8)
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
        _gather_rows(X[l], a0, a1, t0, t1, T)
        _mac_reduce(Af, T, acc, R, pf[l], ipf[l], hf[l], W)
        _scatter_rows(R, out[l], a0, a1, t0, t1)


@njit(cache=True, nogil=True)
def _reduce_swap(Y, O, p, ip, h, task0, task1):
    # O[a, j, t] = [Y[j, a, t]]_p: the exact BLAS sums (float32 or float64,
    # |Y| < 2**48) reduced and put back in tensor order
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


# ----- drop and base extension --------------------------------------------------------------


@njit(cache=True, nogil=True)
def _drop_extend_kernel(
    X, pf, ipf, hf, dq, dinv, dal, perm, minv, qf, qip, qh, src, tf, tip, th, tw, out, task0, task1
):
    # One pass per block of entries: every plane of the block is loaded once, the
    # drops run in registers/L1, and the mixed-radix digits are shared by every
    # restored modulus. Extension sums |digit| * weight < 2**15 over <= 49 digits
    # (< 2**21) and reduces once: the reference's per-step reductions give the
    # same centered residue.
    L, N = X.shape
    drops = dq.size
    m = perm.size
    T = src.size
    need_mrc = False
    for t in range(T):
        if src[t] < 0:
            need_mrc = True
    R = np.empty((L, _BLOCK), np.float32)
    U = np.empty((m, _BLOCK), np.float32)
    acc = np.empty(_BLOCK, np.float32)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _load_block(X, i0, W, R)
        for d in range(drops):
            # the dropped plane goes to its own buffer, as in _mrc_block
            Rq = R[dq[d]]
            for b in range(W):
                acc[b] = Rq[b]
            for j in range(L):
                if dal[d, j]:
                    c = dinv[d, j]
                    p = pf[j]
                    ip = ipf[j]
                    h = hf[j]
                    Rj = R[j]
                    for b in range(W):
                        Rj[b] = _cr32((Rj[b] - acc[b]) * c, p, ip, h)
        if need_mrc:
            _mrc_block(R, perm, minv, qf, qip, qh, U, acc, W)
        for t in range(T):
            o = out[t, i0 : i0 + W]
            s = src[t]
            if s >= 0:
                Rs = R[s]
                for b in range(W):
                    o[b] = np.int8(Rs[b])
            else:
                for b in range(W):
                    acc[b] = 0
                for i in range(m):
                    w = tw[i, t]
                    Ui = U[i]
                    for b in range(W):
                        acc[b] += Ui[b] * w
                p = tf[t]
                ip = tip[t]
                h = th[t]
                for b in range(W):
                    o[b] = np.int8(_cr32(acc[b], p, ip, h))


@lru_cache(maxsize=512)
def _drop_plan(active: tuple[int, ...], basis: tuple[int, ...], order: tuple[int, ...], extend: bool):
    """Host tables for one drop_extend call: the drop schedule, MRC inverses and radix weights."""
    L = len(active)
    drops = len(order)
    D = max(drops, 1)
    dq = np.zeros(drops, np.int64)
    dinv = np.zeros((D, L), np.float32)
    dal = np.zeros((D, L), np.bool_)
    alive = list(range(L))
    for d, q in enumerate(order):
        vals = [active[i] for i in alive]
        if q not in vals:
            raise ValueError(f"drop_extend: cannot drop modulus {q}: it is not among the active moduli {tuple(vals)}")
        iq = alive[vals.index(q)]
        dq[d] = iq
        for j in alive:
            if j != iq:
                dinv[d, j] = pow(q, -1, active[j])
                dal[d, j] = True
        alive.remove(iq)
    rem = tuple(active[i] for i in alive)
    if extend:
        targets = tuple(basis)
        src = [alive[rem.index(p)] if p in rem else -1 for p in targets]
        order = mrc_order(rem)
        perm = [alive[rem.index(q)] for q in order]
        out_active = tuple(basis)
    else:
        targets = rem
        src = list(alive)
        order = ()
        perm = []
        out_active = rem
    m = len(order)
    minv = np.zeros((m, m), np.float32)
    for i in range(m):
        for j in range(i + 1, m):
            minv[i, j] = pow(order[i], -1, order[j])
    tw = np.zeros((m, len(targets)), np.float32)
    for t, p in enumerate(targets):
        if src[t] < 0:
            w = 1
            for i in range(m):
                tw[i, t] = w % p
                w *= order[i]
    pf, ipf, hf = _mod_consts(tuple(active))[:3]
    qf, qip, qh = _mod_consts(tuple(order))[:3]
    tf, tip, th = _mod_consts(tuple(targets))[:3]
    tabs = (pf, ipf, hf, dq, dinv, dal, np.array(perm, np.int64), minv, qf, qip, qh,
            np.array(src, np.int64), tf, tip, th, tw)
    for a in tabs:
        a.setflags(write=False)
    return tabs, out_active


# ----- decode -------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _decode_fp64_kernel(X, perm, minv, qf, qip, qh, qd, f, ev, k, p2, out, task0, task1):
    # no fastmath here: the reference rounds q*V and +d separately
    L, N = X.shape
    m = perm.size
    scalar_e = ev.size == 1
    e0 = ev[0] + k
    tmp64 = np.empty(_BLOCK, np.float64)
    R = np.empty((L, _BLOCK), np.float32)
    U = np.empty((m, _BLOCK), np.float32)
    tmp = np.empty(_BLOCK, np.float32)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _load_block(X, i0, W, R)
        _mrc_block(R, perm, minv, qf, qip, qh, U, tmp, W)
        V = tmp64
        Um = U[m - 1]
        for b in range(W):
            V[b] = np.float64(Um[b])
        for j in range(m - 2, -1, -1):
            q = qd[j]
            Uj = U[j]
            for b in range(W):
                V[b] = q * V[b] + np.float64(Uj[b])
        o = out[i0 : i0 + W]
        if scalar_e and -1074 <= e0 <= 1023:
            # one exact power of two for the block: the product rounds once, as ldexp does
            s = p2[e0 + 1074]
            for b in range(W):
                o[b] = (V[b] * f) * s
            continue
        for b in range(W):
            e = (ev[0] if scalar_e else ev[i0 + b]) + k
            if e < -1048576:
                e = -1048576
            elif e > 1048576:
                e = 1048576
            o[b] = _ldexp(V[b] * f, e, p2)


@njit(cache=True, nogil=True)
def _signed_horner(U, qd, sgn, Vf, carry, W):
    # s*v for a block, s the sign of v, in base-2**40 limbs held in float64:
    # limb * q + carry < 2**49 and floor() splits it exactly, so every step is
    # exact and vectorizes across entries. The top nonzero centered digit
    # outweighs all lower ones, so it carries the sign and every Horner prefix
    # of s*v is >= 0: the limbs stay normalized in [0, 2**40).
    m = U.shape[0]
    nl = Vf.shape[0]
    for b in range(W):
        sgn[b] = 0.0
    for i in range(m):
        Ui = U[i]
        for b in range(W):
            d = Ui[b]
            sgn[b] = sgn[b] if d == 0 else (1.0 if d > 0 else -1.0)
    Utop = U[m - 1]
    V0 = Vf[0]
    for b in range(W):
        V0[b] = sgn[b] * np.float64(Utop[b])
    for li in range(1, nl):
        Vl = Vf[li]
        for b in range(W):
            Vl[b] = 0.0
    for j in range(m - 2, -1, -1):
        q = qd[j]
        Uj = U[j]
        for b in range(W):
            carry[b] = sgn[b] * np.float64(Uj[b])
        for li in range(nl):
            Vl = Vf[li]
            for b in range(W):
                t = Vl[b] * q + carry[b]
                c = np.floor(t * _TWO_M40)
                Vl[b] = t - c * _TWO_40
                carry[b] = c


@njit(cache=True, nogil=True)
def _decode_exact_kernel(X, perm, minv, qf, qip, qh, qd, ev, eadd, flimbs, nl40, fsign, p2, out, task0, task1):
    # |v| (vectorized, _signed_horner), moved to 30-bit limbs in int64 (so that
    # limb * limb + carry never overflows), times the odd part of the factor
    # (its power of two joins the exponent), then rounded once to nearest-even
    # on the float64 grid of the result: 53 bits, or fewer where the result is
    # subnormal, so the final ldexp is exact or overflows
    L, N = X.shape
    m = perm.size
    nf = flimbs.size
    unit = nf == 1 and flimbs[0] == 1
    scalar_e = ev.size == 1
    n30 = (40 * nl40 + 29) // 30
    V = np.zeros(n30, np.int64)
    P = np.zeros(n30 + nf + 1, np.int64)
    R = np.empty((L, _BLOCK), np.float32)
    U = np.empty((m, _BLOCK), np.float32)
    tmp = np.empty(_BLOCK, np.float32)
    sgn = np.empty(_BLOCK, np.float64)
    carry = np.empty(_BLOCK, np.float64)
    Vf = np.empty((nl40, _BLOCK), np.float64)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _load_block(X, i0, W, R)
        _mrc_block(R, perm, minv, qf, qip, qh, U, tmp, W)
        _signed_horner(U, qd, sgn, Vf, carry, W)
        for b in range(W):
            if sgn[b] == 0.0:
                out[i0 + b] = 0.0
                continue
            for i in range(n30):
                pos = 30 * i
                li = pos // 40
                off = pos - 40 * li
                w = np.int64(Vf[li, b]) >> off
                if off > 10 and li + 1 < nl40:
                    w |= np.int64(Vf[li + 1, b]) << (40 - off)
                V[i] = w & _MASK30
            n = n30
            if unit:
                M = V
            else:
                n = n30 + nf
                for li in range(n + 1):
                    P[li] = 0
                for li in range(n30):
                    c = np.int64(0)
                    vl = V[li]
                    for lj in range(nf):
                        t = P[li + lj] + vl * flimbs[lj] + c
                        P[li + lj] = t & _MASK30
                        c = t >> 30
                    P[li + nf] += c
                M = P
            while n > 0 and M[n - 1] == 0:
                n -= 1
            nb = 30 * (n - 1) + _bitlen(M[n - 1])
            e = (ev[0] if scalar_e else ev[i0 + b]) + eadd
            if e < -(1 << 40):
                e = -(1 << 40)
            elif e > (1 << 40):
                e = 1 << 40
            shift = max(nb - 53, -1074 - e)
            if shift <= 0:
                y = _ldexp(np.float64(_bits(M, n, 0, nb)), e, p2)
            else:
                mant = _bits(M, n, shift, 53)
                if _bits(M, n, shift - 1, 1) == 1 and ((mant & 1) == 1 or _any_below(M, n, shift - 1)):
                    mant += 1
                y = _ldexp(np.float64(mant), shift + e, p2)
            out[i0 + b] = -y if sgn[b] * fsign < 0 else y


@lru_cache(maxsize=256)
def _decode_plan(active: tuple[int, ...]):
    order = mrc_order(active)
    m = len(order)
    perm = np.array([active.index(q) for q in order], np.int64)
    minv = np.zeros((m, m), np.float32)
    for i in range(m):
        for j in range(i + 1, m):
            minv[i, j] = pow(order[i], -1, order[j])
    qf, qip, qh = _mod_consts(order)[:3]
    qd = np.array(order, np.float64)
    # |v| <= P/2 < 2**bits(P): base-2**40 limbs enough for that
    nl = (math.prod(order).bit_length() + 39) // 40
    tabs = (perm, minv, qf, qip, qh, qd)
    for a in tabs:
        a.setflags(write=False)
    return tabs, nl


@lru_cache(maxsize=64)
def _factor_limbs(factor: int):
    f = abs(factor)
    t2 = (f & -f).bit_length() - 1
    odd = f >> t2
    limbs = []
    while odd:
        limbs.append(odd & _MASK30)
        odd >>= 30
    arr = np.array(limbs, np.int64)
    arr.setflags(write=False)
    return arr, t2, (1 if factor > 0 else -1)


def _pow2_array() -> np.ndarray:
    a = np.ldexp(1.0, np.arange(-1074, 1024)).astype(np.float64)
    a.setflags(write=False)
    return a


_P2 = _pow2_array()


# ----- the backend --------------------------------------------------------------------------


def _exact_matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` of int8 matrices, exactly: float32 GEMM per chunk of <= 1024 terms, chunks summed in float64."""
    n = left.shape[1]
    if n <= _BLAS_CHUNK:
        return left.astype(np.float32) @ right.astype(np.float32)
    acc = None
    for c0 in range(0, n, _BLAS_CHUNK):
        c1 = min(c0 + _BLAS_CHUNK, n)
        y = left[:, c0:c1].astype(np.float32) @ right[c0:c1].astype(np.float32)
        acc = y.astype(np.float64) if acc is None else acc + y
    return acc


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only view: numba compiles one specialization per writability, so inputs always go in read-only."""
    v = a.view()
    v.flags.writeable = False
    return v


def _planes_2d(planes: np.ndarray, L: int) -> tuple[np.ndarray, tuple[int, ...]]:
    planes = np.asarray(planes)
    if planes.dtype != np.int8:
        raise TypeError(f"planes must be int8; got {planes.dtype}")
    if planes.ndim < 1 or planes.shape[0] != L:
        raise ValueError(f"planes must have shape (L, ...) with L = {L}; got {planes.shape}")
    shape = planes.shape[1:]
    return _ro(np.ascontiguousarray(planes).reshape(L, math.prod(shape))), shape


class CpuBackend:
    """Fused numba kernels with numpy layout and float32 BLAS; bit-identical to :class:`NumpyBackend`."""

    name = "cpu"

    # ----- encode -------------------------------------------------------------------------

    def encode(self, x: np.ndarray, exponent: np.ndarray, moduli: Sequence[int], bits: int) -> np.ndarray:
        # not ascontiguousarray: it would turn a 0-d x into shape (1,)
        x = np.require(np.asarray(x, dtype=np.float64), requirements="C")
        mods = tuple(int(p) for p in moduli)
        out = np.empty((len(mods),) + x.shape, np.int8)
        ev = _exponent_vector(exponent, x.shape)
        if not mods or x.size == 0:
            return out
        # k = ef - 1075 + e <= 971 + max(e): size the direct [2^k]_p table for that
        width = 971 + int(ev.max()) + 1
        width = 1 << max(width, 1).bit_length() if width <= 8192 else 256
        tab, pa, per, c24 = _pow2_tables(mods, width)
        _, _, _, pf, ipf, hf = _mod_consts(mods)
        nblk = -(-x.size // _BLOCK)
        xi = _ro(x.reshape(-1).view(np.int64))
        args = (xi, ev, pf, ipf, hf, c24, tab, pa, per, out.reshape(len(mods), -1))
        _launch(_encode_kernel, nblk, x.size * len(mods), *args)
        return out

    # ----- products -----------------------------------------------------------------------

    def product(self, op_planes: np.ndarray, planes: np.ndarray, moduli: Sequence[int], axis: int) -> np.ndarray:
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        op = np.ascontiguousarray(op_planes)
        X = np.ascontiguousarray(planes)
        if op.dtype != np.int8 or X.dtype != np.int8:
            raise TypeError(f"product: op_planes and planes must be int8; got {op.dtype} and {X.dtype}")
        shape = X.shape[1:]
        nd = len(shape)
        if not -nd <= axis < nd:
            raise ValueError(f"product: axis {axis} is out of range for a tensor of {nd} dims")
        axis %= nd
        if op.ndim != 3 or op.shape[0] != L or X.shape[0] != L or op.shape[2] != shape[axis]:
            raise ValueError(
                f"product: need op_planes (L, n_out, n_in) and planes (L, ...) with L = {L} and "
                f"n_in = planes axis {axis}; got {op.shape} and {X.shape}"
            )
        n_out, n_in = op.shape[1], op.shape[2]
        pre = math.prod(shape[:axis])
        post = math.prod(shape[axis + 1 :])
        oshape = shape[:axis] + (n_out,) + shape[axis + 1 :]
        out = np.empty((L,) + oshape, np.int8)
        if out.size == 0:
            return out
        if n_in == 0:
            out[...] = 0
            return out
        X4 = X.reshape(L, pre, n_in, post)
        O4 = out.reshape(L, pre, n_out, post)
        pf32, ip32, h32, pf, ipf, hf = _mod_consts(mods)
        if n_in <= _DIRECT_MAX_K:
            # lanes per task: enough to amortize loop overhead, T kept within ~32 KiB
            V = int(min(1024, max(128, 8192 // n_in)))
            Ba, tw = (max(1, V // post), post) if post <= V else (1, V)
            ntasks = L * -(-pre // Ba) * -(-post // tw)
            _launch(_product_direct, ntasks, out.size * n_in, _ro(op), _ro(X4), pf32, ip32, h32, O4, Ba, tw)
            return out
        for l in range(L):
            if post == 1:
                # rows of the tensor times the operator's transpose: no transposed copy
                Y = _exact_matmul(X4[l, :, :, 0], op[l].T)
                Y3, O3 = _ro(Y.reshape(1, pre, n_out)), O4[l].reshape(pre, 1, n_out)
                _launch(_reduce_swap, pre, Y.size, Y3, O3, pf[l], ipf[l], hf[l])
            else:
                Y = _exact_matmul(op[l], X4[l].transpose(1, 0, 2).reshape(n_in, pre * post))
                Y3 = _ro(Y.reshape(n_out, pre, post))
                _launch(_reduce_swap, pre * n_out, Y.size, Y3, O4[l], pf[l], ipf[l], hf[l])
        return out

    # ----- elementwise --------------------------------------------------------------------

    def _elementwise(self, a, b, moduli, mode, what):
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        a = np.asarray(a)
        b = np.asarray(b)
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise TypeError(f"{what}: residue planes must be int8; got {a.dtype} and {b.dtype}")
        if a.ndim < 1 or b.ndim < 1 or a.shape[0] != L or b.shape[0] != L:
            raise ValueError(f"{what}: planes must have L = {L} leading planes; got {a.shape} and {b.shape}")
        sa, sb = a.shape[1:], b.shape[1:]
        shape = np.broadcast_shapes(sa, sb)
        if mode != 0 and shape != sa:
            raise ValueError(f"{what}: b of shape {b.shape} does not broadcast to a's shape {a.shape}")
        out = np.empty((L,) + shape, np.int8)
        if out.size == 0:
            return out
        nd = len(shape)
        sbp = (1,) * (nd - len(sb)) + sb
        # the longest suffix b shares with the result, everything before it size 1
        k = nd
        while k > 0 and sbp[k - 1] == shape[k - 1]:
            k -= 1
        inner = math.prod(shape[k:])
        if sa == shape and all(d == 1 for d in sbp[:k]) and (inner >= 256 or inner == math.prod(shape)):
            A3 = np.ascontiguousarray(a).reshape(L, -1, inner)
            B2 = np.ascontiguousarray(b).reshape(L, inner)
        else:
            # per-plane broadcasting: align the entry dims, not the plane axis
            sap = (1,) * (nd - len(sa)) + sa
            A3 = np.ascontiguousarray(np.broadcast_to(a.reshape((L,) + sap), out.shape)).reshape(L, 1, -1)
            B2 = np.ascontiguousarray(np.broadcast_to(b.reshape((L,) + sbp), out.shape)).reshape(L, -1)
        pf, ipf, hf = _mod_consts(mods)[:3]
        ntasks = A3.shape[0] * A3.shape[1] * -(-A3.shape[2] // _CHUNK)
        _launch(_elementwise, ntasks, out.size, _ro(A3), _ro(B2), pf, ipf, hf, mode, out.reshape(A3.shape))
        return out

    def hadamard(self, planes: np.ndarray, field_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        return self._elementwise(planes, field_planes, moduli, 0, "hadamard")

    def add(self, a: np.ndarray, b: np.ndarray, moduli: Sequence[int], subtract: bool = False) -> np.ndarray:
        return self._elementwise(a, b, moduli, 2 if subtract else 1, "add")

    # ----- drop and base extension --------------------------------------------------------

    def drop_extend(self, planes: np.ndarray, active: Sequence[int], basis: Basis, drops, extend: bool):
        active = tuple(int(p) for p in active)
        if isinstance(drops, (int, np.integer)) and drops < 0:
            raise ValueError(f"drop_extend: drops must be a non-negative count or a tuple of moduli; got {drops}")
        order = arith.drop_order(active, drops)
        X, shape = _planes_2d(planes, len(active))
        if not order and not extend:
            return X.reshape((len(active),) + shape).copy(), active
        if len(order) >= len(active) or X.shape[1] == 0:
            return arith.drop_extend_ref(planes, active, basis, drops, extend)
        tabs, out_active = _drop_plan(active, tuple(basis.moduli), order, bool(extend))
        out = np.empty((len(out_active), X.shape[1]), np.int8)
        _launch(_drop_extend_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, X, *tabs, out)
        return out.reshape((len(out_active),) + shape), out_active

    # ----- decode -------------------------------------------------------------------------

    def decode(
        self, planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int, mode: str
    ) -> np.ndarray:
        active = tuple(int(p) for p in active)
        X, shape = _planes_2d(planes, len(active))
        ev = _exponent_vector(exponent, shape)
        if not active or X.shape[1] == 0:
            if mode == "fp64":
                return arith.decode_fp64_ref(planes, active, exponent, factor)
            return arith.decode_exact_ref(planes, active, exponent, factor)
        tabs, nl = _decode_plan(active)
        perm, minv, qf, qip, qh, qd = tabs
        out = np.empty(X.shape[1], np.float64)
        if mode == "fp64":
            f, k = arith.float_factor(factor)
            args = (X, perm, minv, qf, qip, qh, qd, float(f), ev, int(k), _P2, out)
            _launch(_decode_fp64_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, *args)
        else:
            factor = int(factor)
            if factor == 0:
                return np.zeros(shape, np.float64)
            flimbs, t2, fsign = _factor_limbs(factor)
            args = (X, perm, minv, qf, qip, qh, qd, ev, int(t2), flimbs, nl, fsign, _P2, out)
            _launch(_decode_exact_kernel, -(-X.shape[1] // _BLOCK), X.size * 16, *args)
        return out.reshape(shape)
