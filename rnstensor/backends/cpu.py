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
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from .. import arith
from ..basis import Basis, drop_extend_schedule, mrc_digit_coeffs, mrc_order, pow2_cycle
from . import elementwise_shape, exponent_runs, matmul_shape, product_layout

__all__ = ["CpuBackend", "mode_magnitudes", "encode_magnitudes", "chain_magnitude_stats"]

# Exactness of the modular reductions below (p <= 256 throughout):
#
# _cr32(t) for an integer-valued float32 t with |t| + p < 2**22 returns the
# centered residue [t]_p in [h - p, h - 1], h = ceil(p/2), with no compare or
# select: c = t - q*p with q = floor((t + k) * ip), k = p - h + 1/2, ip = fl(1/p).
# Why exact: u = t + k is a half-integer with |u| < 2**22, so it is exact in
# float32, and x = u/p = (2m + 1)/(2p) (m = t + p - h an integer) is at least
# 1/(2p) away from every integer. s = fl(u * ip) = x (1 + d1)(1 + d2) with
# |d1|, |d2| <= 2**-24, so |s - x| <= |x| (2**-23 + 2**-48) < 1/(2p) because
# |u| < 2**22: s and x lie strictly between the same two integers and
# floor(s) = floor(u/p) = q. Then q*p is an integer below 2**23 (exact) and
# t - q*p = (m - q*p) - (p - h) is exact with m - q*p = m mod p in [0, p), so
# c lies in [h - p, h - 1]: the centered residue. (u * ip is a product of an
# addition, never contracted to an FMA; t - q*p may be, it is exact either way.)
# _cr64 is the same in float64, exact for |t| + p < 2**51 (|d| <= 2**-53).
# This is 4 flops (add, mul, floor, fnmadd) where round-then-correct took 9.
# Contraction (FMA) only ever removes a rounding from the bounds above, so the
# product kernels may use it; decode's Horner must not (the reference rounds twice).
_FM = {"contract"}
_MASK30 = (1 << 30) - 1
_TWO_40 = 2.0**40
_TWO_M40 = 2.0**-40
_HORNER_CHUNK = arith.HORNER_CHUNK
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
    cuts = [ntasks * i // nth for i in range(nth + 1)]
    _run_parts(lambda i: kernel(*args, cuts[i], cuts[i + 1]), nth)


def _run_parts(fn, nparts: int) -> None:
    """``fn(i)`` for every part ``i < nparts``, each on its own thread (part 0 on the caller's), for Python work
    that releases the GIL (BLAS calls, nogil kernels run on one thread each)."""
    if nparts <= 1:
        fn(0)
        return
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=_nthreads(), thread_name_prefix="rnstensor-cpu"))
    futures = [_POOL[0].submit(fn, i) for i in range(1, nparts)]
    fn(0)
    for f in futures:
        f.result()


# ----- scalar helpers -----------------------------------------------------------------------


def _borrowed_view(context, builder, sig, args):
    """Codegen of the same array data, shape and strides with a NULL owner (type from ``sig``)."""
    src = context.make_array(sig.args[0])(context, builder, value=args[0])
    dst = context.make_array(sig.return_type)(context, builder)
    for name in ("nitems", "itemsize", "data", "shape", "strides"):
        setattr(dst, name, getattr(src, name))
    dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
    dst.parent = cgutils.get_null_value(dst.parent.type)
    return dst._getvalue()


@intrinsic
def _borrow(typingctx, arr):
    """The same array without its NRT owner (meminfo NULL): a borrowed reference.

    Numba increfs and decrefs an array's owner -- an atomic add on a counter the
    array shares with every view of it -- whenever a view is made or an array
    is passed to a function. The kernels below make thousands of views and
    helper calls per block, and with several threads on the same input and
    tables those counters bounce between cores. Every kernel launched by
    _launch first borrows its array arguments: refcount operations on a NULL
    owner are no-ops, and the caller keeps the arrays alive for the call.
    """
    return arr(arr), _borrowed_view


@intrinsic
def _flat_as(typingctx, arr, dt):
    """A C-contiguous array's bytes as a 1-D array of dtype ``dt`` (borrowed, see _borrow).

    What ``arr.reshape(-1).view(dt)`` gives, without compiling numba's reshape
    and view for every array type (each costs ~0.3 s of cold compile time).
    A trailing partial element is left out.
    """
    if not isinstance(arr, types.Array) or arr.layout != "C" or not isinstance(dt, types.NumberClass):
        return None
    dtype = dt.instance_type
    ret = types.Array(dtype, 1, "C")

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, value=args[0])
        dst = context.make_array(sig.return_type)(context, builder)
        intp = context.get_value_type(types.intp)
        size = intp(context.get_abi_sizeof(context.get_data_type(dtype)))
        n = builder.udiv(builder.mul(src.nitems, src.itemsize), size)
        data = builder.bitcast(src.data, dst.data.type)
        populate_array(dst, data=data, shape=[n], strides=[size], itemsize=size, meminfo=None)
        return dst._getvalue()

    return ret(arr, dt), codegen


@intrinsic
def _readonly(typingctx, arr):
    """The same array typed read-only (borrowed): one specialization of a helper serves both."""
    if not isinstance(arr, types.Array):
        return None
    return arr.copy(readonly=True)(arr), _borrowed_view



