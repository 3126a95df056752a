"""The exact GEMM epilogue's residues: ``alpha S 2**s1 + beta c 2**s2`` per modulus in one pass (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["combine_kernel"]


@njit(cache=True, nogil=True)
def combine_kernel(S, mam, T1, at1, mbm, mc, T2, at2, p, ok, out, task0, task1):
    # out[l, i] <- the centered residue modulo p[l] of ma S_i 2**s1_i + mb mc_i 2**s2_i for the entries ok[i] (0
    # elsewhere): mam / mbm the significands modulo each modulus, T1[l, at1[i]] / T2[l, at2[i]] the powers of two.
    # Every factor is below 2**8 in magnitude (|S| <= 128, residues below p <= 256), so each term stays below 2**24
    # and their sum below 2**25: two divisions per entry (mc_i's and the sum's), where there were four (the
    # divisions are the kernel's cost: 48 against 74 ms a thread on 25 x 2**18 entries; a float reciprocal in their
    # place measured slower, 86 ms)
    L = S.shape[0]
    for l in range(L):
        P = np.int64(p[l])
        H = (P + 1) // 2
        a = np.int64(mam[l])
        b = np.int64(mbm[l])
        Sl, ol, T1l, T2l = S[l], out[l], T1[l], T2[l]
        for i in range(task0, task1):
            if not ok[i]:
                ol[i] = 0
                continue
            r = (a * np.int64(Sl[i]) * T1l[at1[i]] + b * (mc[i] % P) * T2l[at2[i]]) % P
            ol[i] = np.int8(r if r < H else r - P)
