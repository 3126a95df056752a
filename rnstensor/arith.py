"""Reference semantics of every residue primitive, in plain numpy (and Python ints where exactness needs them).

These functions define what each backend call must return; the fused kernels
are tested against them bit for bit. They favour the obviously right over the
fast: int64 intermediates, one modulus at a time, no fusion.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from .basis import Basis, mrc_order

__all__ = [
    "alpha_parts",
    "centered_mod",
    "float_parts",
    "encode_ref",
    "product_ref",
    "matmul_ref",
    "hadamard_ref",
    "add_ref",
    "drop_order",
    "drop_ref",
    "mrc_digits_ref",
    "base_extend_ref",
    "drop_extend_ref",
    "to_int_ref",
    "ints_from_digits",
    "horner_fp64_ref",
    "decode_fp64_ref",
    "decode_exact_ref",
    "round_scaled_int",
    "float_factor",
    "HORNER_CHUNK",
    "two_product_error",
    "scaled_double_double",
]


def centered_mod(x: np.ndarray, p: int) -> np.ndarray:
    """Centered residue of every entry of the integer array ``x`` modulo ``p`` (int64)."""
    r = np.remainder(np.asarray(x, dtype=np.int64), p)
    return r - p * (r >= (p + 1) // 2)


def _planes(rows: list[np.ndarray]) -> np.ndarray:
    return np.stack(rows).astype(np.int8) if rows else np.zeros((0,), np.int8)


# ----- encode -------------------------------------------------------------------------------


def alpha_parts(alpha: float) -> tuple[int, int]:
    """``|alpha| = ma * 2**ea`` with ``ma`` odd (``alpha`` finite, nonzero): how an exact decode takes a scale.

    Examples
    --------
    >>> alpha_parts(0.375), alpha_parts(-3.0)
    ((3, -3), (3, 0))
    """
    mant, ex = math.frexp(abs(alpha))
    ma, ea = int(mant * (1 << 53)), ex - 53
    tz = (ma & -ma).bit_length() - 1
    return ma >> tz, ea + tz


def float_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x == m * 2**k`` exactly with ``m`` the signed 53-bit significand (int64) and ``k`` int64."""
    mant, ex = np.frexp(np.asarray(x, dtype=np.float64))  # 0.5 <= |mant| < 1
    return (mant * 2.0**53).astype(np.int64), ex.astype(np.int64) - 53