@njit(inline="always", nogil=True)
def _cr32(t, p, ip, h):
    q = np.floor((t + ((p - h) + np.float32(0.5))) * ip)
    return t - q * p


@njit(inline="always", nogil=True)
def _cr64(t, p, ip, h):
    q = np.floor((t + ((p - h) + 0.5)) * ip)
    return t - q * p


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


# Mixed-radix digits with one reduction per digit. For the conversion order
# q_0, q_1, ... with W_i = q_0 ... q_{i-1}, the centered digits of v satisfy
# v = sum_i d_i W_i, so d_i = [(x_i - sum_{k<i} d_k W_k) W_i^{-1}]_{q_i}, i.e.
#   d_i = [ C[i, i] x_i + sum_{k<i} C[i, k] d_k ]_{q_i},
#   C[i, i] = [W_i^{-1}]_{q_i},  C[i, k] = [-W_k W_i^{-1}]_{q_i}   (centered, |C| <= 128).
# That is the same digit as the reference's triangular sweep (a centered digit
# is unique), but with i multiply-adds and ONE reduction instead of i modular
# multiplications. Every term is an integer of magnitude <= 128 * 128 = 2**14;
# with at most 49 terms every partial sum is an exact float32 integer below
# 49 * 2**14 < 2**20, in any order and with or without FMA contraction, and one
# _cr32 (exact for |t| + p < 2**22) reduces it. The same shape -- an int8 plane
# times a constant plus a constant combination of earlier digits, reduced once
# -- also gives the planes after a group of drops and the extended residues
# (see _drop_extend_kernel), so _dot_reduce is the one hot loop of all three.


def _mrc_coeffs(order: tuple[int, ...]) -> np.ndarray:
    """``C`` of the one-reduction digits above (float32, row ``i`` holds digit ``i``'s constants; see
    :func:`rnstensor.basis.mrc_digit_coeffs`)."""
    return mrc_digit_coeffs(tuple(order))


@njit(cache=True, nogil=True, fastmath=_FM)
def _dot_reduce(x, cx, D, col, n, p, ip, h, acc, W):
    # acc <- [cx * x + sum_{k<n} col[k] * D[k]]_p over W lanes (x int8, D float32
    # digits, all constants centered): at most 49 terms of magnitude <= 2**14, so
    # exact as argued above. cx == 0 skips x. Four terms per pass, summed as a
    # tree, keep the accumulator's loads and stores off the critical path (chains
    # of FMAs and longer passes measured slower here); D's rows are only read and
    # acc is a separate buffer, so every loop vectorizes.
    # Signed zeros: the "+ 0" turns a -0.0 from x * cx (x = 0, cx < 0) into +0.0
    # (also when fused to an FMA), and +0.0 plus any zero product stays +0.0, so
    # no sum and no digit is ever -0.0 (the fp64 decode of a zero would otherwise
    # come out -0.0 where the reference's integer digits give +0.0).
    if cx == 0:
        for b in range(W):
            acc[b] = 0
    else:
        for b in range(W):
            acc[b] = np.float32(x[b]) * cx + np.float32(0.0)
    k = 0
    while k + 4 <= n:
        c0 = col[k]
        c1 = col[k + 1]
        c2 = col[k + 2]
        c3 = col[k + 3]
        D0 = D[k]
        D1 = D[k + 1]
        D2 = D[k + 2]
        D3 = D[k + 3]
        for b in range(W):
            acc[b] += (c0 * D0[b] + c1 * D1[b]) + (c2 * D2[b] + c3 * D3[b])
        k += 4
    if k + 2 <= n:
        c0 = col[k]
        c1 = col[k + 1]
        D0 = D[k]
        D1 = D[k + 1]
        for b in range(W):
            acc[b] += c0 * D0[b] + c1 * D1[b]
        k += 2
    if k < n:
        c0 = col[k]
        D0 = D[k]
        for b in range(W):
            acc[b] = _cr32(acc[b] + c0 * D0[b], p, ip, h)
    else:
        for b in range(W):
            acc[b] = _cr32(acc[b], p, ip, h)


@njit(cache=True, nogil=True)
def _put_f32(acc, dst, W):
    for b in range(W):
        dst[b] = acc[b]


@njit(cache=True, nogil=True)
def _put_i8(acc, dst, W):
    for b in range(W):
        dst[b] = np.int8(acc[b])


@njit(cache=True, nogil=True)
def _mrc_digits(X, i0, W, perm, C, qf, qip, qh, D, acc):
    # D[i, :W] <- centered mixed-radix digit i (conversion order perm, constants C)
    # of the entries X[:, i0:i0 + W]
    for i in range(perm.size):
        _dot_reduce(X[perm[i], i0 : i0 + W], C[i, i], D, C[i], i, qf[i], qip[i], qh[i], acc, W)
        _put_f32(acc, D[i], W)


# ----- encode -------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _enc_split(xi, e, hi, lo, kb, W):
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
        # the signed value (|v| <= 2**53) as hi * 2**24 + lo with int32-sized
        # parts (AVX2 converts those to float64): hi = floor(v / 2**24) by the
        # arithmetic shift, 0 <= lo < 2**24, so hi*[2^24]_p + lo is below 2**38
        # in magnitude, well inside _cr64's range, and its centered residue is
        # that of the signed v: no separate sign step
        v = -v if bits < 0 else v
        hi[b] = np.float64(np.int32(v >> 24))
        lo[b] = np.float64(np.int32(v & 16777215))
    return nbig


