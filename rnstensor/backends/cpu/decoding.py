"""The CPU decode kernels: mixed-radix digits to float64, as the fp64 reference or correctly rounded."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import njit
from numba import types
from numba.extending import intrinsic

from ...basis import mrc_order
from .common import (_BLOCK, _HORNER_CHUNK, _MASK30, _any_below, _bitlen, _bits, _block_exponents, _borrow, _flat_as,
                     _ldexp, _mod_consts, _mrc_coeffs, _mrc_digits)

__all__ = ["_fma", "_decode_fp64_kernel", "_digits_kernel", "_decode_fp64_block", "_signed_horner",
           "_decode_exact_kernel", "ROUND_ROWS", "_round_exact", "_decode_exact_block", "_decode_plan", "_factor_limbs"]


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


@njit(cache=True, nogil=True)
def _digits_kernel(X, perm, C, qf, qip, qh, out, task0, task1):
    # out[:, i0:i0 + W] <- the centered mixed-radix digits of X's entries, block by block (the decodes' first half)
    N = X.shape[1]
    m = perm.size
    D = np.empty((m, _BLOCK), np.float32)
    acc = np.empty(_BLOCK, np.float32)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _mrc_digits(X, i0, W, perm, C, qf, qip, qh, D, acc)
        for i in range(m):
            for b in range(W):
                out[i, i0 + b] = np.int64(D[i, b])


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
