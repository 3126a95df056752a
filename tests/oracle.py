"""Exact oracles for the test suite: Python ints and ``fractions.Fraction`` only.

Nothing here imports the code under test's arithmetic (``rnstensor.arith``,
``rnstensor.to_int``, the backends): every expected value is computed from
first principles so a test can fail whenever the package is wrong.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

# ----- integers and residues ----------------------------------------------------------------


def centered(v: int, p: int) -> int:
    """``[v]_p`` in ``[-floor(p/2), ceil(p/2) - 1]``."""
    r = int(v) % p
    return r - p if r >= (p + 1) // 2 else r


def residues(vals, moduli: Sequence[int]) -> np.ndarray:
    """int8 planes ``(L, *shape)`` of the centered residues of an (object) integer array."""
    vals = np.asarray(vals, dtype=object)
    out = np.empty((len(moduli),) + vals.shape, dtype=np.int8)
    for i, p in enumerate(moduli):
        flat = [centered(int(v), p) for v in vals.reshape(-1)]
        out[i] = np.array(flat, dtype=np.int64).reshape(vals.shape)
    return out


def crt(planes: np.ndarray, active: Sequence[int]) -> np.ndarray:
    """The centered integer of every entry (object array), by plain CRT with Python ints."""
    active = tuple(int(p) for p in active)
    P = math.prod(active)
    weights = []
    for p in active:
        M = P // p
        weights.append(M * pow(M, -1, p))
    shape = planes.shape[1:]
    flat = planes.reshape(len(active), -1)
    out = np.empty(flat.shape[1], dtype=object)
    for j in range(flat.shape[1]):
        x = sum(int(flat[i, j]) * weights[i] for i in range(len(active))) % P
        out[j] = x - P if x >= (P + 1) // 2 else x
    return out.reshape(shape)


def obj(a) -> np.ndarray:
    """An object array of Python ints."""
    a = np.asarray(a)
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        out[idx] = int(a[idx])
    return out


def max_abs(vals) -> int:
    vals = np.asarray(vals, dtype=object)
    return max((abs(int(v)) for v in vals.reshape(-1)), default=0)


def contract(A, v, axis: int) -> np.ndarray:
    """``w[..., j, ...] = sum_k A[j, k] v[..., k, ...]`` with Python ints (explicit loops)."""
    A = np.asarray(A, dtype=object)
    v = np.asarray(v, dtype=object)
    vm = np.moveaxis(v, axis, -1)
    n_out, n_in = A.shape
    out = np.empty(vm.shape[:-1] + (n_out,), dtype=object)
    for idx in np.ndindex(vm.shape[:-1]):
        fiber = vm[idx]
        for j in range(n_out):
            out[idx + (j,)] = sum(int(A[j, k]) * int(fiber[k]) for k in range(n_in))
    return np.moveaxis(out, -1, axis)


def rand_ints(rng: random.Random, shape, bound: int, edges: bool = True) -> np.ndarray:
    """Random Python ints in ``[-bound, bound]``; with ``edges`` the first entries are ±bound and 0."""
    n = int(np.prod(shape, dtype=np.int64))
    vals = [rng.randint(-bound, bound) for _ in range(n)]
    if edges:
        for i, v in enumerate((bound, -bound, 0)):
            if i < n:
                vals[rng.randrange(n)] = v
    out = np.empty(n, dtype=object)
    out[:] = vals
    return out.reshape(shape)


def drop_int(v: int, q: int) -> int:
    """``(v - [v]_q) / q`` exactly (asserts the division is exact)."""
    r = centered(v, q)
    assert (v - r) % q == 0
    return (v - r) // q


def drop_all(vals, q: int) -> np.ndarray:
    """:func:`drop_int` on every entry of an object array."""
    vals = np.asarray(vals, dtype=object)
    out = np.empty(vals.shape, dtype=object)
    for idx in np.ndindex(vals.shape):
        out[idx] = drop_int(int(vals[idx]), q)
    return out


# ----- rounding and floats ------------------------------------------------------------------


def round_half_even(q) -> int:
    """Nearest integer to the rational ``q``, ties to even (floor arithmetic only)."""
    q = Fraction(q)
    fl = q.numerator // q.denominator
    rem = q - fl
    if rem > Fraction(1, 2):
        return fl + 1
    if rem < Fraction(1, 2):
        return fl
    return fl + (fl & 1)


def exponent_of(a) -> int:
    """``E`` with ``2^(E-1) <= a < 2^E`` for a positive rational ``a``."""
    a = Fraction(a)
    assert a > 0
    E = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** (E - 1) > a:
        E -= 1
    while a >= Fraction(2) ** E:
        E += 1
    return E


def to_float(q) -> float:
    """The rational ``q`` rounded once to nearest-even float64: subnormals, ``-0.0`` and ``±inf`` included.

    Built from integer operations only (independent of ``float(Fraction)``).
    """
    q = Fraction(q)
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    E = exponent_of(a)
    u = max(E - 53, -1074)  # weight of the last significand bit
    m = round_half_even(a / Fraction(2) ** u)
    if m == 0:
        return math.copysign(0.0, sign)
    if m.bit_length() - 1 + u >= 1024:
        return math.copysign(math.inf, sign)
    return math.copysign(math.ldexp(float(m), u), sign)


def value(v: int, factor: int, exp: int) -> float:
    """Correctly rounded ``v * factor * 2^exp``."""
    return to_float(Fraction(int(v) * int(factor)) * Fraction(2) ** int(exp))


def values(v, factor: int, exp) -> np.ndarray:
    """:func:`value` elementwise; ``exp`` broadcasts to ``v``'s shape."""
    v = np.asarray(v, dtype=object)
    e = np.broadcast_to(np.asarray(exp, dtype=object), v.shape)
    out = np.empty(v.shape, dtype=np.float64)
    for idx in np.ndindex(v.shape):
        out[idx] = value(v[idx], factor, e[idx])
    return out