@njit(cache=True, nogil=True)
def _enc_small(hi, lo, o, p, ip, h, c, W):
    for b in range(W):
        o[b] = np.int8(_cr64(hi[b] * c + lo[b], p, ip, h))


@njit(cache=True, nogil=True)
def _enc_big(hi, lo, kb, pwl, o, p, ip, h, c, W, mult):
    # [2^0]_p = 1 and _cr64 is idempotent, so entries with k <= 0 pass through;
    # |r * [2^k]_p| < 2**15. The table lookups come first, in a loop of their own: inside the arithmetic
    # loop they kept it scalar
    TW = pwl.size
    for b in range(W):
        mult[b] = pwl[min(kb[b], TW - 1)]
    for b in range(W):
        r = _cr64(hi[b] * c + lo[b], p, ip, h)
        o[b] = np.int8(_cr64(r * mult[b], p, ip, h))


@njit(cache=True, nogil=True, inline="always")
def _encode_block(xi, eb, hi, lo, kb, out, i0, W, pf, ipf, hf, c24, pw, pa, pper, mult):
    # out[l, i0:i0 + W] <- the residues of round_half_even(x * 2**e) for the W entries xi (IEEE bits) with
    # exponents eb: the body of _encode_kernel, also run by the fused interpreter (backends.cpu_fused)
    L = pf.size
    TW = pw.shape[1]
    nbig = _enc_split(xi, eb, hi, lo, kb, W)
    huge = False
    if nbig > 0:
        for b in range(W):
            if kb[b] >= TW:
                huge = True
    for l in range(L):
        o = out[l, i0 : i0 + W]
        if nbig == 0:
            _enc_small(hi, lo, o, pf[l], ipf[l], hf[l], c24[l], W)
            continue
        _enc_big(hi, lo, kb, pw[l], o, pf[l], ipf[l], hf[l], c24[l], W, mult)
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
                    o[b] = np.int8(_cr64(r * pw[l, a + (k - a) % per], p, ip, h))


@njit(cache=True, nogil=True)
def _encode_kernel(xi, ev, inner, pf, ipf, hf, c24, pw, pa, pper, out, task0, task1):
    # The hot loops live in separate small functions: inside one large body
    # LLVM left them scalar (4-5x slower)
    xi, ev, pf, ipf, hf, c24 = _borrow(xi), _borrow(ev), _borrow(pf), _borrow(ipf), _borrow(hf), _borrow(c24)
    pw, pa, pper, out = _borrow(pw), _borrow(pa), _borrow(pper), _borrow(out)
    N = xi.size
    hi = np.empty(_BLOCK, np.float64)
    lo = np.empty(_BLOCK, np.float64)
    kb = np.empty(_BLOCK, np.int64)
    eb = np.empty(_BLOCK, np.int64)
    mult = np.empty(_BLOCK, np.float64)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _block_exponents(ev, inner, i0, W, eb)
        _encode_block(xi[i0 : i0 + W], eb, hi, lo, kb, out, i0, W, pf, ipf, hf, c24, pw, pa, pper, mult)


@lru_cache(maxsize=64)
def _pow2_tables(moduli: tuple[int, ...], width: int):
    """``[2^k]_p`` for ``k < width`` (float64), with the 2-adic offset and period for larger ``k``."""
    L = len(moduli)
    pa = np.zeros(L, np.int64)
    per = np.ones(L, np.int64)
    base = 1
    for i, p in enumerate(moduli):
        a, t = pow2_cycle(p)
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


def _exponent_runs(exponent, shape) -> tuple[np.ndarray, int]:
    """:func:`rnstensor.backends.exponent_runs`, read-only for the kernels."""
    ev, inner = exponent_runs(exponent, shape)
    return _ro(ev), inner


@njit(cache=True, nogil=True)
def _block_exponents(ev, inner, i0, W, eb):
    # eb[b] = the exponent of entry i0 + b (see _exponent_runs)
    if inner == 1:
        src = ev[i0 : i0 + W]
        for b in range(W):
            eb[b] = src[b]
        return
    j = i0 // inner
    pos = i0 - j * inner
    b = 0
    while b < W:
        run = min(inner - pos, W - b)
        val = ev[j]
        for t in range(b, b + run):
            eb[t] = val
        b += run
        j += 1
        pos = 0


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


# ----- decode -------------------------------------------------------------------------------


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's fma: the FMA instruction, or an exact libm call without one)."""
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@njit(cache=True, nogil=True)
def _horner_chunk(D, qd, j0, j1, C, W):
    # C = the digits j0 .. j1-1 in plain float64 Horner: exact (a chunk weighs below 2**48)
    Dt = D[j1 - 1]
    for b in range(W):
        C[b] = np.float64(Dt[b])
    for j in range(j1 - 2, j0 - 1, -1):
        q = qd[j]
        Dj = D[j]
        for b in range(W):
            C[b] = q * C[b] + np.float64(Dj[b])


