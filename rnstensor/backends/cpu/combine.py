"""The exact GEMM epilogue's residues: ``alpha S 2**s1 + beta c 2**s2`` per modulus in one pass (numba)."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["combine_kernel"]


@njit(cache=True, nogil=True)
def combine_kernel(S, mam, T1, at1, mbm, mc, T2, at2, p, ok, out, task0, task1):
    # out[l, i] <- the centered residue modulo p[l] of ma S_i 2**s1_i + mb mc_i 2**s2_i for the entries ok[i] (0
    # elsewhere): mam / mbm the significands modulo each modulus, T1[l, at1[i]] / T2[l, at2[i]] the powers of two;
    # every product of two residues stays below 2**16, so int64 holds every step
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
            r = (a * np.int64(Sl[i])) % P * T1l[at1[i]] % P
            r = (r + b * (mc[i] % P) % P * T2l[at2[i]]) % P
            ol[i] = np.int8(r if r < H else r - P)