def encode_ref(x: np.ndarray, exponent: np.ndarray, moduli: Sequence[int], bits: int) -> np.ndarray:
    """Residues of ``v = round_half_even(x * 2**exponent)`` for each modulus, shape ``(L, *x.shape)``.

    Entries whose scaled value is at most ``2**53`` in magnitude are rounded by
    ``rint(ldexp(x, e))`` (exact: a power-of-two scaling then an integer
    rounding). Larger ones are integers already, ``m * 2**k`` with the 53-bit
    significand ``m`` and ``k > 0``; their residues are ``[m]_p [2^k]_p``.
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.broadcast_to(np.asarray(exponent, dtype=np.int64), x.shape)
    m, k = float_parts(x)
    k = k + e  # x * 2**e = m * 2**k
    small = k <= 0
    v_small = np.zeros(x.shape, dtype=np.int64)
    if small.any():
        v_small[small] = np.rint(np.ldexp(x[small], e[small].astype(np.int32))).astype(np.int64)
    rows = []
    for p in moduli:
        r = centered_mod(v_small, p)
        if not small.all():
            big = ~small
            kb = k[big]
            pw = np.array([pow(2, int(kk), p) for kk in kb], dtype=np.int64)
            r[big] = centered_mod(np.remainder(m[big], p) * pw, p)
        rows.append(r)
    return _planes(rows).reshape((len(moduli),) + x.shape)


# ----- products and elementwise ops ---------------------------------------------------------


def product_ref(op_planes: np.ndarray, planes: np.ndarray, moduli: Sequence[int], axis: int) -> np.ndarray:
    """Per modulus: contract tensor axis ``axis`` with the ``(n_out, n_in)`` operator, centered reduction."""
    rows = []
    for i, p in enumerate(moduli):
        acc = np.tensordot(op_planes[i].astype(np.int64), planes[i].astype(np.int64), axes=([1], [axis]))
        rows.append(centered_mod(np.moveaxis(acc, 0, axis), p))
    shape = list(planes.shape[1:])
    shape[axis] = op_planes.shape[1]
    return _planes(rows).reshape((len(moduli),) + tuple(shape))


def matmul_ref(a_planes: np.ndarray, b_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
    """Per modulus: batched matrix product ``(L, ..., M, K) @ (L, ..., K, N)``, centered reduction (batch dims broadcast)."""
    rows = [centered_mod(np.matmul(a_planes[i].astype(np.int64), b_planes[i].astype(np.int64)), p) for i, p in enumerate(moduli)]
    shape = np.broadcast_shapes(a_planes.shape[1:-2], b_planes.shape[1:-2]) + (a_planes.shape[-2], b_planes.shape[-1])
    return _planes(rows).reshape((len(moduli),) + shape)


def hadamard_ref(planes: np.ndarray, field_planes: np.ndarray, moduli: Sequence[int]) -> np.ndarray:
    """Per modulus: elementwise product (field broadcast over leading axes), centered reduction."""
    rows = [centered_mod(planes[i].astype(np.int64) * field_planes[i].astype(np.int64), p) for i, p in enumerate(moduli)]
    return _planes(rows).reshape((len(moduli),) + np.broadcast_shapes(planes.shape[1:], field_planes.shape[1:]))


def add_ref(a: np.ndarray, b: np.ndarray, moduli: Sequence[int], subtract: bool = False) -> np.ndarray:
    """Per modulus: ``a + b`` (or ``a - b``), centered reduction."""
    sign = -1 if subtract else 1
    rows = [centered_mod(a[i].astype(np.int64) + sign * b[i].astype(np.int64), p) for i, p in enumerate(moduli)]
    return _planes(rows).reshape(a.shape)


# ----- drop, mixed radix, base extension ----------------------------------------------------


def drop_order(active: Sequence[int], drops) -> tuple[int, ...]:
    """The moduli a drop removes, in order: ``drops`` smallest ones (an int), or the given sequence."""
    if isinstance(drops, (int, np.integer)):
        return tuple(sorted(active)[: int(drops)])
    return tuple(int(q) for q in drops)


def drop_spec(active: Sequence[int], order: Sequence[int]):
    """The ``drops`` argument of a backend's ``drop_extend`` for dropping ``order``: a count where they are the
    smallest active moduli in order (the backends' fast path), else the moduli (the inverse of :func:`drop_order`)."""
    order = tuple(order)
    return len(order) if order == tuple(sorted(active)[: len(order)]) else order


def drop_ref(planes: np.ndarray, active: Sequence[int], count=1) -> tuple[np.ndarray, tuple[int, ...]]:
    """Alg. 1 repeatedly: divide by a modulus ``q`` with rounding to nearest, remove its plane.

    ``count`` is how many of the smallest active moduli to drop (an int), or
    the moduli themselves in the order to drop them. Returns the new planes
    and the remaining active moduli (same order).
    """
    active = list(active)
    rows = [planes[i].astype(np.int64) for i in range(len(active))]
    for q in drop_order(active, count):
        iq = active.index(q)
        s = rows[iq]
        rest = []
        for i, p in enumerate(active):
            if i != iq:
                rest.append(centered_mod((rows[i] - s) * pow(q, -1, p), p))
        rows = rest
        active.pop(iq)
    out = _planes(rows).reshape((len(active),) + planes.shape[1:])
    return out, tuple(active)


def mrc_digits_ref(planes: np.ndarray, active: Sequence[int]) -> tuple[np.ndarray, tuple[int, ...]]:
    """Centered mixed-radix digits (Alg. 4 MrcDigits) in conversion order (even modulus first).

    Returns ``(digits, order)`` with ``v = sum_i digits[i] * prod(order[:i])``.
    """
    active = tuple(active)
    order = mrc_order(active)
    u = [planes[active.index(q)].astype(np.int64) for q in order]
    for i, qi in enumerate(order):
        for j in range(i + 1, len(order)):
            qj = order[j]
            u[j] = centered_mod((u[j] - u[i]) * pow(qi, -1, qj), qj)
    digits = np.stack(u) if u else np.zeros((0,) + planes.shape[1:], np.int64)
    return digits, order


def base_extend_ref(planes: np.ndarray, active: Sequence[int], basis: Basis) -> np.ndarray:
    """Alg. 4 BaseExtend: residues on every basis modulus of the integer held on ``active``."""
    digits, order = mrc_digits_ref(planes, active)
    active = tuple(active)
    rows = []
    for p in basis.moduli:
        if p in active:
            rows.append(planes[active.index(p)].astype(np.int64))
            continue
        t = np.zeros(planes.shape[1:], dtype=np.int64)
        w = 1
        for i, q in enumerate(order):
            t = centered_mod(t + digits[i] * (w % p), p)
            w *= q
        rows.append(t)
    return _planes(rows).reshape((len(basis),) + planes.shape[1:])


def drop_extend_ref(
    planes: np.ndarray, active: Sequence[int], basis: Basis, drops, extend: bool
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Alg. 1 for each dropped modulus (see :func:`drop_ref`), then (if ``extend``) Alg. 4 onto the whole basis."""
    out, act = drop_ref(planes, active, drops)
    if extend:
        out = base_extend_ref(out, act, basis)
        act = basis.moduli
    return out, act


# ----- reconstruction -----------------------------------------------------------------------


def to_int_ref(planes: np.ndarray, active: Sequence[int]) -> np.ndarray:
    """The exact integers held by the planes, as an object array of Python ints."""
    return ints_from_digits(*mrc_digits_ref(planes, active))


def ints_from_digits(digits: np.ndarray, order: Sequence[int]) -> np.ndarray:
    """``sum_i digits[i] * prod(order[:i])`` per entry as Python ints (an object array): the integers of centered
    mixed-radix digits (:func:`mrc_digits_ref`'s, or a backend's)."""
    # Horner over the digits, in runs whose radices multiply to at most 2**62 done in int64 (centered digits: every
    # partial value stays below its run's radix product), the runs joined as Python ints
    runs, start, radix = [], 0, 1
    for i, q in enumerate(order):
        if radix * q > 1 << 62:
            runs.append((start, i, radix))
            start, radix = i, 1
        radix *= q
    runs.append((start, len(order), radix))
    v = np.zeros(digits.shape[1:], dtype=object)
    for s, t, radix in reversed(runs):
        part = np.zeros(digits.shape[1:], dtype=np.int64)
        for i in range(t - 1, s - 1, -1):
            part = part * order[i] + digits[i]
        v = v * radix + part.astype(object)
    # 0-d arithmetic on object arrays yields a bare Python int: keep the array type
    return np.asarray(v, dtype=object)


#: Veltkamp's splitter for 53-bit significands: ``x = hi + lo`` with ``hi`` and ``lo`` of 26 bits or fewer.
_SPLITTER = float((1 << 27) + 1)


def two_product_error(a, b, p):
    """``a * b - p`` exactly, where ``p = fl(a * b)`` (Dekker's product; the value an FMA gives).

    Holds without overflow and underflow: ``|a * b|`` below ``2**996`` and the
    error a normal multiple of ``2**-1022`` or zero; the decode's values (integers
    below ``2**400``, scaled by a 53-bit factor) always are.
    """
    ca, cb = _SPLITTER * a, _SPLITTER * b
    a1 = ca - (ca - a)
    b1 = cb - (cb - b)
    a2, b2 = a - a1, b - b1
    return ((a1 * b1 - p) + a1 * b2 + a2 * b1) + a2 * b2


#: Mixed-radix digits per exact chunk of the fp64 decode: six moduli of at most 256 weigh below ``2**48``.
HORNER_CHUNK = 6


def horner_fp64_ref(planes: np.ndarray, active: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 5's Horner, faithful: ``v ~= hi + lo`` as a double-double (relative error below ``2**-100``).

    The digits (conversion order, lowest first) are taken in chunks of
    :data:`HORNER_CHUNK` from the bottom: a chunk's value ``C`` and weight
    ``W`` (its moduli's product) are below ``2**48``, so plain float64 Horner
    is exact within a chunk. The chunks are joined from the top,
    ``v <- W v + C``, in double-double: the product's rounding error exactly
    (an FMA on the device, Dekker's product here: the same value), the sum's
    by Fast2Sum (``|W hi| >= W >= 2 |C|``: ``hi`` is an integer), and
    ``lo <- fl(fl(W lo) + fl(e1 + e2))``, each operation rounded on its own,
    so every backend gets the same two floats.
    """
    digits, order = mrc_digits_ref(planes, active)
    m = len(order)
    if not m:
        z = np.zeros(planes.shape[1:])
        return z, z.copy()

    def chunk(j0: int, j1: int) -> np.ndarray:
        v = digits[j1 - 1].astype(np.float64)
        for j in range(j1 - 2, j0 - 1, -1):
            v = float(order[j]) * v + digits[j]
        return v

    top = HORNER_CHUNK * ((m - 1) // HORNER_CHUNK)
    hi = chunk(top, m)
    lo = np.zeros_like(hi)
    for j0 in range(top - HORNER_CHUNK, -1, -HORNER_CHUNK):
        W = float(math.prod(order[j0 : j0 + HORNER_CHUNK]))
        c = chunk(j0, j0 + HORNER_CHUNK)
        p = W * hi
        e1 = two_product_error(hi, W, p)
        hi = p + c
        e2 = c - (hi - p)
        lo = W * lo + (e1 + e2)
    return hi, lo


def float_factor(factor: int) -> tuple[float, float, int]:
    """``factor ~= (f + g) * 2**k``: ``f = fl(factor / 2**k)`` below ``2**53`` and ``g`` the rounded remainder.

    ``f + g`` carries ``factor`` to a relative ``2**-106`` (``g == 0`` when
    ``factor`` has at most 53 significant bits).
    """
    factor = int(factor)
    k = max(factor.bit_length() - 53, 0)
    f = factor / (1 << k)
    return f, (factor - (int(f) << k)) / (1 << k), k


def scaled_double_double(hi, lo, f: float, g: float):
    """``fl((hi + lo) (f + g))``, faithful: the product ``hi f`` with its exact error, plus the small terms."""
    p = hi * f
    return p + (two_product_error(hi, f, p) + (lo * f + hi * g))


def decode_fp64_ref(planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int) -> np.ndarray:
    """``v * factor * 2**exponent`` faithfully rounded: exact whenever it is a float64 (or an underflow's rounding).

    ``v`` from the double-double Horner, times ``factor`` as two floats
    (:func:`float_factor`), rounded once to float64 and then scaled by a power
    of two (exact, or one more rounding where the result is subnormal or
    overflows): the float64 is one of the two neighbours of the exact value.
    """
    hi, lo = horner_fp64_ref(planes, active)
    f, g, k = float_factor(factor)
    e = np.broadcast_to(np.asarray(exponent, dtype=np.int64), hi.shape) + k
    # ldexp with an exponent far outside float range saturates correctly to 0/inf; clip keeps int32
    with np.errstate(over="ignore", invalid="ignore"):
        return np.ldexp(scaled_double_double(hi, lo, f, g), np.clip(e, -1 << 20, 1 << 20).astype(np.int32))


def round_scaled_int(w: int, e: int) -> float:
    """``w * 2**e`` rounded once to nearest-even float64 (``±inf`` on overflow, ``±0.0`` below half the least subnormal)."""
    w, e = int(w), int(e)
    if w == 0:
        return 0.0
    top = w.bit_length() + e  # 2**(top-1) <= |w| * 2**e < 2**top
    if top > 1025:
        return math.inf if w > 0 else -math.inf
    if top < -1076:
        return 0.0 if w > 0 else -0.0
    try:
        if e >= 0:
            return float(w << e)
        return w / (1 << -e)  # CPython's int true division rounds correctly, subnormals included
    except OverflowError:
        return math.inf if w > 0 else -math.inf


def decode_exact_ref(planes: np.ndarray, active: Sequence[int], exponent: np.ndarray, factor: int) -> np.ndarray:
    """Correctly rounded ``v * factor * 2**exponent`` per entry, from the exact integer ``v``."""
    v = to_int_ref(planes, active)
    e = np.broadcast_to(np.asarray(exponent, dtype=np.int64), v.shape)
    f = int(factor)
    out = np.empty(v.shape, dtype=np.float64)
    flat_v, flat_e, flat_o = v.reshape(-1), e.reshape(-1), out.reshape(-1)
    for i in range(flat_v.size):
        flat_o[i] = round_scaled_int(flat_v[i] * f, flat_e[i])
    return out