@njit(cache=True, nogil=True)
def _horner_dd(D, qd, H, L, C, W):
    # H + L = the digits' value as arith.horner_fp64_ref: exact chunks joined in
    # double-double, the product's error by an FMA (Dekker's value), the sum's by
    # Fast2Sum, every other operation rounded on its own (no fastmath)
    m = qd.size
    top = _HORNER_CHUNK * ((m - 1) // _HORNER_CHUNK)
    _horner_chunk(D, qd, top, m, H, W)
    for b in range(W):
        L[b] = 0.0
    for j0 in range(top - _HORNER_CHUNK, -1, -_HORNER_CHUNK):
        w = 1.0
        for j in range(j0, j0 + _HORNER_CHUNK):
            w *= qd[j]
        _horner_chunk(D, qd, j0, j0 + _HORNER_CHUNK, C, W)
        for b in range(W):
            h = H[b]
            c = C[b]
            p = w * h
            e1 = _fma(h, w, -p)
            s = p + c
            L[b] = w * L[b] + (e1 + (c - (s - p)))
            H[b] = s


@njit(cache=True, nogil=True)
def _decode_fp64_kernel(X, perm, C, qf, qip, qh, qd, f, g, ev, inner, k, p2, out, task0, task1):
    X, perm, C, qf, qip, qh = _borrow(X), _borrow(perm), _borrow(C), _borrow(qf), _borrow(qip), _borrow(qh)
    qd, ev, p2, out = _borrow(qd), _borrow(ev), _borrow(p2), _borrow(out)
    L, N = X.shape
    m = perm.size
    V = np.empty(_BLOCK, np.float64)
    Vl = np.empty(_BLOCK, np.float64)
    Vc = np.empty(_BLOCK, np.float64)
    D = np.empty((m, _BLOCK), np.float32)
    acc = np.empty(_BLOCK, np.float32)
    eb = np.empty(_BLOCK, np.int64)
    S = np.empty(_BLOCK, np.int64)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _block_exponents(ev, inner, i0, W, eb)
        _decode_fp64_block(X, i0, W, perm, C, qf, qip, qh, qd, f, g, eb, k, p2, out[i0 : i0 + W], V, Vl, Vc, D, acc, S)


@njit(cache=True, nogil=True, inline="always")
def _decode_fp64_block(X, i0, W, perm, C, qf, qip, qh, qd, f, g, eb, k, p2, o, V, Vl, Vc, D, acc, S):
    # o[:W] <- columns i0 .. i0 + W of X decoded (exponents eb): the body of _decode_fp64_kernel, also run by the
    # fused interpreter (backends.cpu_fused)
    _mrc_digits(X, i0, W, perm, C, qf, qip, qh, D, acc)
    _horner_dd(D, qd, V, Vl, Vc, W)
    # V <- fl((V + Vl) (f + g)), as arith.scaled_double_double
    for b in range(W):
        h = V[b]
        pr = h * f
        V[b] = pr + (_fma(h, f, -pr) + (Vl[b] * f + h * g))
    if _scale_pow2(V, eb, k, S, o, W) > 0:
        # exponents outside the normal range (rare): the table/libm path
        for b in range(W):
            e = eb[b] + k
            if e < -1022 or e > 1023:
                e = min(max(e, -1048576), 1048576)
                o[b] = _ldexp(V[b], e, p2)


@njit(cache=True, nogil=True)
def _scale_pow2(V, e, k, S, o, W):
    # o[b] = V[b] * 2**(e[b] + k), the power built from its IEEE bits where
    # e[b] + k is a normal exponent: a product by an exact power of two rounds
    # once, as ldexp does (subnormal or overflowing results included). Returns
    # how many entries lie outside [-1022, 1023] (left for the caller).
    nbad = 0
    for b in range(W):
        ee = e[b] + k
        ec = min(max(ee, -1022), 1023)
        nbad += 1 if ec != ee else 0
        S[b] = (ec + 1023) << 52
    Sf = _flat_as(S, np.float64)
    for b in range(W):
        o[b] = V[b] * Sf[b]
    return nbad


@njit(cache=True, nogil=True)
def _signed_horner(U, qd, sgn, Vf, carry, W, lw):
    # s*v for a block, s the sign of v, in base-2**lw limbs held in float64 (lw = 40 for the INT8 moduli, 28 for
    # moduli below 2**24): limb * q + carry < 2**53 and floor() splits it exactly, so every step is exact and
    # vectorizes across entries. The top nonzero centered digit outweighs all lower ones, so it carries the sign
    # and every Horner prefix of s*v is >= 0: the limbs stay normalized in [0, 2**lw).
    m = qd.size
    nl = Vf.shape[0]
    up = np.float64(np.int64(1) << lw)
    down = 1.0 / up
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
    # after digit j the prefix is below q_j ... q_{m-1} / 2 in magnitude: the limbs above that are zero (no
    # carry reaches them), so each step runs only over the limbs in use
    width = math.log2(qd[m - 1])
    for j in range(m - 2, -1, -1):
        q = qd[j]
        Uj = U[j]
        width += math.log2(q)
        used = min(nl, int(width / lw) + 2)
        for b in range(W):
            carry[b] = sgn[b] * np.float64(Uj[b])
        for li in range(used):
            Vl = Vf[li]
            for b in range(W):
                t = Vl[b] * q + carry[b]
                c = np.floor(t * down)
                Vl[b] = t - c * up
                carry[b] = c


@njit(cache=True, nogil=True)
def _decode_exact_kernel(X, perm, C, qf, qip, qh, qd, ev, inner, eadd, flimbs, nl40, fsign, p2, out, task0, task1):
    # block by block: the mixed-radix digits, |v| in 40-bit limbs (_signed_horner), the rounding (_round_exact)
    X, perm, C, qf, qip, qh = _borrow(X), _borrow(perm), _borrow(C), _borrow(qf), _borrow(qip), _borrow(qh)
    qd, ev, flimbs, p2, out = _borrow(qd), _borrow(ev), _borrow(flimbs), _borrow(p2), _borrow(out)
    N = X.shape[1]
    m = perm.size
    eb = np.empty(_BLOCK, np.int64)
    n30 = (40 * nl40 + 29) // 30
    V = np.zeros(n30, np.int64)
    P = np.zeros(n30 + flimbs.size + 1, np.int64)
    U = np.empty((m, _BLOCK), np.float32)
    acc = np.empty(_BLOCK, np.float32)
    sgn = np.empty(_BLOCK, np.float64)
    carry = np.empty(_BLOCK, np.float64)
    Vf = np.empty((nl40, _BLOCK), np.float64)
    R = np.empty((ROUND_ROWS, _BLOCK), np.int64)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _block_exponents(ev, inner, i0, W, eb)
        _decode_exact_block(X, i0, W, perm, C, qf, qip, qh, qd, eb, eadd, flimbs, fsign, p2, out[i0 : i0 + W],
                            V, P, U, acc, sgn, carry, Vf, R)


_MAGIC52 = 0x4330000000000000  # the bits of 2.0**52: x + 2**52 holds an integer 0 <= x < 2**52 in its low bits
_SIGN = np.int64(-(1 << 63))
#: rows of the int64 scratch of _round_unit (the entries left to the scalar rounding, then its lanes' work)
ROUND_ROWS = 5


@njit(cache=True, nogil=True)
def _round_unit(Vf, lw, sgn, eb, eadd, fsign, R, o, W):
    # o[b] <- s_b * v_b * 2**(eb[b] + eadd) rounded to nearest-even for every entry whose result is a normal
    # float64 (or overflows by the rounding carry alone), lane by lane: v in base-2**lw limbs Vf (least
    # significant first). Each lane's bit length nb comes from its top nonzero limb's float64 exponent field;
    # the window is the limbs from the block's highest top down to nw - 1 below its lowest (nw = 3 limbs of 40
    # bits, 4 of 28: at least 63 bits below every lane's top), each shifted to its place in the lane's top 63
    # bits T, the bits shifted out and every limb below the window only saying whether they are zero (sticky).
    # Then 53 bits of T rounded and written as IEEE fields: a carry out of the significand moves into the
    # exponent field, which is the rounding's carry, and past 2046 it is inf, as ldexp. Few arrays per loop, so
    # that every loop vectorizes. Returns how many entries are left to the scalar rounding (subnormal or
    # overflowing results), marked by R[0, b] = 1.
    nl = Vf.shape[0]
    S = R.shape[1]
    stride = Vf.shape[1]
    nw = 3 if lw >= 32 else 4
    Vi = _flat_as(Vf, np.int64)
    Rf = _flat_as(R, np.float64)
    flag, T, lost, cv, nb = R[0, :W], R[1, :W], R[2, :W], R[3, :W], R[4, :W]
    cvf = Rf[3 * S: 3 * S + W]
    for b in range(W):
        nb[b] = 0
        T[b] = 0
        lost[b] = 0
    for li in range(nl):
        Vl = Vf[li]
        Vil = Vi[li * stride: li * stride + W]
        base = lw * li - 1022
        for b in range(W):
            nb[b] = (Vil[b] >> 52) + base if Vl[b] != 0.0 else nb[b]
    nmax = np.int64(0)
    nmin = np.int64(1) << 40
    for b in range(W):
        x = nb[b]
        nmax = max(nmax, x)
        nmin = min(nmin, x if x > 0 else np.int64(1) << 40)
    if nmax == 0:
        for b in range(W):
            o[b] = 0.0
            flag[b] = 0
        return 0
    top = (nmax - 1) // lw
    low = max((nmin - 1) // lw - nw + 1, 0)
    for li in range(top, low - 1, -1):
        Vl = Vf[li]
        for b in range(W):
            cvf[b] = Vl[b] + 4503599627370496.0  # the limb (< 2**52) in the low bits of its int64 view
        place = 63 + lw * li
        for b in range(W):
            limb = cv[b] - _MAGIC52
            sh = place - nb[b]  # where the limb's low bit lands in T
            left = min(max(sh, 0), 62)
            right = min(max(-sh, 0), 62)
            T[b] |= (limb << left) >> right
            lost[b] |= limb & ((np.int64(1) << right) - 1)
    for li in range(low):
        Vl = Vf[li]
        for b in range(W):
            lost[b] |= np.int64(Vl[b] != 0.0)
    for b in range(W):
        t = T[b]
        mant = t >> 10
        T[b] = mant + (((t >> 9) & 1) & (np.int64((lost[b] | (t & 511)) != 0) | (mant & 1)))
    nfall = 0
    bexp = lost  # the biased exponent of each result, in the sticky row (read by the rounding above)
    for b in range(W):
        be = nb[b] + min(max(eb[b] + eadd, -(1 << 40)), 1 << 40) + 1022
        bexp[b] = be
        bad = sgn[b] != 0.0 and (be < 1 or be > 2046)
        flag[b] = 1 if bad else 0
        nfall += 1 if bad else 0
    for b in range(W):
        bits = (bexp[b] << 52) + (T[b] - (np.int64(1) << 52))
        bits = bits if sgn[b] * fsign > 0 else bits | _SIGN
        T[b] = 0 if sgn[b] == 0.0 else bits
    Tf = Rf[S: S + W]
    for b in range(W):
        o[b] = Tf[b]
    return nfall


@njit(cache=True, nogil=True, inline="always")
def _round_exact(Vf, lw, sgn, eb, eadd, flimbs, fsign, p2, o, V, P, R, W):
    # o[:W] <- s * v * factor * 2**(eb + eadd) correctly rounded for v in base-2**lw limbs Vf: the lanes where
    # the factor is +-1 (_round_unit), then entry by entry what they leave (and every entry for other factors):
    # v in 30-bit int64 limbs (so that limb * limb + carry never overflows), times the odd part of the factor
    # (its power of two is in eadd), then rounded once to nearest-even on the float64 grid of the result: 53
    # bits, or fewer where the result is subnormal, so the final ldexp is exact or overflows
    nl = Vf.shape[0]
    n30 = V.size
    nf = flimbs.size
    unit = nf == 1 and flimbs[0] == 1
    if unit and _round_unit(Vf, lw, sgn, eb, eadd, fsign, R, o, W) == 0:
        return
    for b in range(W):
        if sgn[b] == 0.0:
            o[b] = 0.0
            continue
        if unit and R[0, b] == 0:
            continue
        for i in range(n30):
            pos = 30 * i
            li = pos // lw
            off = pos - lw * li
            w = np.int64(Vf[li, b]) >> off
            got = lw - off
            j = li + 1
            while got < 30 and j < nl:
                w |= np.int64(Vf[j, b]) << got
                got += lw
                j += 1
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
        e = eb[b] + eadd
        if e < -(1 << 40):
            e = -(1 << 40)
        elif e > (1 << 40):
            e = 1 << 40
        shift = max(nb - 53, -1074 - e)
        # (computed 0, 1 and 53 below: literals would compile three more _bits)
        one = n - n + 1
        if shift <= 0:
            y = _ldexp(np.float64(_bits(M, n, one - 1, nb)), e, p2)
        else:
            mant = _bits(M, n, shift, one + 52)
            if _bits(M, n, shift - 1, one) == 1 and ((mant & 1) == 1 or _any_below(M, n, shift - 1)):
                mant += 1
            y = _ldexp(np.float64(mant), shift + e, p2)
        o[b] = -y if sgn[b] * fsign < 0 else y


@njit(cache=True, nogil=True, inline="always")
def _decode_exact_block(X, i0, W, perm, C, qf, qip, qh, qd, eb, eadd, flimbs, fsign, p2, o, V, P, U, acc, sgn, carry,
                        Vf, R):
    # o[:W] <- columns i0 .. i0 + W of X correctly rounded (exponents eb): the body of _decode_exact_kernel, also
    # run by the fused interpreter (backends.cpu_fused); V, P: 30-bit limb scratch, Vf: (40-bit limbs, W), R:
    # (ROUND_ROWS, W) int64 scratch
    _mrc_digits(X, i0, W, perm, C, qf, qip, qh, U, acc)
    _signed_horner(U, qd, sgn, Vf, carry, W, 40)
    _round_exact(Vf, 40, sgn, eb, eadd, flimbs, fsign, p2, o, V, P, R, W)


@lru_cache(maxsize=256)
def _decode_plan(active: tuple[int, ...]):
    order = mrc_order(active)
    perm = np.array([active.index(q) for q in order], np.int64)
    qf, qip, qh = _mod_consts(order)[:3]
    qd = np.array(order, np.float64)
    # |v| <= P/2 < 2**bits(P): base-2**40 limbs enough for that
    nl = (math.prod(order).bit_length() + 39) // 40
    tabs = (perm, _mrc_coeffs(order), qf, qip, qh, qd)
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
    xp = np  # the array module it computes with

    # ----- encode -------------------------------------------------------------------------

    def constants(self, key, make):
        """Host tables as they are (see the backend contract)."""
        return make()

    def encode(self, x: np.ndarray, exponent: np.ndarray, moduli: Sequence[int], bits: int) -> np.ndarray:
        # not ascontiguousarray: it would turn a 0-d x into shape (1,)
        x = np.require(np.asarray(x, dtype=np.float64), requirements="C")
        mods = tuple(int(p) for p in moduli)
        out = np.empty((len(mods),) + x.shape, np.int8)
        ev, inner = _exponent_runs(exponent, x.shape)
        if not mods or x.size == 0:
            return out
        # k = ef - 1075 + e <= 971 + max(e): size the direct [2^k]_p table for that
        width = 971 + int(ev.max()) + 1
        width = 1 << max(width, 1).bit_length() if width <= 8192 else 256
        tab, pa, per, c24 = _pow2_tables(mods, width)
        _, _, _, pf, ipf, hf = _mod_consts(mods)
        nblk = -(-x.size // _BLOCK)
        xi = _ro(x.reshape(-1).view(np.int64))
        args = (xi, ev, inner, pf, ipf, hf, c24, tab, pa, per, out.reshape(len(mods), -1))
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
        axis, n_out, n_in, pre, post, oshape = product_layout(op.shape, X.shape, L, axis)
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
            Ba, tw, ntasks = _product_tasks(L, pre, n_in, post)
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

    def matmul(self, a_planes: np.ndarray, b_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        a, b = np.asarray(a_planes), np.asarray(b_planes)
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise TypeError(f"matmul: planes must be int8; got {a.dtype} and {b.dtype}")
        batch, M, K, N = matmul_shape(a.shape, b.shape, L)
        out = np.empty((L,) + batch + (M, N), np.int8)
        if out.size == 0:
            return out
        if K == 0:
            out[...] = 0
            return out
        pf, ipf, hf = _mod_consts(mods)[3:]
        rows = math.prod(batch) * M
        for l in range(L):
            # float32 GEMMs are exact on chunks of <= 1024 terms (|r| <= 128); chunks sum exactly in float64
            acc = None
            for c0 in range(0, K, _BLAS_CHUNK):
                c1 = min(c0 + _BLAS_CHUNK, K)
                y = np.matmul(a[l, ..., c0:c1].astype(np.float32), b[l, ..., c0:c1, :].astype(np.float32))
                acc = y if acc is None else acc.astype(np.float64) + y
            Y = _ro(np.ascontiguousarray(np.broadcast_to(acc, batch + (M, N))).reshape(1, rows, N))
            _launch(_reduce_swap, rows, Y.size, Y, out[l].reshape(rows, 1, N), pf[l], ipf[l], hf[l])
        return out

    # ----- elementwise --------------------------------------------------------------------

    def _elementwise(self, a, b, moduli, mode, what):
        mods = tuple(int(p) for p in moduli)
        L = len(mods)
        a = np.asarray(a)
        b = np.asarray(b)
        if a.dtype != np.int8 or b.dtype != np.int8:
            raise TypeError(f"{what}: residue planes must be int8; got {a.dtype} and {b.dtype}")
        shape = elementwise_shape(a.shape, b.shape, L, mode, what)
        sa, sb = a.shape[1:], b.shape[1:]
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

    # ----- whole programs -----------------------------------------------------------------

    def exact_gemm(self, program, a: np.ndarray, b: np.ndarray, ea: np.ndarray, eb: np.ndarray, workspace_bytes: int):
        """The two-operand program ``gemm_program`` (real, or complex 3M) on wide moduli in float64 BLAS, or ``None``.

        Taken where it should be faster than the INT8 product (by shape and
        width, :func:`rnstensor.backends.cpu_gemm.prefers_wide`, or as
        ``cpu_gemm.ENGINE`` says) and its planes fit ``workspace_bytes``; the
        same integers and the same correctly rounded decode, so the same bits.
        """
        from . import cpu_gemm  # noqa: PLC0415 - the engine's kernels compile on first use

        if cpu_gemm.ENGINE == "int8" or len(program.steps) != 4:
            return None
        enc_a, enc_b, product, dec = program.steps
        want = ("ckj", "cij") if program.complex else ("kj", "ij")
        if (enc_b.labels, product.labels) != want or dec.mode != "exact":
            return None
        alpha = complex(dec.alpha) if program.complex else complex(dec.alpha).real
        if not (math.isfinite(alpha.real) and math.isfinite(alpha.imag)):
            return None
        (m, k), n = a.shape, b.shape[1]
        s = len(program.basis)
        if cpu_gemm.ENGINE != "wide" and not cpu_gemm.prefers_wide(m, n, k, s, product.bound):
            return None
        try:
            mods, chunk = cpu_gemm.wide_plan(k, product.bound)
        except ValueError:
            return None
        if cpu_gemm.wide_bytes(m, n, k, len(mods), program.complex) > workspace_bytes:
            return None
        return cpu_gemm.exact_gemm(a, b, ea, eb, product.bound, alpha, mods, chunk)

    def chain_program(self, plan, shape: tuple, decode: str):
        """``(program, None)``: ``plan`` packed for :meth:`chain` on tensors of ``shape``, or ``(None, reason)``."""
        from . import cpu_fused  # noqa: PLC0415 - it imports this module

        try:
            return cpu_fused.cpu_chain_program(plan, shape), None
        except ValueError as exc:
            return None, str(exc)

    def operator_program(self, op, decode: str):
        """``(program, None)``: the FEM operator ``op`` packed for :meth:`chain`, or ``(None, reason)``."""
        from . import cpu_fused  # noqa: PLC0415

        try:
            return cpu_fused.cpu_operator_program(op), None
        except ValueError as exc:
            return None, str(exc)

    def chain(self, program, x: np.ndarray, decode: str, field=None, fexp=None) -> np.ndarray:
        """A whole chain, block by block in cache (:mod:`rnstensor.backends.cpu_fused`): ``x`` ``(B, *in_shape)``
        (finite) -> ``(B, *out_shape)``, bitwise the step-by-step run. A FEM operator's program reads its encoded
        ``field`` ``(planes, B, components, entries)`` int8 and the field's exponent per tensor ``fexp``."""
        from . import cpu_fused  # noqa: PLC0415

        return cpu_fused.run_chain(program, x, decode, field=field, fexp=fexp)

    # ----- decode -------------------------------------------------------------------------

    def decode(
        self, planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int, mode: str
    ) -> np.ndarray:
        active = tuple(int(p) for p in active)
        X, shape = _planes_2d(planes, len(active))
        ev, inner = _exponent_runs(exponent, shape)
        if not active or X.shape[1] == 0:
            if mode == "fp64":
                return arith.decode_fp64_ref(planes, active, exponent, factor)
            return arith.decode_exact_ref(planes, active, exponent, factor)
        tabs, nl = _decode_plan(active)
        perm, C, qf, qip, qh, qd = tabs
        out = np.empty(X.shape[1], np.float64)
        if mode == "fp64":
            f, g, k = arith.float_factor(factor)
            args = (X, perm, C, qf, qip, qh, qd, float(f), float(g), ev, inner, int(k), _P2, out)
            _launch(_decode_fp64_kernel, -(-X.shape[1] // _BLOCK), X.size * 4, *args)
        else:
            factor = int(factor)
            if factor == 0:
                return np.zeros(shape, np.float64)
            flimbs, t2, fsign = _factor_limbs(factor)
            args = (X, perm, C, qf, qip, qh, qd, ev, inner, int(t2), flimbs, nl, fsign, _P2, out)
            _launch(_decode_exact_kernel, -(-X.shape[1] // _BLOCK), X.size * 16, *args)
        return out.reshape(shape)


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


def encode_magnitudes(X: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """The classical certification's leaf: ``(|X| * 2**-e, smallest of it over the nonzero X, all integers)``.

    ``X`` is ``(B, N)`` float64 and ``e`` one exponent per row (int64); one
    pass, threaded over rows. Each magnitude is the correctly rounded
    ``|x| 2**-e`` (exact while it is normal).
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    e = np.ascontiguousarray(e, dtype=np.int64).reshape(-1)
    out = np.empty_like(X)
    stats = np.empty((X.shape[0], 2), np.float64)
    if X.size == 0:
        return out, math.inf, True
    _launch(_encode_magnitudes_kernel, X.shape[0], X.size, X, e, out, stats)
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
def _mode_magnitudes_kernel(X, A, col, rowsum, alpha, beta, kappa, nj, out, stats, t0, t1):
    # task t = (b, a block of nj-th of the rows j): out[b, j, r] = sum_k A[j, k] X[b, k, r] (nonnegative; each
    # product and sum rounded once), its smallest positive entry and its largest
    # (alpha col[b, r] + beta rowsum[j] + kappa) / out over out > 0
    B, K, R = X.shape
    J = A.shape[0]
    own = col.shape[0] == 0 and alpha != 0.0  # one task per b: its column sums here, while X[b] is in cache
    colb = np.zeros(R, np.float64)
    q = np.empty(R, np.float64)
    Z = np.zeros(R, np.float64)
    for t in range(t0, t1):
        b, jb = t // nj, t % nj
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


def mode_magnitudes(X: np.ndarray, A: np.ndarray, alpha: float, beta: float, kappa: float):
    """``A`` (``J x K``, nonnegative) applied along axis 1 of ``X`` (``B x K x R``, nonnegative), with the
    certification's two reductions fused into the same pass: ``(out, smallest positive out, largest
    (alpha colsum + beta rowsum + kappa) / out over the positive entries)``; threads over ``(b, j)``.

    Every product and sum is rounded once (no reassociation; a fused
    multiply-add only rounds less): each entry is within a relative
    ``(K + 1) 2**-53`` of the exact sum, and so are the column and row sums.
    Meant for short contractions (sum factorization, ``K`` up to a few
    dozen); long ones are BLAS's.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    A = np.ascontiguousarray(A, dtype=np.float64)
    B, K, R = X.shape
    J = A.shape[0]
    out = np.empty((B, J, R), np.float64)
    nj = 1 if B >= 64 else max(J, 1)  # few tensors: the threads share out the rows instead
    rowsum = A.sum(axis=1)
    if nj == 1 and R < 16 and B * J:
        bpt = max(1, 512 // max(R, 1))
        ntasks = -(-B // bpt)
        stats = np.empty((ntasks, 2), np.float64)
        _launch(_mode_magnitudes_lanes_kernel, ntasks, X.size * J + out.size, X, A, rowsum, float(alpha),
                float(beta), float(kappa), bpt, out, stats)
        return out, float(stats[:, 0].min()), float(stats[:, 1].max())
    stats = np.empty((B * nj, 2), np.float64)
    col = X.sum(axis=1) if alpha and nj > 1 else np.zeros((0, R))  # else each task sums its own b
    _launch(_mode_magnitudes_kernel, B * nj, X.size * J + out.size, X, A, col, rowsum, float(alpha), float(beta),
            float(kappa), nj, out, stats)
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
