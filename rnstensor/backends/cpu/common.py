"""Shared by the CPU kernels: sizes, thread launcher, numba array intrinsics, exact reductions, mixed-radix digits."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numba
import numpy as np
from numba import njit
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array

from ... import arith
from ...basis import mrc_digit_coeffs
from .. import exponent_runs

__all__ = ["_BLOCK", "_CHUNK", "_MIN_WORK", "_DIRECT_MAX_K", "_BLAS_CHUNK", "_FM", "_MASK30", "_MASK52", "_HIDDEN",
           "_HORNER_CHUNK", "_P2", "_nthreads", "_launch", "_run_parts", "_borrow", "_flat_as", "_readonly", "_cr32",
           "_cr64", "_ldexp", "_bitlen", "_bits", "_any_below", "_mrc_coeffs", "_dot_reduce", "_put_i8", "_mrc_digits",
           "_mod_consts", "_exponent_runs", "_block_exponents", "_ro"]

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


# ----- shared tables and layout -------------------------------------------------------------


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


def _pow2_array() -> np.ndarray:
    a = np.ldexp(1.0, np.arange(-1074, 1024)).astype(np.float64)
    a.setflags(write=False)
    return a


_P2 = _pow2_array()


def _ro(a: np.ndarray) -> np.ndarray:
    """A read-only view: numba compiles one specialization per writability, so inputs always go in read-only."""
    v = a.view()
    v.flags.writeable = False
    return v
