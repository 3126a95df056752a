"""Exact host tables for the CUDA kernels: modulus constants, MRC coefficients, packed drop/extension and decode tables.

Plain numpy, no GPU: the same tables feed the device kernels and the host
build of their arithmetic (``host_check.cpp``) that the CPU tests run. Every
integer constant is centered (``|c| <= 128``) and exact in float32; ``ip`` is
``fl(1/p)`` in float32 (see ``rns_arith.cuh`` for why that suffices).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..arith import drop_order
from ..basis import centered, drop_extend_schedule, mrc_digit_coeffs, mrc_order, pow2_cycle

__all__ = [
    "centered",
    "mod_consts",
    "reduce_consts",
    "encode_tables",
    "mrc_coeffs",
    "drop_tables",
    "byte_words",
    "decode_tables",
    "factor_limbs",
    "MAX_LIMBS",
    "exact_decode_fits",
    "DROP_HEADER",
    "DROP_IB_MAX",
    "DROP_FB_MAX",
]

#: limbs of 32 bits the exact decode holds (RNS_MAXLIMB in rns_arith.cuh): |v| and |v| times the factor
MAX_LIMBS = 40
#: int32 entries in the header of a packed drop table (see rns_drop_tables in rns_arith.cuh)
DROP_HEADER = 31
#: capacity of the kernel's __constant__ tables (RNS_DROP_IB, RNS_DROP_FB in entry.cu)
DROP_IB_MAX = 4096
DROP_FB_MAX = 4096


def _ro(*arrays):
    for a in arrays:
        a.setflags(write=False)
    return arrays


@lru_cache(maxsize=256)
def mod_consts(moduli: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 ``p``, ``fl(1/p)`` and ``h = ceil(p/2)`` of every modulus."""
    p = np.array(moduli, np.float32)
    ip = (np.float32(1.0) / p).astype(np.float32)
    h = np.array([(q + 1) // 2 for q in moduli], np.float32)
    return _ro(p, ip, h)


@lru_cache(maxsize=256)
def reduce_consts(moduli: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``(p, ip, h, c16)`` for the int32 reduction, ``c16 = [2^16]_p`` centered (float32)."""
    c16 = np.array([centered(1 << 16, q) for q in moduli], np.float32)
    return (*mod_consts(moduli), *_ro(c16))


@lru_cache(maxsize=256)
def encode_tables(moduli: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """``(p, ip, h, cp, pw, pa, per)`` for the encode kernel.

    ``cp[i, l] = [2^(14 (i + 1))]_p`` (centered float32, ``(3, L)``): the
    weights of the 14-bit pieces of the significand (``rns_encode_split``).
    ``pw[l, i] = [2^i]_p`` (centered float32) for ``i < pa + per``, where ``pa``
    is the 2-adic valuation of ``p`` and ``per`` the period of 2 modulo its odd
    part: ``[2^k]_p = pw[pa + (k - pa) % per]`` beyond the table.
    """
    L = len(moduli)
    pa = np.zeros(L, np.int32)
    per = np.ones(L, np.int32)
    for i, p in enumerate(moduli):
        pa[i], per[i] = pow2_cycle(p)
    width = int((pa + per).max()) if L else 1
    pw = np.zeros((L, width), np.float32)
    for i, p in enumerate(moduli):
        for k in range(width):
            pw[i, k] = centered(pow(2, k, p), p)
    cp = np.array([[centered(1 << (14 * i), q) for q in moduli] for i in (1, 2, 3)], np.float32).reshape(3, L)
    return (*mod_consts(moduli), *_ro(cp, pw, pa, per))


def mrc_coeffs(order: Sequence[int]) -> np.ndarray:
    """``C`` of the one-reduction mixed-radix digits (float32, ``(m, max(m, 1))``): :func:`rnstensor.basis.mrc_digit_coeffs`."""
    return mrc_digit_coeffs(tuple(int(q) for q in order))


class _Packer:
    def __init__(self, header: int):
        self.ib: list[int] = [0] * header
        self.fb: list[np.ndarray] = []
        self.nf = 0

    def ints(self, slot: int, values) -> None:
        self.ib[slot] = len(self.ib)
        self.ib.extend(int(v) for v in values)

    def floats(self, slot: int, values) -> None:
        a = np.asarray(values, np.float32).reshape(-1)
        self.ib[slot] = self.nf
        self.fb.append(a)
        self.nf += a.size

    def done(self) -> tuple[np.ndarray, np.ndarray]:
        ib = np.array(self.ib, np.int32)
        fb = np.concatenate(self.fb) if self.fb else np.zeros(1, np.float32)
        if fb.size == 0:
            fb = np.zeros(1, np.float32)
        return _ro(ib, fb)


def byte_words(rows: Sequence[Sequence[int]], words: int) -> np.ndarray:
    """int8 rows packed four to an int32 word (byte ``k`` of word ``w``: entry ``4 w + k``), zero-padded: ``(len(rows), words)``."""
    b = np.zeros((len(rows), 4 * words), np.int8)
    for i, row in enumerate(rows):
        b[i, : len(row)] = np.asarray(row, np.int64).astype(np.int8)
    return b.view("<i4").astype(np.int32).reshape(len(rows), words)


def _mrc_words(order: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The one-reduction MRC coefficients as ``rns_mrc_digit_words`` takes them: row ``i`` (``C[i, k]``, ``k < i``) and ``C[i, i]`` in a low byte."""
    C = mrc_coeffs(order).astype(np.int64)
    m = len(order)
    rows = byte_words([C[i, :i] for i in range(m)], max((m + 3) // 4, 1))
    diag = byte_words([[C[i, i]] for i in range(m)], 1).reshape(-1)
    # the kernel takes digit 0 as the residue itself, unreduced: that needs C[0, 0] = [1 / W_0] = [1], 1 mod q_0
    assert m == 0 or (C[0, 0] - 1) % order[0] == 0, (C[0, 0], order[0])
    return rows, diag


@lru_cache(maxsize=512)
def _drop_tables(active: tuple[int, ...], basis: tuple[int, ...], order: tuple[int, ...], extend: bool):
    sc = drop_extend_schedule(active, basis, order, extend, "drops")
    g, dperm, alive, rem, morder, mperm, tsrc, targets = (
        len(order), sc.dperm, sc.alive, sc.rem, sc.morder, sc.mperm, sc.tsrc, sc.targets,
    )
    out_active = sc.out_active
    wg, wm = max((g + 3) // 4, 1), max((len(morder) + 3) // 4, 1)
    Bc = byte_words([[c] for c in sc.Bc], 1).reshape(-1)
    E = byte_words(sc.E, wg)
    Tw = byte_words(sc.Tw, wm)
    A, Ad = _mrc_words(order)
    Cm, Cmd = _mrc_words(morder)
    pk = _Packer(DROP_HEADER)
    pk.ib[0:8] = [g, len(rem), len(morder), len(targets), wg, wm, 0, 0]
    for slot, arr in zip(range(8, 19), (dperm, alive, mperm, tsrc, A, Ad, Bc, E, Cm, Cmd, Tw)):
        pk.ints(slot, np.asarray(arr, np.int64).reshape(-1))
    for slot, arr in zip(range(19, 31), (*mod_consts(order), *mod_consts(rem), *mod_consts(morder),
                                         *mod_consts(targets))):
        pk.floats(slot, arr)
    ib, fb = pk.done()
    return ib, fb, out_active, max(wg, wm), max(len(rem), 1)


def drop_tables(active: Sequence[int], basis: Sequence[int], drops, extend: bool):
    """Packed tables for one ``drop_extend`` call (see ``rns_drop_extend_entry``).

    Returns ``(ib, fb, out_active, nd, nr)``: the int32 and float32 buffers, the
    moduli of the output planes, and the scratch sizes per entry in 32-bit
    words (packed digits ``nd``, remaining planes ``nr``). The int buffer holds
    the header (sizes, offsets), the permutations and the int8 coefficient
    rows as words (:func:`byte_words`); the float buffer the moduli constants.
    """
    active = tuple(int(p) for p in active)
    order = drop_order(active, drops)
    return _drop_tables(active, tuple(int(p) for p in basis), tuple(order), bool(extend))


@lru_cache(maxsize=256)
def decode_tables(active: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ib, fb, qd)`` for the decode: conversion order (even modulus first), MRC coefficient words, moduli as float64."""
    active = tuple(int(p) for p in active)
    order = mrc_order(active)
    C, Cd = _mrc_words(order)
    pk = _Packer(8)
    pk.ib[0:2] = [len(order), C.shape[1]]
    pk.ints(2, [active.index(q) for q in order])
    pk.ints(3, C.reshape(-1))
    pk.ints(4, Cd)
    for slot, arr in zip(range(5, 8), mod_consts(order)):
        pk.floats(slot, arr)
    ib, fb = pk.done()
    qd = np.array(order, np.float64)
    return ib, fb, *_ro(qd)


@lru_cache(maxsize=64)
def factor_limbs(factor: int) -> tuple[np.ndarray, int, bool]:
    """``(F, t2, negative)``: ``|factor| = odd * 2**t2`` with ``odd`` as little-endian uint32 limbs ``F``."""
    f = abs(int(factor))
    if f == 0:
        raise ValueError("factor must be nonzero (a zero factor decodes to zeros without a kernel)")
    t2 = (f & -f).bit_length() - 1
    odd = f >> t2
    limbs = []
    while odd:
        limbs.append(odd & 0xFFFFFFFF)
        odd >>= 32
    F = np.array(limbs, np.uint32)
    F.setflags(write=False)
    return F, t2, factor < 0


def exact_decode_fits(active: Sequence[int], factor: int) -> bool:
    """Whether the kernel's limbs hold ``|v| < P/2`` times the odd part of ``factor``."""
    nv = (math.prod(int(p) for p in active).bit_length() + 31) // 32 + 1
    return nv + len(factor_limbs(factor)[0]) <= MAX_LIMBS