def bits(a) -> np.ndarray:
    """The IEEE bit patterns of a float64 array."""
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).view(np.uint64)


def assert_bits_equal(got, want) -> None:
    got = np.asarray(got)
    want = np.asarray(want, dtype=np.float64)
    assert got.dtype == np.float64, got.dtype
    assert got.shape == want.shape, (got.shape, want.shape)
    bad = bits(got) != bits(want)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0]) if got.ndim else ()
        raise AssertionError(
            f"{int(bad.sum())} of {got.size} entries differ; first at {idx}: got {got[idx]!r}, want {want[idx]!r}"
        )


def ulp(x: float) -> float:
    """Spacing of float64 at ``|x|`` (the subnormal spacing near 0)."""
    x = abs(float(x))
    if x == 0:
        return math.ldexp(1.0, -1074)
    return math.ulp(x)


# ----- encoding ------------------------------------------------------------------------------


def encode_oracle(x, bits_: int, shared_axes) -> tuple[np.ndarray, np.ndarray]:
    """``(v, e)``: exact integers and per-entry exponents of [2610.05059] Alg. 5 (Fraction arithmetic).

    ``e = bits - E`` with ``2^(E-1) <= max|G| < 2^E`` per group (0 for an all-zero
    group), ``v = round_half_even(x * 2^e)``. Groups share the exponent along
    ``shared_axes`` (``None``: all axes).
    """
    x = np.asarray(x, dtype=np.float64)
    nd = x.ndim
    shared = tuple(range(nd)) if shared_axes is None else tuple(a % nd for a in shared_axes)
    keep = [a for a in range(nd) if a not in shared]
    gmax: dict = {}
    for idx in np.ndindex(x.shape):
        key = tuple(idx[a] for a in keep)
        f = abs(Fraction(float(x[idx])))
        if f > gmax.get(key, Fraction(0)):
            gmax[key] = f
    v = np.empty(x.shape, dtype=object)
    e = np.empty(x.shape, dtype=object)
    for idx in np.ndindex(x.shape):
        key = tuple(idx[a] for a in keep)
        m = gmax.get(key, Fraction(0))
        ee = bits_ - exponent_of(m) if m > 0 else 0
        e[idx] = ee
        v[idx] = round_half_even(Fraction(float(x[idx])) * Fraction(2) ** ee)
    return v, e


def fits(x, e) -> bool:
    """Whether every ``x * 2^e`` is an integer (the encoding is lossless)."""
    x = np.asarray(x, dtype=np.float64)
    e = np.broadcast_to(np.asarray(e, dtype=object), x.shape)
    return all((Fraction(float(x[i])) * Fraction(2) ** int(e[i])).denominator == 1 for i in np.ndindex(x.shape))


def max_bits(P: int) -> int:
    """Largest ``b`` with ``2 * 2^b < P``."""
    b = 0
    while 2 * (1 << (b + 1)) < P:
        b += 1
    return b


def pairs(it: Iterable):
    it = list(it)
    for i, a in enumerate(it):
        for b in it[i + 1 :]:
            yield a, b
