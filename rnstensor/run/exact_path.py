"""The exact value of an einsum in Python integers, pairwise along its path, each pair one exact residue GEMM of limbs.

``moduli='auto'`` needs the exact value of the whole expression. Where one
plan on 49 INT8 moduli cannot hold it (operands of thousands of bits between
their largest and smallest entries, or many wide operands), splitting the
operands into exact parts multiplies the products by every operand's parts.
Going pairwise along opt_einsum's path instead keeps the work polynomial: each
intermediate is held exactly (Python integers times one power of two), and each
pairwise contraction is a batched GEMM of integer matrices whose rows and
columns are cut into :data:`LIMB_BITS`-bit limbs; all limb pairs are one residue
GEMM on the fewest INT8 moduli that hold its sums exactly, and the limbs'
products are shifted back and added as Python integers. Nothing rounds until
the caller rounds the result once.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..arith import centered_mod, ints_from_digits
from ..arrays import to_host, to_module
from ..basis import int8_pool
from ..reference import exact_ints

__all__ = ["LIMB_BITS", "RESIDUE_GEMM_TERMS", "exact_einsum", "exact_int_matmul", "limb_moduli"]

#: bits per limb: a limb is an int64 (its residues are numpy's), and a limb product a 2 * 62 + log2(K)-bit sum
LIMB_BITS = 62

#: the residue GEMM of limbs pays where ``K`` exceeds this many times the limb pairs: each output's limb pairs are
#: reconstructed (mixed radix, ~18 moduli) and shifted together, against ``K`` multiply-adds of Python ints.
#: benchmarks/bench_exact_path.py (64 x K x 64): even at ~8 per pair for 60-bit entries (1 x 1 limbs), at ~3.5 for
#: 300-bit ones (5 x 5 limbs); at 10 per pair the residue GEMM takes half the time or less
RESIDUE_GEMM_TERMS = 4

_bit_length = np.frompyfunc(lambda v: int(v).bit_length(), 1, 1)
_trailing_zeros = np.frompyfunc(lambda v: (int(v) & -int(v)).bit_length() - 1 if v else 1 << 62, 1, 1)


def _limbs(x: np.ndarray, W: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(limbs, low, n)``: the integer rows of ``x`` (``(B, M, K)`` Python ints) as ``n`` signed ``W``-bit limbs
    (int64 ``(B, n, M, K)``), ``x[b, m] == sum_j limbs[b, j, m] * 2**(low[b, m] + j W)`` exactly (``low``: the
    trailing zeros every entry of the row shares, so a row spans only its own bits)."""
    B, M, K = x.shape
    mag = np.abs(x)
    low = _trailing_zeros(mag).min(axis=2, initial=1 << 62) if K else np.zeros((B, M), dtype=object)
    low = np.where(low == 1 << 62, 0, low).astype(np.int64)  # (rows of zeros: no shift)
    mag = mag >> low[:, :, None].astype(object)
    depth = int(_bit_length(mag).max()) if mag.size else 0
    n = max(1, -(-depth // W))
    mask = (1 << W) - 1
    sign = np.where(x < 0, -1, 1).astype(np.int64)
    limbs = np.empty((B, n, M, K), dtype=np.int64)
    for j in range(n):
        limbs[:, j] = ((mag >> (j * W)) & mask).astype(np.int64) * sign
    return limbs, low, n


def _residues(v: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
    """int8 planes ``(L, *v.shape)`` of the centered residues of int64 ``v``."""
    out = np.empty((len(moduli),) + v.shape, dtype=np.int8)
    for i, p in enumerate(moduli):
        out[i] = centered_mod(v, p)
    return out


def _to_ints(planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
    """The integers of host residue planes as Python ints: the CPU backend's mixed-radix digits (its decodes'
    threaded loop; the reference's would take most of an exact product's time), then Horner in int64 runs."""
    from ..backends import get_backend  # noqa: PLC0415 - the CPU backend's kernel, on these host planes

    return ints_from_digits(*get_backend("cpu").mrc_digits(planes, moduli))


def limb_moduli(K: int) -> tuple[int, ...]:
    """The INT8 moduli of :func:`exact_int_matmul`'s residue GEMM over ``K`` terms: the fewest of the pool whose
    product exceeds ``2 K (2**W - 1)**2`` (a signed sum of ``K`` limb products, exactly)."""
    bits = 2 * LIMB_BITS + max(1, K - 1).bit_length() + 1
    pool, prod = int8_pool(), 1
    for s, p in enumerate(pool, 1):
        prod *= p
        if prod > 1 << bits:
            return pool[:s]
    raise ValueError(f"exact_int_matmul: a {bits}-bit sum exceeds the INT8 pool")  # (K beyond 2**200)


def exact_int_matmul(a: np.ndarray, b: np.ndarray, be) -> tuple[np.ndarray, int]:
    """``(z, e)``: ``a @ b`` of batched Python-int matrices (``(B, M, K) @ (B, K, N)``, object arrays) exactly,
    ``z * 2**e`` with ``z`` Python ints.

    Each row of ``a`` and column of ``b`` is cut into :data:`LIMB_BITS`-bit
    limbs (:func:`_limbs`); the limbs of all rows against those of all columns
    are one residue GEMM on backend ``be`` (INT8 moduli holding
    ``K (2**W - 1)**2`` exactly), and each output gathers its limb pairs,
    shifted, as Python ints. Where ``K`` is at most :data:`RESIDUE_GEMM_TERMS`
    times the limb pairs, the objects' own product is faster and gives the
    same integers.
    """
    B, M, K = a.shape
    N = b.shape[2]
    if 0 in (B, M, K, N):
        return np.zeros((B, M, N), dtype=object), 0
    W = LIMB_BITS
    la, low_a, na = _limbs(a, W)
    lbt, low_b, nb = _limbs(np.swapaxes(b, 1, 2), W)
    if K <= RESIDUE_GEMM_TERMS * na * nb:
        return np.asarray(np.matmul(a, b), dtype=object), 0
    moduli = limb_moduli(K)
    xp = be.xp
    pa = to_module(_residues(la.reshape(B, na * M, K), moduli), xp)
    pb = to_module(_residues(np.swapaxes(lbt.reshape(B, nb * N, K), 1, 2), moduli), xp)
    Z = _to_ints(to_host(be.matmul(pa, pb, moduli)), moduli).reshape(B, na, M, nb, N)
    # sum_j sum_l Z_jl 2**((j + l) W): the diagonals j + l = d first, then Horner in 2**W
    acc = None
    for d in range(na + nb - 2, -1, -1):
        t = sum(Z[:, j, :, d - j, :] for j in range(max(0, d - nb + 1), min(na, d + 1)))
        acc = t if acc is None else (acc << W) + t
    lo_a, lo_b = int(low_a.min()), int(low_b.min())
    shift = (low_a - lo_a)[:, :, None] + (low_b - lo_b)[:, None, :]
    out = np.asarray(acc << shift.astype(object), dtype=object)
    return out, lo_a + lo_b


def _sum_out(parts: list, labels: str, keep: str) -> tuple[list, str]:
    """``parts`` summed over the labels not in ``keep`` (exact: Python ints)."""
    axes = tuple(i for i, c in enumerate(labels) if c not in keep)
    if not axes:
        return parts, labels
    return ([np.asarray(np.sum(p, axis=axes, dtype=object), dtype=object) for p in parts],
            "".join(c for c in labels if c in keep))


def _pair(a: tuple, b: tuple, keep: str, be) -> tuple:
    """The exact contraction of two operands ``(parts, labels, e)`` onto the labels of ``keep`` they hold."""
    (pa, la, ea), (pb, lb, eb) = a, b
    pa, la = _sum_out(pa, la, lb + keep)
    pb, lb = _sum_out(pb, lb, la + keep)
    batch = [c for c in la if c in lb and c in keep]
    contr = [c for c in la if c in lb and c not in keep]
    left = [c for c in la if c not in lb]
    right = [c for c in lb if c not in la]
    size = {c: n for p, labels in ((pa[0], la), (pb[0], lb)) for c, n in zip(labels, p.shape)}
    nb, nm, nk, nn = (math.prod(size[c] for c in g) for g in (batch, left, contr, right))

    def arranged(p, labels, order, shape):
        return np.ascontiguousarray(np.transpose(p, [labels.index(c) for c in order])).reshape(shape)

    A = np.concatenate([arranged(p, la, batch + left + contr, (nb, nm, nk)) for p in pa], axis=1)
    Bm = np.concatenate([arranged(p, lb, batch + contr + right, (nb, nk, nn)) for p in pb], axis=2)
    Z, ez = exact_int_matmul(A, Bm, be)
    # blocks (i, j): part i of a times part j of b; i + j = 0 real, 1 imaginary, 2 minus real
    block = lambda i, j: Z[:, i * nm:(i + 1) * nm, j * nn:(j + 1) * nn]  # noqa: E731
    out = [None, None]
    for i in range(len(pa)):
        for j in range(len(pb)):
            t = block(i, j) if i + j < 2 else -block(i, j)
            k = (i + j) % 2
            out[k] = t if out[k] is None else out[k] + t
    shape = tuple(size[c] for c in batch + left + right)
    parts = [np.asarray(o, dtype=object).reshape(shape) for o in out if o is not None]
    return parts, "".join(batch + left + right), ea + eb + ez


def exact_einsum(terms: Sequence[str], output: str, path: Sequence[tuple], leaves: Sequence[Sequence[np.ndarray]],
                 be) -> tuple[list[np.ndarray], int]:
    """``(parts, e)``: the exact value of ``einsum(terms -> output)`` as Python ints (``parts[0]`` real, ``parts[1]``
    imaginary where an operand is complex) times ``2**e``.

    ``leaves[i]``: operand ``i`` as float64 host arrays (one, or a complex
    operand's two parts), diagonals taken and broadcast so that ``terms[i]`` has
    no repeated label. ``path``: opt_einsum's (each entry the positions of the
    operands it contracts; the result goes last). ``be``: the backend of the
    residue GEMMs.
    """
    ops = []
    for t, parts in zip(terms, leaves):
        ints, e = exact_ints(np.stack(parts))  # (a complex operand's two parts on one exponent)
        ops.append((list(ints), t, e))
    for step in path:
        taken = [ops[i] for i in step]
        ops = [o for i, o in enumerate(ops) if i not in step]
        later = output + "".join(labels for _, labels, _ in ops)
        acc = taken[0]
        for k in range(1, len(taken)):
            acc = _pair(acc, taken[k], later + "".join(labels for _, labels, _ in taken[k + 1:]), be)
        parts, labels = _sum_out(acc[0], acc[1], later)
        ops.append((parts, labels, acc[2]))
    (parts, labels, e), = ops
    parts, labels = _sum_out(parts, labels, output)
    order = [labels.index(c) for c in output]
    return [np.asarray(np.transpose(p, order), dtype=object) for p in parts], e
