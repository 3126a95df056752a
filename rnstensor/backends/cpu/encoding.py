"""The CPU encode kernels: the residues of round_half_even(x * 2**e) from each float64's IEEE fields."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from ...basis import pow2_cycle
from .common import _BLOCK, _HIDDEN, _MASK52, _block_exponents, _borrow, _cr64

__all__ = ["_enc_split", "_encode_block", "_encode_kernel", "_pow2_tables"]


# ----- encode -------------------------------------------------------------------------------

_SHIFT_MAX = 9  # the largest left shift of a 53-bit significand that _enc_split applies itself (2**62 at most)


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
        # up to 2**_SHIFT_MAX the integer m 2**k itself (below 2**62): widths up to 62 bits take the one-reduction
        # path of widths up to 53
        big = k > _SHIFT_MAX
        v = v << (0 if big else max(k, 0))
        nbig += 1 if big else 0
        kb[b] = k if big else 0
        # the signed value (|v| < 2**62) as hi * 2**24 + lo: hi = floor(v / 2**24) by the arithmetic shift,
        # 0 <= lo < 2**24, so hi*[2^24]_p + lo is below 2**46 in magnitude, inside _cr64's range, and its
        # centered residue is that of the signed v: no separate sign step
        v = -v if bits < 0 else v
        hi[b] = np.float64(v >> 24)
        lo[b] = np.float64(np.int32(v & 16777215))
    return nbig


@njit(cache=True, nogil=True)
def _enc_small(hi, lo, o, p, ip, h, c, W):
    for b in range(W):
        o[b] = np.int8(_cr64(hi[b] * c + lo[b], p, ip, h))


@njit(cache=True, nogil=True)
def _enc_big(hi, lo, kb, pwl, o, p, ip, h, W, mh, ml):
    # v 2**k = (hi 2**24 + lo) 2**k, so its residue is that of hi [2^(k+24)]_p + lo [2^k]_p: one reduction, the
    # two factors from the one table ([2^0]_p = 1, so entries with k <= 0 pass through). |hi| <= 2**29 and
    # lo < 2**24 times factors below 2**7 stay below 2**37, well inside _cr64's range. Entries with k + 24 past
    # the table are clamped here and redone by the caller. The table lookups come first, in a loop of their
    # own: inside the arithmetic loop they kept it scalar
    TW = pwl.size
    top = max(TW - 25, 0)
    for b in range(W):
        k = min(kb[b], top)
        mh[b] = pwl[min(k + 24, TW - 1)]
        ml[b] = pwl[k]
    for b in range(W):
        o[b] = np.int8(_cr64(hi[b] * mh[b] + lo[b] * ml[b], p, ip, h))


@njit(cache=True, nogil=True, inline="always")
def _encode_block(xi, eb, hi, lo, kb, out, i0, W, pf, ipf, hf, c24, pw, pa, pper, mult, mult2):
    # out[l, i0:i0 + W] <- the residues of round_half_even(x * 2**e) for the W entries xi (IEEE bits) with
    # exponents eb: the body of _encode_kernel, also run by the fused interpreter (backends.cpu_fused)
    L = pf.size
    TW = pw.shape[1]
    nbig = _enc_split(xi, eb, hi, lo, kb, W)
    huge = False
    if nbig > 0:
        for b in range(W):
            if kb[b] + 24 >= TW:
                huge = True
    for l in range(L):
        o = out[l, i0 : i0 + W]
        if nbig == 0:
            _enc_small(hi, lo, o, pf[l], ipf[l], hf[l], c24[l], W)
            continue
        _enc_big(hi, lo, kb, pw[l], o, pf[l], ipf[l], hf[l], W, mult, mult2)
        if huge:
            # beyond the table: 2^k is periodic mod p once k passes its 2-adic part
            a = pa[l]
            per = pper[l]
            p = pf[l]
            ip = ipf[l]
            h = hf[l]
            for b in range(W):
                k = kb[b]
                if k + 24 >= TW:
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
    mult2 = np.empty(_BLOCK, np.float64)
    for blk in range(task0, task1):
        i0 = blk * _BLOCK
        W = min(_BLOCK, N - i0)
        _block_exponents(ev, inner, i0, W, eb)
        _encode_block(xi[i0 : i0 + W], eb, hi, lo, kb, out, i0, W, pf, ipf, hf, c24, pw, pa, pper, mult, mult2)


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
